"""lora: a host's adapters in its plan: the settings' checks, what adapter_config.json must say, the rendered
arguments (checked with vLLM's own parser in test_vllm_parser.py) and the adapters each instance serves."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_fleet import lora, planner

ROOT = Path(__file__).resolve().parents[3]
LAB = {"name": "cpu", "memory_mib": 1024, "bandwidth_gb_s": 20, "count": 2}
URL = "http://10.89.77.2:8080/adapters/lab"


def config(**over):
    base = {
        "peft_type": "LORA",
        "r": 8,
        "lora_alpha": 16,
        "target_modules": ["q_proj", "v_proj"],
        "base_model_name_or_path": "lab/tiny-qwen2",
    }
    return json.dumps({**base, **over})


def plan(adapters=None, configs=None, **more):
    hostvars = {
        "vllm_profile_name": "cpu-lab-tiny",
        "vllm_gpu": LAB,
        "vllm_version": "0.32.0",
        "vllm_environment": {"VLLM_CPU_KVCACHE_SPACE": "1"},
        "vllm_lora_adapters": adapters if adapters is not None else [{"name": "tutor", "url": f"{URL}/tutor"}],
        **more,
    }
    if configs is not None:
        hostvars["vllm_plan_lora_configs"] = configs
    return planner.plan_host("h1", hostvars)


def test_no_adapters_no_lora():
    entry = plan(adapters=[])
    assert entry["errors"] == [] and entry["lora"] is None
    assert not any("lora" in a for i in entry["instances"] for a in i["args"])
    assert all(i["adapters"] == [] for i in entry["instances"])


def test_adapters_render_the_role_s_own_arguments_on_every_instance():
    entry = plan(
        adapters=[{"name": "tutor", "url": f"{URL}/tutor/"}, {"name": "poet", "src": "/srv/adapters/poet"}],
        configs={f"{URL}/tutor": config(), "/srv/adapters/poet": config(r=16)},
        vllm_lora_max_loras=2,
    )
    assert entry["errors"] == []
    assert [a["name"] for a in entry["lora"]["adapters"]] == ["tutor", "poet"]
    assert [a["rank"] for a in entry["lora"]["adapters"]] == [8, 16]
    assert entry["lora"]["adapters"][0]["path"] == "/var/lib/vllm/adapters/tutor"
    assert len(entry["instances"]) == 2
    for instance in entry["instances"]:
        args = instance["args"]
        assert instance["adapters"] == ["tutor", "poet"]
        assert "--enable-lora" in args
        assert args[args.index("--max-loras") + 1] == "2"
        assert args[args.index("--max-lora-rank") + 1] == "16"
        assert args[args.index("--max-cpu-loras") + 1] == "2"
        modules = args[args.index("--lora-modules") + 1 : args.index("--lora-modules") + 3]
        assert [json.loads(m) for m in modules] == [
            {"name": "tutor", "path": "/var/lib/vllm/adapters/tutor", "base_model_name": "tiny-qwen2"},
            {"name": "poet", "path": "/var/lib/vllm/adapters/poet", "base_model_name": "tiny-qwen2"},
        ]


@pytest.mark.parametrize(
    ("over", "message"),
    [
        (
            {"r": 32},
            "h1: vllm_lora_adapters[0] (tutor, http://10.89.77.2:8080/adapters/lab/tutor/adapter_config.json) has rank "
            "32, above vllm_lora_max_rank=16: vLLM would refuse to start the instance; fix: vllm_lora_max_rank: 32",
        ),
        (
            {"base_model_name_or_path": "Qwen/Qwen2.5-7B-Instruct"},
            "was trained for 'Qwen/Qwen2.5-7B-Instruct', not for this host's model 'lab/tiny-qwen2'",
        ),
        ({"peft_type": "IA3"}, "says peft_type='IA3': vLLM serves LoRA adapters only"),
        ({"use_dora": True}, "is a DoRA adapter (use_dora: true), which vLLM refuses"),
        ({"base_model_name_or_path": None}, "names no base model (base_model_name_or_path)"),
    ],
)
def test_what_adapter_config_json_must_say(over, message):
    errors = plan(configs={f"{URL}/tutor": config(**over)})["errors"]
    assert len(errors) == 1 and message in errors[0], errors


def test_a_base_model_read_from_a_local_folder_is_the_same_model():
    """A fine-tune often records the folder it loaded its base from."""
    assert plan(configs={f"{URL}/tutor": config(base_model_name_or_path="/data/models/tiny-qwen2/")})["errors"] == []


def test_an_adapter_config_the_controller_could_not_read():
    errors = plan(configs={f"{URL}/tutor": {"error": "HTTP Error 404: Not Found"}})["errors"]
    assert errors == [
        "h1: vllm_lora_adapters[0] (tutor, http://10.89.77.2:8080/adapters/lab/tutor/adapter_config.json) could not "
        "be read on the controller: HTTP Error 404: Not Found; fix: serve the adapter's folder with its "
        "adapter_config.json and SHA256SUMS at that location"
    ]
    assert "is not JSON" in plan(configs={f"{URL}/tutor": "{"})["errors"][0]


@pytest.mark.parametrize(
    ("more", "message"),
    [
        ({"vllm_lora_max_rank": 48}, "vllm_lora_max_rank=48 is not a rank vLLM offers"),
        ({"vllm_lora_max_rank": "x"}, "vllm_lora_max_rank='x' is not a whole number of at least 1"),
        ({"vllm_lora_max_loras": 0}, "vllm_lora_max_loras=0 is not a whole number of at least 1"),
        ({"vllm_lora_max_loras": 3}, "vllm_lora_max_loras=3 is more than the 1 adapter(s) the host serves"),
        (
            {
                "vllm_lora_adapters": [{"name": n, "url": f"{URL}/{n}"} for n in ("a", "b", "c")],
                "vllm_lora_max_cpu_loras": 2,
                "vllm_lora_max_loras": 2,
            },
            "vllm_lora_adapters lists 3 adapters but vllm_lora_max_cpu_loras=2 holds 2",
        ),
        (
            {
                "vllm_lora_adapters": [{"name": n, "url": f"{URL}/{n}"} for n in ("a", "b")],
                "vllm_lora_max_cpu_loras": 1,
                "vllm_lora_max_loras": 2,
            },
            "vllm_lora_max_cpu_loras=1 is below vllm_lora_max_loras=2: vLLM refuses to start",
        ),
        ({"vllm_lora_adapters": "tutor"}, "vllm_lora_adapters='tutor' is not a list"),
        ({"vllm_lora_adapters": [{"name": "../x", "url": URL}]}, "vllm_lora_adapters[0].name='../x' is not an"),
        ({"vllm_lora_adapters": [{"name": "a", "url": URL, "src": "/x"}]}, "gives both url and src"),
        ({"vllm_lora_adapters": [{"name": "a"}]}, "gives neither url nor src"),
        ({"vllm_lora_adapters": [{"name": "a", "url": "ftp://m/a"}]}, "is not an http(s) URL"),
        ({"vllm_lora_adapters": [{"name": "a", "url": "http://m/a\n"}]}, "is not a plain URL or path"),
        ({"vllm_lora_adapters": [{"name": "a", "url": URL, "rank": 8}]}, "has rank, which is not a key of an adapter"),
        (
            {"vllm_lora_adapters": [{"name": "a", "url": URL}, {"name": "a", "url": URL}]},
            "vllm_lora_adapters[1].name='a' is given twice",
        ),
        (
            {"vllm_lora_adapters": [{"name": "tiny-qwen2", "url": URL}]},
            "vllm_lora_adapters name 'tiny-qwen2' is also the served model's name",
        ),
        (
            {"vllm_lora_adapters": [{"name": "chat", "url": URL}], "vllm_model_aliases": {"chat": "tiny-qwen2"}},
            "vllm_lora_adapters name 'chat' is also an alias (vllm_model_aliases)",
        ),
        ({"vllm_extra_args": {"max_loras": 4}}, "vllm_extra_args.max_loras=4 is managed by vllm_lora_max_loras"),
        ({"vllm_extra_args": {"enable_lora": True}}, "is managed by vllm_lora_adapters"),
    ],
)
def test_bad_settings_are_refused_with_the_setting_and_the_fix(more, message):
    hostvars = {"adapters": more.pop("vllm_lora_adapters")} if "vllm_lora_adapters" in more else {}
    errors = plan(**hostvars, **more)["errors"]
    assert any(message in e for e in errors), errors
    assert all(e.startswith("h1: ") and "fix: " in e for e in errors), errors


def test_sources_are_read_once_each():
    one, _ = lora.settings("h1", {"vllm_lora_adapters": [{"name": "a", "url": f"{URL}/a/"}]})
    two, _ = lora.settings("h2", {"vllm_lora_adapters": [{"name": "a", "url": f"{URL}/a"}, {"name": "b", "src": "/b"}]})
    assert lora.sources({"h1": one, "h2": two, "h3": None}) == [
        {"source": "controller", "location": "/b"},
        {"source": "url", "location": f"{URL}/a"},
    ]


def test_the_lab_adapter_builder_writes_what_the_plan_and_vllm_read(tmp_path):
    """lab/scripts/build-lora-adapter.py on the lab's model config: PEFT's files, random non-zero weights declared as
    such, a SHA256SUMS that covers them, and an adapter_config.json the plan takes."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": 256,
                "intermediate_size": 512,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 64,
            }
        )
    )
    out = tmp_path / "tutor"
    script = ROOT / "lab" / "scripts" / "build-lora-adapter.py"
    subprocess.run([sys.executable, str(script), str(model), str(out), "--base", "lab/tiny-qwen2"], check=True)
    from safetensors.numpy import load_file

    tensors = load_file(str(out / "adapter_model.safetensors"))
    assert len(tensors) == 2 * 2 * 7  # layers x (A, B) x targets
    assert tensors["base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight"].shape == (128, 8)
    assert all(abs(t).sum() > 0 for t in tensors.values())
    written = json.loads((out / "adapter_config.json").read_text())
    assert written["revision"] == "random-weights, seed 1" and written["r"] == 8
    sums = (out / "SHA256SUMS").read_text().split()
    assert sums[1::2] == ["adapter_config.json", "adapter_model.safetensors"]
    assert plan(configs={f"{URL}/tutor": (out / "adapter_config.json").read_text()})["errors"] == []


