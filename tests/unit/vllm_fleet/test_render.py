"""render.render_args: every shipped profile, every version boundary of the flag table, and the
0.32/0.33 renderings checked against those releases' real `vllm serve --help=all` output."""

import json
import os
import re
import subprocess
import sys

import pytest
from packaging.version import Version

from conftest import ROOT, VLLM_FIXTURES
from vllm_fleet import profiles, render

FIXTURES = str(VLLM_FIXTURES)
HELP = {"0.32.0": "0.32.0-cpu/serve_help_all.txt", "0.33.0": "0.33.0/serve_help_all.txt"}


def help_options(version):
    """Every option string `vllm serve --help=all` of that release lists (aliases included)."""
    options = set()
    with open(os.path.join(FIXTURES, HELP[version]), encoding="utf-8") as f:
        for line in f:
            if re.match(r"^\s{2}-", line):
                options.update(
                    re.findall(
                        r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", line.split("  ", 2)[1] if line.startswith("  --") else line
                    )
                )
    return options


def flags(args):
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


def just_before(version):
    major, minor, patch = Version(version).release
    return f"{major}.{minor}.{patch - 1}" if patch else f"{major}.{minor - 1}.99"


BOUNDARIES = sorted({e["since"] for eras in render.table()["keys"].values() for e in eras}, key=Version)
VERSIONS = sorted(set(BOUNDARIES) | {just_before(v) for v in BOUNDARIES[1:]} | {"0.32.0", "0.33.0"}, key=Version)


def test_the_boundaries_are_the_documented_changes():
    assert BOUNDARIES == ["0.7.0", "0.8.0", "0.8.5", "0.18.0", "0.28.0", "0.33.0"]
    for eras in render.table()["keys"].values():
        assert [Version(e["since"]) for e in eras] == sorted(Version(e["since"]) for e in eras)
        assert all(e.get("evidence") for e in eras)
        assert all(e.get("reason") for e in eras if e["form"] == "removed")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", profiles.names())
def test_every_profile_at_every_boundary(name, version):
    profile = profiles.resolve("h", name)
    result = render.render_args(profile, version)
    v = Version(version)
    args, used = result.args, flags(result.args)
    assert args[0] == profile["model"] and "--model" not in used
    assert args[1:3] == ["--served-model-name", profile.get("served_model_name", profile["model"])]
    for key in ("gpu_memory_utilization", "max_model_len", "max_num_seqs", "max_num_batched_tokens"):
        flag = "--" + key.replace("_", "-")
        assert args[args.index(flag) + 1] == str(profile[key])
    dropped = {d["flag"] for d in result.dropped}
    if profile.get("calculate_kv_scales"):
        assert ("--calculate-kv-scales" in used) == (v < Version("0.28.0"))
        assert ("--calculate-kv-scales" in dropped) == (v >= Version("0.28.0"))
    if "swap_space" in profile:
        assert ("--swap-space" in used) == (v < Version("0.18.0"))
        assert ("--swap-space" in dropped) == (v >= Version("0.18.0"))
    if "speculative" in profile:
        assert ("--speculative-config" in used) == (v >= Version("0.8.0"))
        assert ("--speculative-model" in used or "--num-speculative-tokens" in used) == (v < Version("0.8.0"))
    assert "--swap-space" not in dropped or "swap_space" in profile
    assert all(d["reason"] for d in result.dropped)


@pytest.mark.parametrize(
    "version,chunked,prefix",
    [
        ("0.7.0", ["--enable-chunked-prefill=False"], ["--no-enable-prefix-caching"]),
        ("0.8.4", ["--enable-chunked-prefill=False"], ["--no-enable-prefix-caching"]),
        ("0.8.5", ["--no-enable-chunked-prefill"], ["--no-enable-prefix-caching"]),
        ("0.32.0", ["--no-enable-chunked-prefill"], ["--no-enable-prefix-caching"]),
        ("0.32.99", ["--no-enable-chunked-prefill"], ["--no-enable-prefix-caching"]),
        ("0.33.0", ["--disable-chunked-prefill"], ["--disable-prefix-caching"]),
        ("0.33.4", ["--disable-chunked-prefill"], ["--disable-prefix-caching"]),
    ],
)
def test_false_booleans_per_release(version, chunked, prefix):
    result = render.render_args(
        {"model": "m", "enable_chunked_prefill": False, "enable_prefix_caching": False}, version
    )
    assert result.args[3:] == chunked + prefix
    on = render.render_args({"model": "m", "enable_chunked_prefill": True, "enable_prefix_caching": True}, version)
    assert on.args[3:] == ["--enable-chunked-prefill", "--enable-prefix-caching"]


