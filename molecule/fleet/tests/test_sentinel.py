"""The sentinel of each vLLM host (vllm_sentinel, on by default; roles/vllm_sentinel/files/vllm-sentinel.py), as
converge and the rollouts of test_fleet.py and test_instances.py left it (test_tune.py runs after it).

Under a bounded loop of streamed completions through the gateway, the engine process of fleet-1's cpu0 is stopped
(SIGSTOP) while its API server still answers /health 200: the sentinel's probes get no token, its agent tells the
gateway "down", it restarts and verifies the instance and puts it back; only requests in flight on the stopped engine
may fail. The lab's stand-in for an NVIDIA fault (a container cannot write the kernel's log): an Xid line written to
the journal under the identifier the lab's vllm_sentinel_xid_journal_match reads, parsed as the kernel's would be; an
Xid that needs a reboot marks the instances and fires VllmGpuNeedsOperator, and nothing restarts. A hand edit of a
unit shows as drift in the sentinel's metrics within one round, as Prometheus' monitoring host scrapes them. A run
that changed the agent's socket unit takes it up anew while connections keep coming, without failing.
"""

import json
import subprocess
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lab import HOSTS, INSTANCES, MONITORING_HOST, gateway_state, on, playbook, prometheus, stream_loop

PAUSE = "/run/vllm-sentinel/paused-until"
TIMER_DROPIN = "/run/systemd/system/vllm-sentinel.timer.d/lab-test.conf"
SERVER = "fleet-1_cpu0"
UNIT = "vllm@cpu0.service"
URL = f"http://{HOSTS['fleet-1']}:{INSTANCES['cpu0']}"
NUMBERS = {}


def sentinel_metrics(host):
    """The sentinel's metrics of `host`, as the monitoring host reads them (its port admits the monitoring hosts)."""
    text = on(MONITORING_HOST, "curl", "-s", "-m", "10", f"http://{HOSTS[host]}:9172/metrics")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(metrics, name, **labels):
    return metrics.get((name, tuple(sorted(labels.items()))))


def engine_pid(host, unit):
    """The pid of the unit's engine core process (vLLM's EngineCore child of its API server)."""
    main = on(host, "systemctl", "show", "--property=MainPID", "--value", unit).strip()
    for pid in on(host, "pgrep", "-P", main, check=False).split():
        if "EngineCore" in on(host, "cat", f"/proc/{pid}/cmdline", check=False) + on(
            host, "cat", f"/proc/{pid}/comm", check=False
        ):
            return pid
    raise AssertionError(f"no EngineCore child of {unit}'s main process {main} on {host}")


def health(host):
    return on(host, "curl", "-s", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}", URL + "/health", check=False)


def invocation(host, unit):
    return on(host, "systemctl", "show", "--property=InvocationID", "--value", unit).strip()


@pytest.fixture(scope="module", autouse=True)
def running_sentinels():
    """Both hosts' sentinels run their rounds: no rollout left its pause behind (those of test_fleet.py that stopped
    on purpose lifted it as they stopped; the good ones once the host's instances were verified). Then fleet-1's
    rounds every 5 s, by a runtime drop-in of its timer: through site.yml the changed setting would take the host's
    full path, which after test_fleet.py's rollbacks also rolls fleet-1 forward to the inventory's release."""
    for host in HOSTS:
        assert on(host, "systemctl", "is-active", "vllm-sentinel.timer").strip() == "active", host
        assert (
            on(host, "test", "-e", PAUSE, check=False) == ""
            and subprocess.run(["podman", "exec", host, "test", "-e", PAUSE]).returncode == 1
        ), f"{host}: the sentinel is still paused by a rollout"
    # fleet-1's rounds every 5 s for this file (the lab's are every 30 s, to spare its 2 cores what each probe costs
    # vLLM): a runtime drop-in of the timer, gone at the end. sentinel.json still says 30 s (its metrics and alerts).
    on("fleet-1", "mkdir", "-p", str(Path(TIMER_DROPIN).parent))
    subprocess.run(
        ["podman", "exec", "-i", "fleet-1", "sh", "-c", f"cat > {TIMER_DROPIN}"],
        input="[Timer]\nOnActiveSec=\nOnActiveSec=5s\nOnUnitInactiveSec=\nOnUnitInactiveSec=5s\n",
        text=True,
        check=True,
    )
    on("fleet-1", "systemctl", "daemon-reload")
    on("fleet-1", "systemctl", "restart", "vllm-sentinel.timer")
    timer = on("fleet-1", "systemctl", "show", "--property=TimersMonotonic", "--value", "vllm-sentinel.timer")
    assert "OnUnitInactiveUSec=5s" in timer, timer
    yield
    on("fleet-1", "rm", "-f", TIMER_DROPIN)
    on("fleet-1", "systemctl", "daemon-reload")
    on("fleet-1", "systemctl", "restart", "vllm-sentinel.timer")
    print("\nsentinel numbers: " + json.dumps(NUMBERS))


