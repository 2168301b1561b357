"""The chain of custody on the fleet (issue #50, docs/air-gap.md), each link where a site meets it, with nothing
changed on any host when a check fails:

- the mirror's daily check (roles/vllm_monitoring/tasks/mirror_check.yml) on the monitoring host: its timer armed, a
  check of the lab's whole mirror (the signed bundle lab/scripts/bundle.sh made, over the lab network) that passes,
  then one file of the mirror altered in place on this machine, where lab-mirror serves it from: the check names it
  with both digests, Prometheus reads the result and VllmMirrorDiffers reaches the lab's webhook receiver through
  Alertmanager; put back (its bytes and times), the next check passes and the alert resolves;
- a model file altered on the mirror together with its SHA256SUMS (so that the model's own check would pass) is
  refused on the host, before its model folder changes; put back, the same run repairs the host's record;
- the lab's signed bundle with one member altered (the manifest and signature as signed) is refused by
  playbooks/bundle.yml naming the file, and the mirror keeps what it served.

An altered wheel is the upgrade's (test_fleet.py: it needs a release the hosts have not installed). Runs before
test_fleet.py, and leaves the fleet as converge left it."""

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from lab import CACHE, INSTANCES, MONITORING_HOST, ROOT, AlertReceiver, on, prometheus, site, state

MIRROR = CACHE / "mirror"
ALTERED = "sbom.cdx.json"  # a file of the signed manifest that no host takes
INSTANCE = "127.0.0.1:9174"


def check_now():
    """A run of the check as its timer starts it; (its exit status, what it said in the journal, seconds)."""
    since = on(MONITORING_HOST, "date", "+%Y-%m-%d %H:%M:%S").strip()
    started = time.monotonic()
    rc = subprocess.run(
        ["podman", "exec", MONITORING_HOST, "systemctl", "start", "vllm-mirror-check.service"]
    ).returncode
    took = time.monotonic() - started
    said = on(
        MONITORING_HOST, "journalctl", "-u", "vllm-mirror-check.service", "--since", since, "-o", "cat", "--no-pager"
    )
    return rc, said, took


def scraped_after(moment, timeout=60):
    """vllm_mirror_check_ok as Prometheus read it from a check that ended after `moment` (unix time)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = prometheus("/api/v1/query", query='vllm_mirror_check_last_run_timestamp_seconds{job="vllm_mirror"}')
        found = last["data"]["result"]
        if found and float(found[0]["value"][1]) >= moment:
            ok = prometheus("/api/v1/query", query='vllm_mirror_check_ok{job="vllm_mirror"}')["data"]["result"]
            return int(float(ok[0]["value"][1]))
        time.sleep(2)
    raise AssertionError(f"Prometheus read no result of a check ended after {moment} within {timeout} s")


def test_the_timer_is_armed_daily_with_its_random_delay():
    show = on(
        MONITORING_HOST,
        "systemctl",
        "show",
        "-p",
        "ActiveState,UnitFileState,RandomizedDelayUSec,Persistent",
        "vllm-mirror-check.timer",
    )
    assert set(show.split()) == {
        "ActiveState=active",
        "UnitFileState=enabled",
        "RandomizedDelayUSec=1h",
        "Persistent=yes",
    }
    assert "OnCalendar=daily" in on(MONITORING_HOST, "systemctl", "cat", "vllm-mirror-check.timer")


def test_an_altered_file_on_the_mirror_is_named_and_alerted_and_the_alert_resolves_once_it_is_put_back():
    # Whatever check converge started has ended (systemctl start waits for a running one to end, then runs another).
    rc, said, took = check_now()
    print(
        f"a whole check of the lab's mirror: {took:.1f} s; "
        + " ".join(line for line in said.splitlines() if line.startswith("checked"))
    )
    assert rc == 0, said
    assert "0 altered, 0 missing, 0 unreadable; the mirror's BUNDLE.sha256 is the signed one" in said
    assert scraped_after(time.time() - took - 5) == 1

    path = MIRROR / ALTERED
    before, times = path.read_bytes(), os.stat(path)
    started = time.time()
    with AlertReceiver() as receiver:
        try:
            path.write_bytes(before + b" ")  # in place: the same file, one byte more
            rc, said, _ = check_now()
            assert rc != 0, said
            assert (
                f"altered: http://10.89.77.2:8080/{ALTERED}: SHA-256 " in said and "the signed manifest gives" in said
            )
            assert "1 altered, 0 missing, 0 unreadable" in said
            assert scraped_after(started) == 0
            receiver.wait("firing", "VllmMirrorDiffers", INSTANCE, timeout=90, since=started - 5)
        finally:
            path.write_bytes(before)
            os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
        put_back = time.time()
        rc, said, _ = check_now()
        assert rc == 0, said
        assert scraped_after(put_back) == 1
        receiver.wait("resolved", "VllmMirrorDiffers", INSTANCE, timeout=120, since=started - 5)
    assert path.read_bytes() == before


def main_pids(host):
    return {
        i: on(host, "systemctl", "show", "-p", "MainPID", "--value", f"vllm@{i}.service").strip() for i in INSTANCES
    }


def model_files(host):
    """The SHA-256 of every file of the host's staged model (what a refusal may not touch)."""
    return on(host, "sh", "-c", "cd /var/lib/vllm/models && find . -type f -print0 | sort -z | xargs -0 sha256sum")


