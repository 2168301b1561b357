"""The fleet's monitoring host (roles/vllm_monitoring: Prometheus and Alertmanager from the lab's package mirror) after
converge: it scrapes every planned instance with the plan's labels and the gateway's exporter, admits only the
operators, and its alerts fire for real at a webhook receiver on this machine.

One instance (fleet-2's cpu1) is given a tiny KV cache (20 blocks of 32 tokens) and n-gram speculation by a runtime
drop-in, behind the rollout's back (what the lab cannot be otherwise: its tiny model never fills a 1 GiB cache), and
a bounded load of varied prompts drives it: the KV-cache and preemption alerts fire, the KV one resolves once the load
ends; every panel of the shipped dashboard returns series from this Prometheus; playbooks/diagnose.yml reads the
window and reports its findings, and its report page renders in a real headless browser. The drop-in is removed and
the instance restarted as planned at the end. Runs first (file order): test_fleet.py finds every instance as
converge left it.
"""

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from lab import (
    GATEWAY_HOST,
    HOSTS,
    INSTANCES,
    MODELS,
    MONITORING_HOST,
    REPORTS,
    ROOT,
    AlertReceiver,
    browser,
    load,
    on,
    playbook,
    prometheus,
    wait_instance_not_down,
)

DASHBOARD = ROOT / "roles" / "vllm_monitoring" / "files" / "grafana-vllm-fleet.json"
TARGET = "fleet-2/cpu1"
UNIT = "vllm@cpu1.service"
DROPIN = "/run/systemd/system/vllm@cpu1.service.d/lab-tiny-kv.conf"
SENTINEL_PAUSE = "/run/vllm-sentinel/paused-until"
URL = f"http://{HOSTS['fleet-2']}:{INSTANCES['cpu1']}"
TINY_KV = [
    "--max-model-len",
    "512",
    "--num-gpu-blocks-override",
    "20",
    "--block-size",
    "32",
    "--speculative-config",
    '\'{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":1,"prompt_lookup_max":3}\'',
]


def wait_healthy(url, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["curl", "-s", "-m", "5", "-o", "/dev/null", "-w", "%{http_code}", url + "/health"],
            capture_output=True,
            text=True,
        ).stdout
        if out == "200":
            return
        time.sleep(2)
    raise AssertionError(f"{url} not healthy within {timeout} s")


def test_prometheus_scrapes_every_instance_and_the_gateway_with_the_plans_labels():
    targets = prometheus("/api/v1/targets", state="active")["data"]["activeTargets"]
    vllm = {t["labels"]["instance"]: t for t in targets if t["labels"]["job"] == "vllm"}
    assert set(vllm) == {f"{host}/{instance}" for host in HOSTS for instance in INSTANCES}
    for name, target in vllm.items():
        host, instance = name.split("/")
        assert target["scrapeUrl"] == f"http://{HOSTS[host]}:{INSTANCES[instance]}/metrics"
        assert {k: target["labels"][k] for k in ("host", "vllm_instance", "profile", "card", "vllm_release")} == {
            "host": host,
            "vllm_instance": instance,
            "profile": "cpu-lab-tiny",
            "card": "cpu",
            "vllm_release": "0.31.0",  # converge deployed the release before the upgrade (host_vars)
        }
    deadline = time.monotonic() + 60
    while any(t["health"] != "up" for t in targets) and time.monotonic() < deadline:
        time.sleep(3)
        targets = prometheus("/api/v1/targets", state="active")["data"]["activeTargets"]
    assert {(t["labels"]["job"], t["health"]) for t in targets} == {
        ("vllm", "up"),
        ("haproxy", "up"),
        ("vllm_sentinel", "up"),
        ("vllm_mirror", "up"),
        ("prometheus", "up"),
    }, targets
    # Each vLLM host's sentinel (vllm_sentinel), on its metrics port.
    assert {t["scrapeUrl"] for t in targets if t["labels"]["job"] == "vllm_sentinel"} == {
        f"http://{address}:9172/metrics" for address in HOSTS.values()
    }


def test_the_rules_are_the_shipped_ones_with_the_sites_pending_periods():
    groups = prometheus("/api/v1/rules")["data"]["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"] if r["type"] == "alerting"}
    assert set(rules) >= {
        "VllmInstanceDown",
        "VllmKvCacheNearFull",
        "VllmPreemptionsGrowing",
        "VllmSpeculativeAcceptanceLow",
        "VllmPrefixCacheHitRateLow",
    }
    assert (rules["VllmInstanceDown"]["duration"], rules["VllmKvCacheNearFull"]["duration"]) == (10, 0)
    assert rules["VllmPrefixCacheHitRateLow"]["duration"] == 30 * 60  # as shipped


