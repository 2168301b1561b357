"""vllm_model_aliases on the vLLM hosts (planner.model_aliases, render_args): every instance answers to each alias,
after its model's own name (which vLLM reports), so that the gateways can move an alias without a restart."""

import pytest

from vllm_fleet import planner

PLANNED = {
    "vllm_profile_name": "cpu-lab-tiny",
    "vllm_version": "0.32.0",
    "vllm_gpu": {"name": "cpu", "memory_mib": 1024, "bandwidth_gb_s": 20, "count": 0},
    "vllm_environment": {"VLLM_CPU_KVCACHE_SPACE": "1"},
}


def served_names(args):
    start = args.index("--served-model-name") + 1
    end = next((i for i in range(start, len(args)) if args[i].startswith("--")), len(args))
    return args[start:end]


def test_every_instance_answers_to_each_alias_after_its_own_name():
    (instance,) = planner.instances("h", dict(PLANNED, vllm_model_aliases={"chat": "other", "assist": "tiny-qwen2"}))
    assert served_names(instance["args"]) == ["tiny-qwen2", "assist", "chat"]
    assert instance["served_model_name"] == "tiny-qwen2"
    (plain,) = planner.instances("h", PLANNED)
    assert served_names(plain["args"]) == ["tiny-qwen2"]


@pytest.mark.parametrize(
    "value, wanted",
    [
        (["chat"], "h: vllm_model_aliases=['chat'] is not a mapping of alias to served name; fix:"),
        ({"chat": ""}, "h: vllm_model_aliases['chat']='': an alias and the served name it points at must be non-empty"),
        ({"--chat": "m"}, "h: vllm_model_aliases['--chat'] holds a control or format character, starts with -"),
        ({"ch\nat": "m"}, "holds a control or format character"),
        ({"c" * 257: "m"}, "longer than 256"),
    ],
)
def test_bad_aliases_stop_the_plan_naming_the_host_setting_and_fix(value, wanted):
    entry = planner.plan_host("h", dict(PLANNED, vllm_model_aliases=value))
    assert any(wanted in error and "fix:" in error for error in entry["errors"]), entry["errors"]