def test_legacy_speculative_flags_before_0_8():
    spec = {"model": "Qwen/Qwen2.5-0.5B-Instruct", "num_speculative_tokens": 5, "draft_tensor_parallel_size": 1}
    old = render.render_args({"model": "m", "speculative": spec}, "0.7.99", draft_model_path="/d")
    assert old.args[3:] == [
        "--speculative-model",
        "/d",
        "--num-speculative-tokens",
        "5",
        "--speculative-draft-tensor-parallel-size",
        "1",
    ]
    new = render.render_args({"model": "m", "speculative": spec}, "0.8.0", draft_model_path="/d")
    assert new.args[3:] == [
        "--speculative-config",
        '{"draft_tensor_parallel_size":1,"model":"/d","num_speculative_tokens":5}',
    ]
    ngram = render.render_args({"model": "m", "speculative": {"method": "ngram", "num_speculative_tokens": 3}}, "0.7.3")
    assert ngram.args[3:] == ["--speculative-model", "[ngram]", "--num-speculative-tokens", "3"]
    eagle = render.render_args(
        {"model": "m", "speculative": {"method": "eagle", "model": "e", "num_speculative_tokens": 6}}, "0.7.3"
    )
    assert "--speculative-model" in eagle.args and "implied by the draft checkpoint" in eagle.warnings[0]
    mtp = render.render_args(
        {"model": "m", "speculative": {"method": "mtp", "num_speculative_tokens": 1, "model": "x"}}, "0.7.3"
    )
    assert mtp.dropped[0]["flag"] == "speculative.method=mtp" and "--speculative-model" not in mtp.args


def test_swap_space_dropped_with_a_warning_only_when_it_asked_for_swap():
    zero = render.render_args({"model": "m", "swap_space": 0}, "0.18.0")
    assert zero.dropped[0]["flag"] == "--swap-space" and "0.18.0" in zero.dropped[0]["reason"] and not zero.warnings
    four = render.render_args({"model": "m", "swap_space": 4}, "0.18.0")
    assert "swap_space=4 GiB" in four.warnings[0]
    assert render.render_args({"model": "m", "swap_space": 4}, "0.17.1").args[3:] == ["--swap-space", "4"]


def test_calculate_kv_scales_false_renders_nothing():
    assert render.render_args({"model": "m", "calculate_kv_scales": False}, "0.27.0").args == [
        "m",
        "--served-model-name",
        "m",
    ]


def test_model_path_replaces_the_model_and_keeps_the_served_name():
    result = render.render_args(
        {"model": "Qwen/Qwen2.5-7B-Instruct", "served_model_name": "chat"},
        "0.33.0",
        model_path="/var/lib/vllm/models/qwen",
    )
    assert result.args == ["/var/lib/vllm/models/qwen", "--served-model-name", "chat"]


def test_extra_args_are_rendered_sorted_after_the_profile():
    """disable_log_stats: false renders nothing: the option is store_true (no --no- form in 0.32's parser)."""
    result = render.render_args(
        {"model": "m", "max_num_seqs": 8},
        "0.32.0",
        extra_args={
            "port": 8000,
            "host": "0.0.0.0",
            "enforce_eager": True,
            "disable_log_stats": False,
            "kv_cache_memory_bytes": "1G",
            "compilation_config": {"level": 0},
            "allowed_origins": ["a", "b"],
            "max_loras": None,
        },
    )
    assert result.args[3:] == [
        "--max-num-seqs",
        "8",
        "--allowed-origins",
        "a",
        "b",
        "--compilation-config",
        '{"level":0}',
        "--enforce-eager",
        "--host",
        "0.0.0.0",
        "--kv-cache-memory-bytes",
        "1G",
        "--port",
        "8000",
    ]