def test_prometheus_and_alertmanager_admit_only_the_operators():
    """From this machine (vllm_monitoring_allow) both answer; from the gateway host, not an operator, the
    connection is reset by the host's nftables rules."""
    for port in (9090, 9093):
        assert (
            subprocess.run(
                [
                    "curl",
                    "-s",
                    "-m",
                    "10",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                    f"http://10.89.77.23:{port}/-/ready",
                ],
                capture_output=True,
                text=True,
            ).stdout
            == "200"
        )
        refused = subprocess.run(
            [
                "podman",
                "exec",
                GATEWAY_HOST,
                "curl",
                "-s",
                "-m",
                "10",
                "-o",
                "/dev/null",
                f"http://10.89.77.23:{port}/-/ready",
            ],
            capture_output=True,
            text=True,
        )
        assert refused.returncode == 7, (port, refused.returncode)  # curl: could not connect (reset)
    assert on(MONITORING_HOST, "systemctl", "is-active", "vllm-monitoring-firewall.service").strip() == "active"


@pytest.fixture(scope="module")
def window():
    """fleet-2's cpu1 with a tiny KV cache and n-gram speculation under a bounded load, the alerts it raised, and
    afterwards the instance back as planned."""
    text = on("fleet-2", "cat", f"/etc/systemd/system/{UNIT}")
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ExecStart="))
    end = next(i for i in range(start, len(lines)) if not lines[i].rstrip().endswith("\\"))
    exec_start = " ".join(line.rstrip().rstrip("\\").strip() for line in lines[start : end + 1])
    dropin = "[Service]\nExecStart=\n" + exec_start + " " + " ".join(TINY_KV) + "\n"
    # The host's sentinel leaves it alone meanwhile, as for a rollout (its pause file): this change is made behind the
    # rollout's back on purpose.
    on("fleet-2", "sh", "-c", f"echo {int(time.time()) + 1800} > {SENTINEL_PAUSE}")
    on("fleet-2", "mkdir", "-p", str(Path(DROPIN).parent))
    subprocess.run(
        ["podman", "exec", "-i", "fleet-2", "sh", "-c", f"cat > {DROPIN}"], input=dropin, text=True, check=True
    )
    try:
        on("fleet-2", "systemctl", "daemon-reload")
        on("fleet-2", "systemctl", "restart", UNIT)
        wait_healthy(URL, 300)
        started = time.time()
        with AlertReceiver() as receiver:
            fired = {}

            def both_fired():
                fired.update(
                    {
                        a["labels"]["alertname"]: a
                        for a in receiver.alerts
                        if a["status"] == "firing"
                        and a["labels"].get("instance") == TARGET
                        and a["starts_at"] >= started
                    }
                )
                return {"VllmKvCacheNearFull", "VllmPreemptionsGrowing"} <= set(fired)

            counts = load(URL, MODELS["fleet-2"], seconds=150, max_requests=2000, stop=both_fired)
            ended = time.time()
            # The condition ends with the load: Prometheus stops holding the KV alert, Alertmanager says so.
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and any(
                a["labels"].get("alertname") == "VllmKvCacheNearFull" and a["labels"].get("instance") == TARGET
                for a in prometheus("/api/v1/alerts")["data"]["alerts"]
            ):
                time.sleep(2)
            # Under the load the KV alert may fire, resolve and fire again (it fires at the first evaluation over
            # 90 %, and preemptions free the cache): the firing that counts is the last, and it must resolve.
            kv_firings = [
                a
                for a in receiver.alerts
                if a["status"] == "firing"
                and a["starts_at"] >= started
                and (a["labels"].get("alertname"), a["labels"].get("instance")) == ("VllmKvCacheNearFull", TARGET)
            ]
            last_kv = max(kv_firings, key=lambda a: (a["starts_at"], a["received"]), default=None)
            resolved = receiver.wait(
                "resolved",
                "VllmKvCacheNearFull",
                TARGET,
                timeout=60,
                since=last_kv["starts_at"] if last_kv else started,
            )
            still = [
                a["labels"]["alertname"]
                for a in prometheus("/api/v1/alerts")["data"]["alerts"]
                if a["labels"].get("instance") == TARGET
            ]
        yield {
            "counts": counts,
            "fired": fired,
            "last_kv": last_kv,
            "resolved": resolved,
            "started": started,
            "ended": ended,
            "still_active": still,
        }
    finally:
        on("fleet-2", "rm", "-f", DROPIN)
        on("fleet-2", "systemctl", "daemon-reload")
        on("fleet-2", "systemctl", "restart", UNIT)
        wait_healthy(URL, 300)
        wait_instance_not_down(TARGET)
        on("fleet-2", "rm", "-f", SENTINEL_PAUSE)


