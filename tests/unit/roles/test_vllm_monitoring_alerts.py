"""The Prometheus alert rules the vllm_monitoring role installs (an instance down, a KV cache near full, the day-2
findings), checked and unit-tested with the real promtool.

scripts/bootstrap.sh installs Debian's `prometheus` package, which ships promtool; without it these
tests skip (and say so).
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from conftest import ROOT, VLLM_FIXTURES
from vllm_fleet import metrics

RULES = ROOT / "roles" / "vllm_monitoring" / "files" / "vllm-alerts.yml"
TESTS = ROOT / "tests" / "promtool" / "vllm-alerts.test.yml"
PROMTOOL = shutil.which("promtool")

needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def _rules() -> dict[str, dict]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"]}


@needs_promtool
def test_rules_pass_promtool_check():
    proc = _run("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 15 rules found" in proc.stdout


@needs_promtool
def test_rules_unit_tests_pass():
    proc = _run("test", "rules", str(TESTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_promtool
@pytest.mark.parametrize(
    "alert, old, new",
    [
        ("VllmSpeculativeAcceptanceLow", ") < 0.6", ") < 0.2"),  # would miss gpu-1's 0.3
        ("VllmSpeculativeAcceptanceLow", ">= 100", ">= 1"),  # would judge gpu-3's 75 draft tokens
        ("VllmPreemptionsGrowing", "> 0", "> 50"),  # would miss gpu-1's 10 preemptions
        ("VllmPrefixCacheHitRateLow", ") < 0.3", ") < 0.6"),  # would flag gpu-2's healthy 50 %
        ("VllmPrefixCacheHitRateLow", ">= 1000", ">= 10"),  # would flag idle gpu-3
        ("VllmInstanceDown", 'up{job="vllm"} == 0', "up == 0"),  # would page for the gateway's exporter
        ("VllmKvCacheNearFull", "> 0.9", "> 0.99"),  # would miss gpu-1/gpu0's 95 %
    ],
)
def test_the_unit_tests_catch_a_wrong_threshold(tmp_path, alert, old, new):
    """The promtool tests have teeth: loosen or tighten one threshold and they fail."""
    doc = yaml.safe_load(RULES.read_text())
    rule = next(r for g in doc["groups"] for r in g["rules"] if r["alert"] == alert)
    assert old in rule["expr"]
    rule["expr"] = rule["expr"].replace(old, new)
    mutated = yaml.safe_dump(doc, sort_keys=False)
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "vllm-alerts.yml").write_text(mutated)
    test = yaml.safe_load(TESTS.read_text())
    test["rule_files"] = ["rules/vllm-alerts.yml"]
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    assert _run("check", "rules", str(tmp_path / "rules" / "vllm-alerts.yml")).returncode == 0
    proc = _run("test", "rules", str(tmp_path / "test.yml"))
    assert proc.returncode != 0, "promtool tests still pass with %s -> %s in %s" % (old, new, alert)


def test_rule_thresholds_are_the_role_defaults():
    """The alerts and the role's findings judge with the same numbers."""
    rules = _rules()
    d = metrics.DEFAULTS

    def numbers(alert: str) -> list[float]:
        return [float(n) for n in re.findall(r"(?:<|>=|>)\s*([0-9.]+)", rules[alert]["expr"])]

    assert numbers("VllmSpeculativeAcceptanceLow") == [d["min_acceptance_rate"], d["min_draft_tokens"]]
    assert numbers("VllmPreemptionsGrowing") == [d["max_preemption_increase"]]
    assert numbers("VllmPrefixCacheHitRateLow") == [d["min_prefix_hit_rate"], d["min_prefix_queries"]]
    defaults = yaml.safe_load((ROOT / "roles" / "vllm_verify" / "defaults" / "main.yml").read_text())
    assert defaults["vllm_verify_min_acceptance_rate"] == d["min_acceptance_rate"]
    assert defaults["vllm_verify_min_draft_tokens"] == d["min_draft_tokens"]
    assert defaults["vllm_verify_min_prefix_hit_rate"] == d["min_prefix_hit_rate"]
    assert defaults["vllm_verify_min_prefix_queries"] == d["min_prefix_queries"]
    assert defaults["vllm_verify_max_preemption_increase"] == d["max_preemption_increase"]


def test_rules_use_todays_metric_names():
    """Every vllm: series the rules read is one both 0.32 and 0.33 define, as a counter (read as NAME_total) or a
    gauge (speculative ones are defined outside loggers.py, so they are checked against the required speculative
    families)."""
    used = set(re.findall(r"vllm:[a-z_]+", RULES.read_text()))
    fixtures = VLLM_FIXTURES
    for version in ("0.32.0-cpu", "0.33.0"):
        defined = {
            line.split("\t")[0]: line.split("\t")[1]
            for line in (fixtures / version / "metrics_defined.tsv").read_text().splitlines()
            if line.strip()
        }
        for name in used:
            family, kind = (name[: -len("_total")], "counter") if name.endswith("_total") else (name, "gauge")
            if family in metrics.required_families(speculative=True) and family.startswith("vllm:spec_decode"):
                continue
            assert defined.get(family) == kind, "%s is not a %s of vLLM %s" % (family, kind, version)
    assert {n[: -len("_total")] for n in used if n.startswith("vllm:spec_decode")} <= set(
        metrics.required_families(speculative=True)
    )
