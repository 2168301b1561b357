"""The Grafana dashboard the vllm_monitoring role ships (files/grafana-vllm-fleet.json): every panel's query is
valid PromQL (the real promtool parses it, as a recording rule) and reads only metrics that the pinned vLLM releases
define, with the type its suffix implies, so that a renamed metric cannot leave a panel silently empty. That each
query returns series from a real Prometheus scraping real vLLM instances is the fleet scenario's test
(molecule/fleet/tests/test_monitoring.py).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
import yaml

from conftest import ROOT, VLLM_FIXTURES
from vllm_fleet import metrics

DASHBOARD = ROOT / "roles" / "vllm_monitoring" / "files" / "grafana-vllm-fleet.json"
PROMTOOL = shutil.which("promtool")


def queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target and template variable, Grafana's variables filled in as
    Grafana would ($instance: every instance; $__rate_interval: a range)."""
    board = json.loads(DASHBOARD.read_text())
    found = [(panel["title"], target["expr"]) for panel in board["panels"] for target in panel.get("targets") or []]
    return [(title, expr.replace("$__rate_interval", "2m").replace("$instance", ".*")) for title, expr in found]


def test_the_dashboard_has_a_panel_for_each_thing_an_operator_watches():
    titles = {title for title, _ in queries()}
    for wanted in (
        "Request rate",
        "Time to first token",
        "Inter-token latency",
        "KV cache usage",
        "Preemptions",
        "Prefix cache hit rate",
        "Speculative acceptance rate",
        "Requests running and waiting",
    ):
        assert wanted in titles, wanted
    board = json.loads(DASHBOARD.read_text())
    assert board["templating"]["list"][0]["name"] == "instance"
    # The import convention: the data source is chosen at import, not hard-coded.
    assert board["__inputs"][0]["type"] == "datasource"


def test_every_query_is_valid_promql(tmp_path):
    if PROMTOOL is None:
        pytest.fail("promtool is not installed: scripts/bootstrap.sh installs Debian's prometheus package")
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(queries())],
            }
        ]
    }
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries())} rules found" in result.stdout


@pytest.mark.parametrize("version", ["0.32.0-cpu", "0.33.0"])
def test_every_metric_a_panel_reads_is_one_the_release_defines(version):
    defined = {
        line.split("\t")[0]: line.split("\t")[1]
        for line in (VLLM_FIXTURES / version / "metrics_defined.tsv").read_text().splitlines()
        if line.strip()
    }
    speculative = {name for name in metrics.required_families(speculative=True) if name.startswith("vllm:spec_decode")}
    used = {name for _, expr in queries() for name in re.findall(r"vllm:[a-z_]+", expr)}
    assert len(used) >= 10, used
    for name in sorted(used):
        suffix, kind = next(
            (s, k) for s, k in (("_bucket", "histogram"), ("_total", "counter"), ("", "gauge")) if name.endswith(s)
        )
        family = name[: len(name) - len(suffix)] if suffix else name
        if family in speculative:  # defined outside loggers.py: the required speculative families
            continue
        assert defined.get(family) == kind, f"{name}: {family} is not a {kind} of vLLM {version}"