def test_a_model_file_altered_on_the_mirror_with_its_checksums_is_refused_on_the_host():
    """The mirror's tiny-qwen2 has its config.json altered and its SHA256SUMS rewritten to match, so the model's own
    check would take it. fleet-1, sent through the full path (vllm_fast_path=false), fetches that SHA256SUMS and
    refuses it against the digest the site signed: the run stops naming both digests, the host's model folder, units
    and processes as they were. With the mirror put back, the same run passes and the host keeps serving."""
    folder = CACHE / "mirror" / "models" / "lab" / "tiny-qwen2"
    config, sums = folder / "config.json", folder / "SHA256SUMS"
    kept = {path: (path.read_bytes(), path.stat()) for path in (config, sums)}
    before = (model_files("fleet-1"), state("fleet-1"), main_pids("fleet-1"))
    altered = kept[config][0].replace(b"{", b'{"lab_altered": true, ', 1)
    lines = [
        (hashlib.sha256(altered).hexdigest() + "  config.json") if line.endswith("  config.json") else line
        for line in kept[sums][0].decode().splitlines()
    ]
    altered_sums = ("\n".join(lines) + "\n").encode()
    assert altered_sums != kept[sums][0]
    try:
        config.write_bytes(altered)
        sums.write_bytes(altered_sums)
        started = time.monotonic()
        rc, output = site("-l", "fleet-1", "-e", "vllm_fast_path=false", run_id="custody-model")
        print(f"the run with an altered model stopped after {time.monotonic() - started:.0f} s")
    finally:
        for path, (data, times) in kept.items():
            path.write_bytes(data)
            os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
    assert rc != 0, output[-3000:]
    said = f"tiny-qwen2/SHA256SUMS has SHA-256 {hashlib.sha256(altered_sums).hexdigest()}, but the site's"
    assert said in output and "Nothing was staged or changed on this host" in output, output[-6000:]
    assert (model_files("fleet-1"), state("fleet-1"), main_pids("fleet-1")) == before
    started = time.monotonic()
    rc, output = site("-l", "fleet-1", run_id="custody-model-repaired")
    print(f"the same run with the mirror put back: {time.monotonic() - started:.0f} s")
    assert rc == 0, output[-6000:]
    assert (model_files("fleet-1"), state("fleet-1"), main_pids("fleet-1")) == before


def test_an_archive_with_one_member_altered_under_the_signed_manifest_is_refused_by_bundle_yml(tmp_path):
    """The lab's bundle (.cache/bundles/lab.tar, signed by lab/scripts/bundle.sh) copied with one byte of one member
    changed in place (sbom.cdx.json's; the manifest and its signature are the signed ones, and the served ones): the
    module reads every member against the manifest and refuses the copy naming the file and both digests; the mirror's
    files are as they were."""
    bundle = CACHE / "bundles" / "lab.tar"
    copy = CACHE / "bundles" / "lab-altered.tar"
    served = CACHE / "mirror" / "BUNDLE.sha256"
    before = (served.read_bytes(), served.stat().st_mtime_ns, (CACHE / "mirror" / ALTERED).stat().st_mtime_ns)
    try:
        shutil.copyfile(bundle, copy)
        with tarfile.open(bundle) as archive:
            member = next(m for m in archive.getmembers() if m.name.endswith("/" + ALTERED))
        with open(copy, "r+b") as handle:
            handle.seek(member.offset_data)
            first = handle.read(1)
            handle.seek(member.offset_data)
            handle.write(bytes([first[0] ^ 1]))
        started = time.monotonic()
        proc = subprocess.run(
            [
                str(Path(sys.executable).parent / "ansible-playbook"),
                "-i",
                "lab/inventory",
                "playbooks/bundle.yml",
                "-e",
                f"vllm_bundle={copy}",
            ],
            cwd=ROOT,
            env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0"),
            capture_output=True,
            text=True,
            timeout=600,
        )
        rc, output = proc.returncode, proc.stdout + proc.stderr
        print(f"bundle.yml refused the altered copy in {time.monotonic() - started:.1f} s")
    finally:
        copy.unlink(missing_ok=True)
    assert rc != 0, output[-3000:]
    assert ALTERED in output and "SHA-256" in output, output[-4000:]
    assert (served.read_bytes(), served.stat().st_mtime_ns, (CACHE / "mirror" / ALTERED).stat().st_mtime_ns) == before