@pytest.fixture(scope="module")
def hung_engine():
    """fleet-1's cpu0 engine stopped under a bounded load through the gateway: when the gateway took it out, when it
    was back, what the load lost."""
    assert gateway_state(SERVER) == "UP"
    before = sample(sentinel_metrics("fleet-1"), "vllm_sentinel_heals_total", instance="fleet-1/cpu0", result="healed")
    loop_started = time.monotonic()
    loop = stream_loop("sentinel", seconds=300)
    time.sleep(5)
    pid = engine_pid("fleet-1", UNIT)
    on("fleet-1", "kill", "-STOP", pid)
    stopped = time.monotonic()
    try:
        time.sleep(3)
        health_while_stopped = health("fleet-1")
        out = back = None
        deadline = stopped + 300
        while time.monotonic() < deadline:
            status = gateway_state(SERVER)
            if out is None and status.startswith("DOWN"):
                out = time.monotonic() - stopped
            if out is not None and status == "UP":
                back = time.monotonic() - stopped
                break
            time.sleep(0.5)
    finally:
        on("fleet-1", "kill", "-CONT", pid, check=False)  # a no-op once the sentinel restarted the unit
        result = loop()
    NUMBERS.update(
        out_of_rotation_s=out, back_in_rotation_s=back, load={k: result[k] for k in ("requests", "ok", "failed", "cut")}
    )
    return {
        "out": out,
        "back": back,
        "health": health_while_stopped,
        "load": result,
        "before": before or 0,
        # When the gateway took it out, in the load's own clock (seconds since the loop began, about).
        "out_in_load": stopped - loop_started + (out or 0),
    }


def test_a_hung_engine_whose_health_says_ok_is_taken_out_within_30_s(hung_engine):
    assert hung_engine["health"] == "200", "the stopped engine's API server did not answer /health: no hang to catch"
    assert hung_engine["out"] is not None, "the gateway never took the hung instance out"
    assert hung_engine["out"] <= 30, hung_engine


def test_the_sentinel_heals_it_and_puts_it_back(hung_engine):
    assert hung_engine["back"] is not None, "the instance did not come back into the gateway within 300 s"
    metrics = sentinel_metrics("fleet-1")
    healed = sample(metrics, "vllm_sentinel_heals_total", instance="fleet-1/cpu0", result="healed")
    assert healed == hung_engine["before"] + 1, metrics
    assert sample(metrics, "vllm_sentinel_out_of_rotation", instance="fleet-1/cpu0") == 0
    NUMBERS["serving_again_s"] = sample(
        metrics, "vllm_sentinel_last_heal_seconds", instance="fleet-1/cpu0", phase="serving"
    )
    journal = on("fleet-1", "journalctl", "-u", "vllm-sentinel.service", "--no-pager", "-o", "cat", "--since", "-10min")
    assert "cpu0: healed" in journal, journal[-2000:]


def test_only_requests_in_flight_on_the_stopped_engine_failed(hung_engine):
    """The load's users (2) each wait for one answer at a time: at most the requests the stopped engine held when it
    stopped or got before the gateway took it out, each started before that."""
    load = hung_engine["load"]
    assert load["requests"] >= 20, load
    lost = [r for r in load["log"] if r["outcome"] != "ok"]
    assert len(lost) <= 2, lost
    # Sent after the gateway took the instance out (1 s for the loop's own start): none of those may be lost.
    assert not [r for r in lost if r["start"] > hung_engine["out_in_load"] + 1], (hung_engine["out_in_load"], lost)


def watched(host):
    """The instances the host's sentinel watches, as the host's last rollout configured it (test_instances.py leaves
    fleet-2 with cpu0 alone)."""
    return sorted(i["name"] for i in json.loads(on(host, "cat", "/etc/vllm-sentinel/sentinel.json"))["instances"])


