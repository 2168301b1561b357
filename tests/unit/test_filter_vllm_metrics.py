"""The vllm_metrics filter plugin: thin wrappers over vllm_fleet.metrics/report, on REAL /metrics pages
(tests/unit/fixtures/vllm/), and AnsibleFilterError naming the bad value."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError

ROOT = Path(__file__).resolve().parents[2]
FIX = Path(__file__).resolve().parent / "fixtures" / "vllm"
IDLE = (FIX / "0.32.0-cpu" / "metrics_idle.txt").read_text()
AFTER = (FIX / "0.32.0-cpu" / "metrics_after_20_requests.txt").read_text()
H200_FP8 = (FIX / "0.26.0-cuda-h200" / "metrics_fp8_kv_after_bench.txt").read_text()
CHAT = json.loads((FIX / "0.32.0-cpu" / "responses" / "chat.json").read_text())
MODELS = json.loads((FIX / "0.32.0-cpu" / "responses" / "models.json").read_text())


def _load():
    spec = importlib.util.spec_from_file_location("vllm_metrics_filter", ROOT / "plugins" / "filter" / "vllm_metrics.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


plugin = _load()
F = plugin.FilterModule().filters()


def preempted(text: str, value: float) -> str:
    return re.sub(r"(?m)^(vllm:num_preemptions_total\{[^}]*\}) \S+$", r"\g<1> %r" % value, text)


def test_every_filter_is_registered():
    assert sorted(F) == [
        "vllm_metrics_check", "vllm_metrics_facts", "vllm_metrics_findings", "vllm_metrics_kv_error",
        "vllm_metrics_readback", "vllm_metrics_required", "vllm_report_fragment", "vllm_report_fragment_name",
        "vllm_report_markdown", "vllm_report_merge", "vllm_verify_result", "vllm_verify_unit_verdict",
    ]


def test_docs_examples_return_are_yaml():
    for name in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
        assert yaml.safe_load(getattr(plugin, name)), name
    assert yaml.safe_load(plugin.DOCUMENTATION)["name"] == "vllm_metrics_facts"


def test_ansible_doc_reads_the_documentation():
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-doc"), "-t", "filter", "vllm_metrics_check"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "vllm_metrics_check" in proc.stdout and "speculative" in proc.stdout


# ------------------------------------------------------------------------------------------------
# Happy paths, including no-change cases
# ------------------------------------------------------------------------------------------------


def test_facts_of_a_real_page_are_plain_json():
    facts = F["vllm_metrics_facts"](AFTER)
    assert facts["counters"]["vllm:request_success"] == 20.0
    assert facts["cache_config"]["cache_dtype"] == "auto"
    assert json.loads(json.dumps(facts, allow_nan=False)) == facts


def test_check_takes_text_or_facts_alike():
    facts = F["vllm_metrics_facts"](AFTER)
    assert F["vllm_metrics_check"](AFTER) == [] == F["vllm_metrics_check"](facts)  # no change: nothing to say
    profile = {"kv_cache_dtype": "auto", "enable_prefix_caching": True, "gpu_memory_utilization": 0.92}
    assert F["vllm_metrics_check"](facts, profile=profile) == []


def test_check_reports_a_family_removed_from_the_real_page():
    text = "".join(l for l in AFTER.splitlines(keepends=True) if not re.match(r"(# (HELP|TYPE) )?vllm:prompt_tokens_(total|created)[ {]", l))
    assert F["vllm_metrics_check"](text) == ["required metric family vllm:prompt_tokens (counter) is missing from /metrics"]


def test_check_with_speculation_on_and_a_drifting_profile():
    errors = F["vllm_metrics_check"](AFTER, speculative=True, profile={"kv_cache_dtype": "fp8"})
    assert len(errors) == 4
    assert errors[-1] == "cache_config_info cache_dtype is 'auto', profile kv_cache_dtype expects 'fp8'"


def test_readback_of_the_fp8_h200_page():
    assert F["vllm_metrics_readback"](H200_FP8, {"kv_cache_dtype": "fp8"}) == []
    drifts = F["vllm_metrics_readback"](H200_FP8, {"kv_cache_dtype": "auto", "calculate_kv_scales": True},
                                        skip=[{"flag": "--calculate-kv-scales", "reason": "removed"}])
    assert [(d["label"], d["expected"], d["actual"]) for d in drifts] == [("cache_dtype", "auto", "fp8")]


def test_findings_on_real_scrapes():
    assert F["vllm_metrics_findings"](IDLE, AFTER) == []  # no change worth a finding
    found = F["vllm_metrics_findings"](F["vllm_metrics_facts"](IDLE), preempted(AFTER, 6))
    assert [f["id"] for f in found] == ["preemptions_growing"]
    assert F["vllm_metrics_findings"](IDLE, preempted(AFTER, 6), max_preemption_increase="10") == []
    assert F["vllm_metrics_findings"](None, preempted(AFTER, 6)) == []  # growth needs two scrapes


def test_kv_error_and_required():
    assert F["vllm_metrics_kv_error"](H200_FP8, 219712) == 0.0
    assert F["vllm_metrics_kv_error"](H200_FP8, None) is None
    assert "vllm:spec_decode_num_draft_tokens" in F["vllm_metrics_required"](True)
    assert "vllm:spec_decode_num_draft_tokens" not in F["vllm_metrics_required"](False)


def test_verify_result_and_report_filters():
    probes = {"health": {"ok": True, "already_up": True}, "version": {"status": 200, "json": {"version": "0.32.0"}},
              "models": {"status": 200, "json": MODELS}, "smoke": {"status": 200, "json": CHAT, "elapsed": 0},
              "metrics_before": {"status": 200, "content": IDLE}, "metrics_after": {"status": 200, "content": AFTER}}
    expect = {"vllm_version": "0.32.0", "served_model_name": "tiny", "profile": None, "plan": None,
              "latency_budget_s": 10}
    entry = F["vllm_verify_result"](probes, "lab-1", expect, {"min_prefix_queries": 100})
    assert entry["ok"] and entry["host"] == "lab-1"
    frag = F["vllm_report_fragment"](entry, "lab-1", "verify")
    assert F["vllm_report_fragment_name"](frag).endswith("--lab-1--verify.json")
    merged = F["vllm_report_merge"]([frag], "run-1")
    assert merged["summary"]["ok"] == ["lab-1"]
    assert F["vllm_report_markdown"](merged).startswith("# vLLM rollout report: run-1")
    verdict = F["vllm_verify_unit_verdict"]("ActiveState=active\nSubState=running\nNRestarts=0\n", "vllm@main.service")
    assert verdict["error"] == "" and verdict["restarts"] == 0


# ------------------------------------------------------------------------------------------------
# Bad values: AnsibleFilterError that names them
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: F["vllm_metrics_facts"](None), "expects the text of a /metrics page, got NoneType None"),
        (lambda: F["vllm_metrics_facts"]({"status": 200}), "got dict {'status': 200}"),
        (lambda: F["vllm_metrics_facts"]("<html>502 Bad Gateway</html>"),
         "not a Prometheus text exposition: invalid metric name:<html>502 Bad Gateway</html>"),
        (lambda: F["vllm_metrics_check"](42), "expects /metrics text or the output of vllm_metrics_facts, got int 42"),
        (lambda: F["vllm_metrics_check"]({"counters": {}}), "expected metrics facts"),
        (lambda: F["vllm_metrics_check"](AFTER, profile="fp8"), "profile must be a dict, got str 'fp8'"),
        (lambda: F["vllm_metrics_check"](AFTER, skip="--kv-cache-dtype"), "skip must be a list of keys or flags, got '--kv-cache-dtype'"),
        (lambda: F["vllm_metrics_readback"](AFTER, None), "needs the effective profile dict, got None"),
        (lambda: F["vllm_metrics_findings"](IDLE, AFTER, min_hit_rate=0.5), "unknown threshold 'min_hit_rate'"),
        (lambda: F["vllm_metrics_findings"](IDLE, AFTER, min_acceptance_rate="high"),
         "threshold min_acceptance_rate must be a number, got 'high'"),
        (lambda: F["vllm_metrics_findings"](IDLE, AFTER, max_preemption_increase=True),
         "threshold max_preemption_increase must be a number, got True"),
        (lambda: F["vllm_metrics_findings"](IDLE, ["not", "facts"]), "vllm_metrics_findings (after) expects"),
        (lambda: F["vllm_metrics_kv_error"](H200_FP8, "lots"), "predicted_tokens must be a number, got 'lots'"),
        (lambda: F["vllm_verify_result"]([], "h", {}), "probes must be a dict, got []"),
        (lambda: F["vllm_verify_result"]({}, "", {}), "host must be a name, got ''"),
        (lambda: F["vllm_verify_unit_verdict"](None, "u"), "expects the stdout of systemctl show, got None"),
        (lambda: F["vllm_verify_unit_verdict"]("", "u", -1), "max_restarts must be 0 or more, got -1"),
        (lambda: F["vllm_report_fragment"]({}, "h", "../x"), "kind must be a word"),
        (lambda: F["vllm_report_fragment_name"]({"host": "h"}), "expects the output of vllm_report_fragment"),
        (lambda: F["vllm_report_merge"]("hosts/"), "expects a list of fragments, got 'hosts/'"),
        (lambda: F["vllm_report_merge"]([{"host": "h"}]), "not a report fragment: {'host': 'h'}"),
        (lambda: F["vllm_report_markdown"]([]), "expects the output of vllm_report_merge, got []"),
    ],
)
def test_bad_values_are_named(call, message):
    with pytest.raises(AnsibleFilterError) as err:
        call()
    assert message in str(err.value)


def test_long_bad_values_are_shortened():
    with pytest.raises(AnsibleFilterError) as err:
        F["vllm_metrics_check"](AFTER, profile=["x" * 500])
    assert len(str(err.value)) < 300 and "..." in str(err.value)


def test_a_missing_library_is_explained(monkeypatch):
    monkeypatch.setattr(plugin, "_IMPORT_ERROR", ImportError("No module named 'vllm_fleet'"))
    with pytest.raises(AnsibleFilterError, match=r"needs the vllm_fleet package .* `pip install -e \.`"):
        F["vllm_metrics_facts"](AFTER)