def test_limits_left_unset_take_vllms_defaults():
    """The plan filter passes a setting the inventory leaves out as None (plan_inputs): vLLM's defaults then."""
    entry = plan(vllm_lora_max_loras=None, vllm_lora_max_rank=None, vllm_lora_max_cpu_loras=None)
    assert entry["errors"] == []
    assert {k: entry["lora"][k] for k in ("max_loras", "max_lora_rank", "max_cpu_loras")} == {
        "max_loras": 1,
        "max_lora_rank": 16,
        "max_cpu_loras": 1,
    }


M = "--lora-modules"
TUTOR = '{"base_model_name":"tiny","name":"tutor","path":"/var/lib/vllm/adapters/tutor"}'
POET = '{"base_model_name":"tiny","name":"poet","path":"/var/lib/vllm/adapters/poet"}'
BASE = ["/m", "--served-model-name", "tiny", "--enable-lora", "--max-loras", "1"]


def test_a_change_of_adapters_alone_is_made_at_runtime():
    assert lora.runtime_change([*BASE, M, TUTOR], [*BASE, M, TUTOR, POET]) == {
        "load": [{"name": "poet", "path": "/var/lib/vllm/adapters/poet"}],
        "unload": [],
    }
    assert lora.runtime_change([*BASE, M, TUTOR, POET, "--port", "8000"], [*BASE, M, POET, "--port", "8000"]) == {
        "load": [],
        "unload": ["tutor"],
    }
    moved = TUTOR.replace("/adapters/tutor", "/adapters/tutor-2")
    assert lora.runtime_change([*BASE, M, TUTOR], [*BASE, M, moved]) == {
        "load": [{"name": "tutor", "path": "/var/lib/vllm/adapters/tutor-2"}],
        "unload": ["tutor"],
    }
    # The old name=path form reads the same.
    assert lora.modules_in_args(["m", M, "a=/x/a", "--port", "1"]) == [{"name": "a", "path": "/x/a"}]