def test_an_xid_that_needs_a_reboot_marks_the_instances_fires_its_alert_and_restarts_nothing():
    """The lab's stand-in for the kernel's line (the same text the NVIDIA driver writes); fleet-1 has no GPU, so the
    Xid marks every instance of the host (both of its instances, the one healed above included)."""
    names = watched("fleet-1")
    assert names == ["cpu0", "cpu1"], names
    started = {name: invocation("fleet-1", f"vllm@{name}.service") for name in names}
    on(
        "fleet-1",
        "logger",
        "-t",
        "lab-kernel-xid",
        "NVRM: Xid (PCI:0000:01:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
    )
    deadline = time.monotonic() + 60
    firing = set()
    while time.monotonic() < deadline and firing != {"fleet-1/cpu0", "fleet-1/cpu1"}:
        firing = {
            a["labels"].get("instance")
            for a in prometheus("/api/v1/alerts")["data"]["alerts"]
            if a["labels"].get("alertname") == "VllmGpuNeedsOperator" and a["state"] == "firing"
        }
        time.sleep(2)
    assert firing == {"fleet-1/cpu0", "fleet-1/cpu1"}, firing
    metrics = sentinel_metrics("fleet-1")
    for name in names:
        assert sample(metrics, "vllm_sentinel_xid_needs_operator", instance=f"fleet-1/{name}") == 79, metrics
        assert sample(metrics, "vllm_sentinel_xid_total", instance=f"fleet-1/{name}", code="79", action="reboot") == 1
    assert {name: invocation("fleet-1", f"vllm@{name}.service") for name in names} == started, (
        "an Xid that needs a reboot restarted vLLM"
    )


def test_a_hand_edit_of_a_unit_shows_as_drift_within_one_round():
    unit = "/etc/systemd/system/vllm@cpu1.service"
    original = on("fleet-1", "cat", unit)
    subprocess.run(
        ["podman", "exec", "-i", "fleet-1", "sh", "-c", f"cat >> {unit}"],
        input="# a hand edit\n",
        text=True,
        check=True,
    )
    try:
        edited = time.monotonic()
        seen = None
        while time.monotonic() - edited < 20:
            if (
                sample(sentinel_metrics("fleet-1"), "vllm_sentinel_drift", instance="fleet-1/cpu1", what="unit_file")
                == 1
            ):
                seen = time.monotonic() - edited
                break
            time.sleep(0.5)
        NUMBERS["drift_seen_s"] = seen
        assert seen is not None and seen <= 5 + 5 + 2, seen  # one interval, a round's own time, the scrape
        assert (
            sample(sentinel_metrics("fleet-1"), "vllm_sentinel_drift", instance="fleet-1/cpu0", what="unit_file") == 0
        )
    finally:
        subprocess.run(
            ["podman", "exec", "-i", "fleet-1", "sh", "-c", f"cat > {unit}"], input=original, text=True, check=True
        )
    deadline = time.monotonic() + 20
    while sample(sentinel_metrics("fleet-1"), "vllm_sentinel_drift", instance="fleet-1/cpu1", what="unit_file") != 0:
        assert time.monotonic() < deadline, "the drift did not clear once the unit was restored"
        time.sleep(1)


# Connections to the agent's port from the host itself, by 4 threads each one after another (50 ms apart: systemd
# fails an Accept=yes socket that more than 200 connections trigger in 2 s), until the stop file appears, for at most
# `seconds` and `count` in all: each sends a name no instance has (the agent answers "up" and records nothing). Prints
# what became of them.
AGENT_LOAD_STOP = "/run/lab-agent-load.stop"
AGENT_LOAD = f"""
import collections, json, os, socket, sys, threading, time
seconds, count = float(sys.argv[1]), int(sys.argv[2])
outcomes = collections.Counter()
end = time.monotonic() + seconds
lock = threading.Lock()

def connect():
    while sum(outcomes.values()) < count and time.monotonic() < end and not os.path.exists("{AGENT_LOAD_STOP}"):
        try:
            with socket.create_connection(("127.0.0.1", 9171), timeout=2) as s:
                s.sendall(b"?\\n")
                word = s.recv(16).decode().strip() or "empty"
        except ConnectionRefusedError:
            word = "refused"
        except OSError as error:
            word = type(error).__name__
        with lock:
            outcomes[word] += 1
        time.sleep(0.05)

threads = [threading.Thread(target=connect) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps(outcomes))
"""