def test_extra_boolean_false_per_release():
    extra = {"enable_log_requests": False, "enforce_eager": False}
    assert flags(render.render_args({"model": "m"}, "0.32.0", extra_args=extra).args) == [
        "--served-model-name",
        "--no-enable-log-requests",
        "--no-enforce-eager",
    ]
    assert flags(render.render_args({"model": "m"}, "0.33.0", extra_args=extra).args) == [
        "--served-model-name",
        "--disable-log-requests",
        "--no-enforce-eager",
    ]


@pytest.mark.parametrize(
    "extra,message",
    [
        ({"max_num_seqs": 4}, "vllm_extra_args.max_num_seqs duplicates a profile key"),
        ({"model": "x"}, "vllm_extra_args.model duplicates a profile key"),
        ({"--port": 1}, "is not a snake_case vLLM argument name"),
        ({"Port": 1}, "is not a snake_case vLLM argument name"),
    ],
)
def test_bad_extra_args(extra, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        render.render_args({"model": "m", "max_num_seqs": 8}, "0.33.0", extra_args=extra)


@pytest.mark.parametrize(
    "version,extra,message",
    [
        (
            "0.33.0",
            {"max_num_seqz": 4},
            "vllm_extra_args.max_num_seqz: --max-num-seqz is not an option of vLLM 0.33.0's "
            "serve parser (data/serve_options.yml) (options with a like name: --max-num-seqs",
        ),
        (
            "0.33.0",
            {"speculative_model": "x"},
            "vllm_extra_args.speculative_model: the three --speculative-* flags were replaced by --speculative-config",
        ),
        ("0.32.0", {"num_speculative_tokens": 5}, "fix: set vllm_profile.speculative"),
        # 0.26 has no capture: a name that no captured release's parser knows is refused all the same.
        (
            "0.26.0",
            {"no_such_flag": 1},
            "is not an option of the serve parser of any captured release (0.32.0, 0.33.0)",
        ),
    ],
)
def test_extra_args_must_be_options_of_the_release(version, extra, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        render.render_args({"model": "m"}, version, extra_args=extra)


def test_extra_args_go_through_the_release_table():
    """swap_space was removed in 0.18.0: dropped with the table's reason, as it is from a profile."""
    result = render.render_args({"model": "m"}, "0.33.0", extra_args={"swap_space": 4})
    assert "--swap-space" not in result.args
    assert result.dropped == [
        {"flag": "--swap-space", "reason": " ".join(render.era("swap_space", "0.33.0")["reason"].split())}
    ]
    assert render.render_args({"model": "m"}, "0.17.0", extra_args={"swap_space": 4}).args[-2:] == ["--swap-space", "4"]


def test_store_true_options_false_is_left_out():
    """--disable-log-stats has no negative form in 0.33: false is its default and renders nothing."""
    assert "--disable-log-stats" in render.serve_options()[render.Version("0.33.0")]
    result = render.render_args({"model": "m"}, "0.33.0", extra_args={"disable_log_stats": False})
    assert result.args == ["m", "--served-model-name", "m"]


@pytest.mark.parametrize(
    "version,message",
    [
        (
            "0.33",
            "vllm_version='0.33' is not a full release number (pip and the virtualenv name pin X.Y.Z); fix: the "
            'release as PyPI lists it, e.g. "0.33.0"',
        ),
        ("99.0.0", "vllm_version='99.0.0' is newer than the 0.33 series"),
        ("0.34.0", "fix: pin a release up to 0.33.x"),
        ("0.33.0+cu130", "is not a full release number"),
    ],
)
def test_versions_the_project_cannot_vouch_for(version, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        render.parse_version(version)


def test_serve_options_are_generated_from_the_captures():
    """data/serve_options.yml is what scripts/serve-options.py extracts from the real help captures."""
    script = os.path.join(ROOT, "scripts", "serve-options.py")
    proc = subprocess.run(
        [sys.executable, script, "--check"] + [f"{v}={os.path.join(FIXTURES, f)}" for v, f in HELP.items()],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for version in HELP:
        assert render.serve_options()[render.Version(version)] == set(help_options(version))


def test_extra_args_must_be_a_dict():
    with pytest.raises(ValueError, match=r"vllm_extra_args=\['a'\] is not a dict"):
        render.render_args({"model": "m"}, "0.33.0", extra_args=["a"])


@pytest.mark.parametrize(
    "version,message",
    [
        (0.33, "vllm_version=0.33 is a float, not a string"),
        ("latest", "vllm_version='latest' is not a release number"),
        ("0.6.6", "older than 0.7.0, the oldest release whose flags the table knows"),
    ],
)
def test_bad_versions(version, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        render.render_args({"model": "m"}, version)


def test_profile_without_model_is_refused():
    with pytest.raises(ValueError, match="the profile has no model"):
        render.render_args({}, "0.33.0")


def test_result_as_dict():
    assert render.render_args({"model": "m"}, "0.33.0").as_dict() == {
        "args": ["m", "--served-model-name", "m"],
        "dropped": [],
        "warnings": [],
    }


# --- the real help output of 0.32 and 0.33 ------------------------------------------------------------
LAB_EXTRA = {"host": "0.0.0.0", "port": 8000, "kv_cache_memory_bytes": 1073741824, "enforce_eager": True}


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
@pytest.mark.parametrize("name", profiles.names())
def test_rendered_flags_exist_in_that_releases_help(name, version):
    options = help_options(version)
    assert "--speculative-config" in options and "--max-num-seqs" in options  # the fixture is whole
    for overrides in ({}, {"enable_chunked_prefill": False, "enable_prefix_caching": False}):
        profile = profiles.resolve("h", name, overrides)
        result = render.render_args(profile, version, extra_args=LAB_EXTRA)
        missing = [f for f in flags(result.args) if f not in options]
        assert not missing, f"vLLM {version} help lacks {missing}"
        for d in result.dropped:
            assert d["flag"] not in options, f"{d['flag']} is dropped but vLLM {version} still lists it"


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
def test_the_guides_removed_flags_are_absent_from_the_help(version):
    options = help_options(version)
    for flag in (
        "--calculate-kv-scales",
        "--swap-space",
        "--speculative-model",
        "--num-speculative-tokens",
        "--speculative-draft-tensor-parallel-size",
    ):
        assert flag not in options


def test_the_negative_spelling_changed_between_032_and_033():
    assert "--no-enable-prefix-caching" in help_options("0.32.0")
    assert "--disable-prefix-caching" not in help_options("0.32.0")
    assert "--disable-prefix-caching" in help_options("0.33.0")


def test_seed_table_agrees_with_the_renderer():
    """shared/fixtures/vllm/seed_flags_vs_vllm.txt: each guide flag REJECTED by both parsers is one
    the renderer drops or translates for 0.32 and 0.33."""
    rejected = set()
    with open(os.path.join(FIXTURES, "seed_flags_vs_vllm.txt"), encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in line.split("|")]
            if len(cells) > 2 and cells[1] == "REJECTED" and cells[2] == "REJECTED":
                rejected.add(cells[0].split()[0])
    assert rejected == {
        "--calculate-kv-scales",
        "--swap-space",
        "--speculative-model",
        "--num-speculative-tokens",
        "--speculative-draft-tensor-parallel-size",
    }
    for version in ("0.32.0", "0.33.0"):
        for name in profiles.names():
            assert not rejected & set(flags(render.render_args(profiles.resolve("h", name), version).args))


def test_speculative_json_is_compact_and_sorted():
    spec = {"num_speculative_tokens": 5, "model": "d", "method": "draft_model"}
    args = render.render_args({"model": "m", "speculative": spec}, "0.33.0").args
    assert args[-1] == '{"method":"draft_model","model":"d","num_speculative_tokens":5}'
    assert json.loads(args[-1]) == spec


# --- the gate of the operator's vllm_extra_args (extra_args_errors) -------------------------------------------
V033 = render.parse_version("0.33.0")


def test_the_gate_passes_what_the_release_takes_and_no_setting_manages():
    extra = {
        "kv_cache_memory_bytes": 1073741824,
        "enforce_eager": True,
        "enable_log_requests": False,
        "attention_config": {"flash_attn_version": 2},
        "disable_log_stats": False,
        "block_size": None,
        "chat_template": "tiny qwen 100% $HOME \"q\" 'x'",
        "tokenizer": "/srv/models/t",
    }
    assert render.extra_args_errors("h1", extra, V033) == []
    assert render.extra_args_errors("h1", None, V033) == [] and render.extra_args_errors("h1", {}, V033) == []


def test_the_gate_walks_every_managed_key_without_the_release_too():
    """A bad vllm_version waits for its own error, but what a setting manages is refused all the same."""
    for key, setting in render.MANAGED_EXTRA_ARGS.items():
        (message,) = render.extra_args_errors("h1", {key: 2}, None)
        assert message.startswith(f"h1: vllm_extra_args.{key}") and setting in message and "fix:" in message


@pytest.mark.parametrize(
    "extra,message",
    [
        (
            {"swap_space": 4},
            "h1: vllm_extra_args.swap_space=4: vLLM 0.33.0 no longer has --swap-space: --swap-space was "
            "removed in vLLM 0.18.0",
        ),
        (
            {"max_num_seqz": 4},
            "h1: vllm_extra_args.max_num_seqz=4: --max-num-seqz is not an option of vLLM 0.33.0's "
            "serve parser (data/serve_options.yml) (options with a like name: --max-num-seqs",
        ),
        (
            {"no_enable_log_requests": True},
            "h1: vllm_extra_args.no_enable_log_requests=True: --no-enable-log-requests is "
            "not an option of vLLM 0.33.0's serve parser (data/serve_options.yml) (vLLM "
            "0.32.0 had it: the option was renamed or removed)",
        ),
        ({"my_token": "sk-abc"}, "h1: vllm_extra_args.my_token (value not shown): --my-token is not an option"),
        (
            {"num_speculative_tokens": 5},
            "h1: vllm_extra_args.num_speculative_tokens=5: the three --speculative-* flags",
        ),
        (
            {"max_num_seqs": 8},
            "h1: vllm_extra_args.max_num_seqs duplicates a profile key: its 8 would fight vllm_profile.max_num_seqs",
        ),
        ({"api_key": "sk-abc"}, "h1: vllm_extra_args.api_key (value not shown) is managed by vllm_api_key"),
        ({"port": 8001}, "h1: vllm_extra_args.port=8001 is managed by vllm_port"),
        ({"--port": 8001}, "h1: vllm_extra_args key '--port' is not a snake_case vLLM argument name"),
        ({"port\n": 8001}, "h1: vllm_extra_args key 'port\\n' is not a snake_case vLLM argument name"),
        (
            {"enforce_eager": "yes\u2028--api-key"},
            "h1: vllm_extra_args.enforce_eager='yes\\u2028--api-key' holds a control or format character",
        ),
        (
            {"my_token": "sk-abc\u0085"},
            "h1: vllm_extra_args.my_token (value not shown) holds a control or format character",
        ),
        ({"block_size": [[16]]}, "h1: vllm_extra_args.block_size=[[16]] is not a value a vLLM argument takes"),
        ({"attention_config": {1: {2}}}, "h1: vllm_extra_args.attention_config={1: {2}} is not a value"),
        ("--enforce-eager", "h1: vllm_extra_args='--enforce-eager' is not a dict; fix:"),
    ],
)
def test_the_gate_names_host_key_value_and_fix(extra, message):
    errors = render.extra_args_errors("h1", extra, V033)
    assert len(errors) == 1 and errors[0].startswith(message), errors
    assert "fix:" in errors[0] and "sk-abc" not in errors[0]


def test_the_gate_reports_every_bad_key_at_once():
    errors = render.extra_args_errors("h1", {"host": "0.0.0.0", "port": 1, "enforce_eager": True, "x_y": 1}, V033)
    assert [e.split(":")[1].split("=")[0].strip() for e in errors] == [
        "vllm_extra_args.host",
        "vllm_extra_args.port",
        "vllm_extra_args.x_y",
    ]


def test_render_args_still_takes_the_roles_own_arguments():
    """The plan passes --host, --port, --shutdown-timeout and the placement's needs to render_args itself; the
    gate keeps the operator's out of them."""
    args = render.render_args(
        {"model": "m"},
        "0.33.0",
        extra_args={"host": "0.0.0.0", "port": 8000, "shutdown_timeout": 30, "disable_custom_all_reduce": True},
    ).args
    assert args[3:] == [
        "--disable-custom-all-reduce",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--shutdown-timeout",
        "30",
    ]