@pytest.mark.parametrize(
    "before, after",
    [
        ([*BASE, M, TUTOR], [*BASE, M, TUTOR]),  # nothing changes
        ([*BASE, M, TUTOR], [*BASE[:-1], "2", M, TUTOR, POET]),  # another argument changes too: a restart
        ([*BASE, M, TUTOR], [*BASE]),  # the last adapter goes: LoRA's limits stay, --lora-modules goes
        ([], [*BASE, M, TUTOR]),  # no arguments recorded (a first start)
        (None, [*BASE, M, TUTOR]),
    ],
)
def test_anything_else_is_left_to_a_restart(before, after):
    expected = {"load": [], "unload": ["tutor"]} if before == [*BASE, M, TUTOR] and after == [*BASE] else {}
    assert lora.runtime_change(before, after) == expected


def test_runtime_updates_open_vllms_endpoints_in_the_instances_environment_only_where_set():
    on = plan(vllm_lora_runtime_updates=True)
    assert on["errors"] == [] and on["lora"]["runtime_updates"] is True
    # Room in host memory for adapters added at runtime, in steps of 8: one more adapter changes no argument.
    assert on["lora"]["max_cpu_loras"] == 8
    more = plan(
        vllm_lora_runtime_updates=True,
        adapters=[{"name": "tutor", "url": f"{URL}/tutor"}, {"name": "poet", "url": f"{URL}/poet"}],
    )
    assert lora.runtime_change(on["instances"][0]["args"], more["instances"][0]["args"]) == {
        "load": [{"name": "poet", "path": "/var/lib/vllm/adapters/poet"}],
        "unload": [],
    }
    nine = plan(vllm_lora_runtime_updates=True, adapters=[{"name": f"a{n}", "url": f"{URL}/a{n}"} for n in range(9)])
    assert nine["lora"]["max_cpu_loras"] == 16
    assert plan(vllm_lora_runtime_updates=True, vllm_lora_max_cpu_loras=3)["lora"]["max_cpu_loras"] == 3
    assert all(i["environment"][lora.RUNTIME_ENV] == "True" for i in on["instances"])
    off = plan()
    assert all(lora.RUNTIME_ENV not in i.get("environment", {}) for i in off["instances"])
    two = plan(vllm_lora_runtime_updates=True, vllm_extra_args={"api_server_count": 2})
    assert any("vLLM refuses runtime LoRA updates with more than one API server" in e for e in two["errors"])
    by_hand = plan(vllm_environment={"VLLM_CPU_KVCACHE_SPACE": "1", lora.RUNTIME_ENV: "True"})
    assert any("set vllm_lora_runtime_updates: true" in e for e in by_hand["errors"]), by_hand["errors"]
    assert "is not true or false" in plan(vllm_lora_runtime_updates="yes")["errors"][0]