def test_a_changed_agent_socket_is_taken_up_anew_while_connections_come():
    """What a run does on a host whose agent socket ran before its unit file changed (roles/vllm_sentinel/tasks/
    restart.yml): stop it, wait until nothing listens on its port, start it. 15 times in a row while 4
    clients on the host connect to the port, each take-up must succeed and the socket answer after it. A plain restart
    can fail there with "Address already in use" (the task file says when and how often); this load does not
    reproduce that rate: the test shows the take-up holds under connections, not the race."""
    rounds = 15
    # The load keeps fleet-1's 2 cores busy: the sentinel is paused meanwhile (its probes could time out and heal).
    on("fleet-1", "sh", "-c", f"echo $(( $(date +%s) + 600 )) > {PAUSE}")
    on("fleet-1", "rm", "-f", AGENT_LOAD_STOP)
    load = subprocess.Popen(
        ["podman", "exec", "fleet-1", "python3", "-c", AGENT_LOAD, "240", "20000"], stdout=subprocess.PIPE, text=True
    )
    try:
        time.sleep(2)
        rc, output = playbook("molecule/fleet/files/sentinel_restart.yml", "-e", f"rounds={rounds}", timeout=600)
    finally:
        on("fleet-1", "touch", AGENT_LOAD_STOP)
        outcomes = json.loads(load.communicate(timeout=30)[0] or "{}")
        on("fleet-1", "rm", "-f", AGENT_LOAD_STOP, PAUSE)
    NUMBERS["agent_socket_rounds"] = {"rounds": rounds, "connections": outcomes}
    deadline = time.monotonic() + 120
    while {gateway_state(f"fleet-1_{name}") for name in INSTANCES} != {"UP"}:
        assert time.monotonic() < deadline, "fleet-1's instances were not all UP in the gateway 120 s after the load"
        time.sleep(2)
    assert rc == 0, output[-4000:]
    assert output.count("TASK [Start again: vllm-sentinel-agent.socket]") == rounds, output[-4000:]
    state = on("fleet-1", "systemctl", "is-active", "vllm-sentinel-agent.socket", check=False).strip()
    assert state == "active", on(
        "fleet-1",
        "systemctl",
        "status",
        "--no-pager",
        "-n",
        "20",
        "vllm-sentinel-agent.socket",
        "vllm-sentinel-agent.service",
        check=False,
    )
    assert outcomes.get("up", 0) >= 100, outcomes  # the connections came all along, and were answered


def test_one_process_answers_the_scrapes_as_its_own_user_and_leaves_no_warning_in_the_journal():
    """Prometheus scrapes the sentinel's metrics every few seconds, and the gateways ask its agent every few seconds
    per instance: one process each answers them all (their sockets hand it their connections, Accept=no), not a
    process per connection. The metrics' one runs as the user vllm-sentinel (the role's, owning nothing), not
    `nobody`, so systemd logs no "Special user nobody configured, this is not safe!" for it. Its sandbox's exposure is
    printed."""
    unit = on("fleet-1", "systemctl", "cat", "vllm-sentinel-metrics.service")
    assert "\nUser=vllm-sentinel\n" in unit and "\nGroup=vllm-sentinel\n" in unit, unit
    assert on("fleet-1", "id", "-u", "vllm-sentinel").strip() != "0"
    for socket_unit in ("vllm-sentinel-metrics.socket", "vllm-sentinel-agent.socket"):
        assert on("fleet-1", "systemctl", "show", "-p", "Accept", "--value", socket_unit).strip() == "no"
    scrape = ["curl", "-s", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:9172/metrics"]
    pids = set()
    for _ in range(3):
        assert on("fleet-1", *scrape).strip() == "200"
        pids.add(
            on("fleet-1", "systemctl", "show", "-p", "MainPID", "--value", "vllm-sentinel-metrics.service").strip()
        )
    assert len(pids) == 1 and pids != {"0"}, pids  # one process answered the three scrapes
    assert on("fleet-1", "ps", "-o", "user=", "-p", pids.pop()).strip() == "vllm-sentinel"
    journal = on("fleet-1", "journalctl", "-b", "--no-pager", "-o", "cat", "--since", "-10min")
    assert "Special user nobody configured" not in journal
    security = on("fleet-1", "systemd-analyze", "security", "--no-pager", "vllm-sentinel-metrics.service", check=False)
    print(security.splitlines()[-1] if security else "no security report")
    assert "Overall exposure level" in security, security[-2000:]
