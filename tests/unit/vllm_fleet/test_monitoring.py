"""vllm_fleet.monitoring: Prometheus' targets from the plan, the rules with a site's pending periods, and the day-2
findings of a window (Prometheus' answers are in the shape of its HTTP API, /api/v1/query and /query_range)."""

from __future__ import annotations

import pytest
import yaml

from vllm_fleet import monitoring, planner

from conftest import L40, ROOT

RULES = yaml.safe_load((ROOT / "roles" / "vllm_monitoring" / "files" / "vllm-alerts.yml").read_text())


def test_every_planned_instance_is_a_target_with_its_labels():
    plans = {
        "gpu-1": planner.plan_host("gpu-1", {"vllm_profile_name": "l40x4-14b-per-gpu", "vllm_version": "0.33.0",
                                             "vllm_gpu": dict(L40, count=2), "ansible_host": "10.0.0.11"}),
        "gpu-2": planner.plan_host("gpu-2", {"vllm_profile_name": "l40x4-14b-per-gpu", "vllm_version": "0.33.0",
                                             "vllm_gpu": dict(L40, count=1), "vllm_bind_address": "fd00::2"}),
    }
    targets = monitoring.targets(plans)
    assert [t["targets"] for t in targets] == [["10.0.0.11:8000"], ["10.0.0.11:8001"], ["[fd00::2]:8000"]]
    assert targets[1]["labels"] == {"instance": "gpu-1/gpu1", "host": "gpu-1", "vllm_instance": "gpu1",
                                    "profile": "l40x4-14b-per-gpu", "card": "NVIDIA L40", "vllm_release": "0.33.0"}
    assert targets[2]["labels"]["instance"] == "gpu-2/main"
    assert monitoring.targets({"broken": {"errors": ["x"], "instances": []}}) == []


def test_a_site_shortens_an_alerts_pending_period_and_nothing_else():
    shipped = monitoring.alert_names(RULES)
    assert shipped == ["VllmInstanceDown", "VllmKvCacheNearFull", "VllmPreemptionsGrowing",
                       "VllmPrefixCacheHitRateLow", "VllmSpeculativeAcceptanceLow"]
    changed = monitoring.rules(RULES, {"VllmInstanceDown": "20s"})
    rules = {r["alert"]: r for g in changed["groups"] for r in g["rules"]}
    assert rules["VllmInstanceDown"]["for"] == "20s" and rules["VllmKvCacheNearFull"]["for"] == "5m"
    original = {r["alert"]: r for g in RULES["groups"] for r in g["rules"]}
    assert rules["VllmInstanceDown"]["expr"] == original["VllmInstanceDown"]["expr"]
    assert original["VllmInstanceDown"]["for"] == "2m"  # the shipped rules are not modified
    with pytest.raises(ValueError, match="no shipped alert is named VllmTypo"):
        monitoring.rules(RULES, {"VllmTypo": "1m"})


def _vector(name_to_values):
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"instance": instance}, "value": [1764640000.0, str(value)]}
        for instance, value in name_to_values.items()]}}


def test_a_windows_increases_become_the_day2_findings():
    names = list(monitoring.FINDING_COUNTERS)
    answers = [
        _vector({"h/gpu0": 12.0, "h/gpu1": 0.0}),            # preemptions
        _vector({"h/gpu0": 100.0, "h/gpu1": 900.0}),         # prefix cache hits (tokens)
        _vector({"h/gpu0": 5000.0, "h/gpu1": 1000.0}),       # prefix cache queries (tokens)
        _vector({"h/gpu0": 400.0}),                          # draft tokens: only gpu0 speculates
        _vector({"h/gpu0": 80.0}),                           # accepted tokens
    ]
    increases = monitoring.increases_by_instance(answers, names)
    assert increases["h/gpu1"]["vllm:spec_decode_num_draft_tokens"] is None
    gpu0 = monitoring.window_findings(increases["h/gpu0"], "1h", prefix_caching=True)
    assert {f["id"] for f in gpu0} == {"preemptions_growing", "prefix_hit_rate_low", "spec_acceptance_low"}
    assert all(f["basis"] == "the last 1h" for f in gpu0)
    assert any("preemptions grew by 12 in the last 1h" in f["message"] for f in gpu0)
    assert monitoring.window_findings(increases["h/gpu1"], "1h", prefix_caching=True) == []  # 90 % hits, none else
    # Prefix caching off: a low hit rate is no finding.
    assert {f["id"] for f in monitoring.window_findings(increases["h/gpu0"], "1h", prefix_caching=False)} == {
        "preemptions_growing", "spec_acceptance_low"}


def test_range_answers_become_series_by_instance():
    answer = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"instance": "h/gpu0"}, "values": [[1764640000, "0.5"], [1764640060, "0.97"]]}]}}
    assert monitoring.series_by_instance([answer], ["kv_cache_usage"]) == {
        "kv_cache_usage": {"h/gpu0": [[1764640000.0, 0.5], [1764640060.0, 0.97]]}}


def test_each_gateway_is_scraped_at_its_exporter_port():
    got = monitoring.gateway_targets([{"ansible_host": "10.0.10.5"},
                                      {"ansible_host": "fd00::5", "vllm_gateway_metrics_port": 9101},
                                      {"inventory_hostname": "gw-3.example"}])
    assert got == ["10.0.10.5:8405", "[fd00::5]:9101", "gw-3.example:8405"]