def test_a_kv_cache_held_full_and_preemptions_raise_their_alerts(window):
    print(json.dumps({k: v for k, v in window.items() if k != "fired"}, default=str))
    assert window["counts"]["ok"] > 0, window["counts"]
    kv, preempted = window["fired"].get("VllmKvCacheNearFull"), window["fired"].get("VllmPreemptionsGrowing")
    assert kv and preempted, window["fired"]
    assert (kv["labels"]["model_name"], kv["labels"]["severity"]) == (MODELS["fleet-2"], "warning")
    assert preempted["labels"]["finding"] == "preemptions_growing"
    # Once the load had ended the KV alert resolved: the last firing of it (the preemption alert looks back 10 minutes
    # and holds).
    last = window["last_kv"]
    assert window["resolved"]["starts_at"] == last["starts_at"], (window["resolved"], last)
    assert window["resolved"]["received"] > last["received"]
    assert "VllmKvCacheNearFull" not in window["still_active"], window["still_active"]


def test_every_dashboard_panel_returns_series(window):
    """Each panel's query (Grafana's variables filled in: every instance, a 2 m rate window) over the load's window,
    as Grafana would ask this Prometheus for it."""
    board = json.loads(DASHBOARD.read_text())
    empty = []
    for panel in board["panels"]:
        for target in panel.get("targets") or []:
            query = target["expr"].replace("$__rate_interval", "2m").replace("$instance", ".*")
            answer = prometheus("/api/v1/query_range", query=query, start=window["started"], end=time.time(), step=5)
            if not answer["data"]["result"]:
                empty.append((panel["title"], query))
    assert empty == [], empty


def test_diagnose_reports_the_windows_findings_and_its_page_renders(window, tmp_path):
    """playbooks/diagnose.yml over the last 10 minutes: the loaded instance's preemptions and its prefix cache hit
    rate (varied prompts) are findings, read from Prometheus; the report has the window's plots, and Debian's
    Chromium renders its page without errors (screenshot: tests/artifacts/report-diagnose.png)."""
    rc, output = playbook(
        "playbooks/diagnose.yml", "-e", "vllm_diagnose_window=10m", "-e", "vllm_diagnose_run_id=diagnose-lab"
    )
    assert rc == 0, output[-4000:]
    report = json.loads((REPORTS / "diagnose-lab" / "report.json").read_text())
    day2 = report["hosts"][TARGET]["events"]["diagnose"][-1]
    assert day2["scraped"] and day2["window"] == "10m"
    ids = {f["id"] for f in day2["findings"]}
    # Measured on this lab: tens of preemptions, no prefix hit in thousands of queried tokens, and n-gram drafts
    # of a random-weight model at temperature 1 almost never accepted (2 % of about 2,000).
    assert ids == {"preemptions_growing", "prefix_hit_rate_low", "spec_acceptance_low"}, day2
    increases = day2["increases"]
    assert increases["vllm:num_preemptions"] > 0 and increases["vllm:prefix_cache_queries"] >= 1000, increases
    assert increases["vllm:spec_decode_num_draft_tokens"] >= 100, increases
    # The instances without the load have no finding: the judgement is per instance.
    for name, entry in report["hosts"].items():
        if name != TARGET:
            assert entry["events"]["diagnose"][-1]["findings"] == [], (name, entry["events"]["diagnose"])
    assert report["summary"]["findings"] == 3
    page = REPORTS / "diagnose-lab" / "report.html"
    assert "over the day-2 window" in page.read_text() and "in the last 10m" in page.read_text()
    opened = browser.open_page(page, tmp_path, "report-diagnose.png")
    images = len(re.findall(r"<img ", page.read_text()))
    assert images >= 2 and opened["images"] == (images, images), opened
    assert opened["console_errors"] == [], opened["console_errors"]
