"""vllm_fleet.metrics on REAL /metrics pages (tests/unit/fixtures/vllm/, verbatim copies).

Every variant below is derived in code from a real page: a family removed, a counter moved. Nothing is
hand-typed exposition text except the three speculative-decoding counters, which no recorded page has
(the recorded servers ran without speculation); those lines copy the format of the real counters.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from conftest import VLLM_FIXTURES as FIX
from conftest import fixture_text
from vllm_fleet import metrics
from vllm_fleet.metrics import MetricsParseError

SHARED = Path("/work/shared/fixtures/vllm")
CPU_IDLE = fixture_text("vllm", "0.32.0-cpu", "metrics_idle.txt")
CPU_AFTER = fixture_text("vllm", "0.32.0-cpu", "metrics_after_20_requests.txt")
H200_AUTO = fixture_text("vllm", "0.26.0-cuda-h200", "metrics_after_bench.txt")
H200_FP8 = fixture_text("vllm", "0.26.0-cuda-h200", "metrics_fp8_kv_after_bench.txt")
REAL = {"0.32-cpu-idle": CPU_IDLE, "0.32-cpu-after": CPU_AFTER, "0.26-h200-auto": H200_AUTO, "0.26-h200-fp8": H200_FP8}


def drop_family(text: str, family: str) -> str:
    """The real text without one family: its HELP/TYPE lines and its samples (counters' _total and
    _created, histograms' _bucket/_count/_sum)."""
    pattern = re.compile(r"^(# (HELP|TYPE) )?%s(_total|_created|_bucket|_count|_sum)?[ {]" % re.escape(family))
    out = "".join(line for line in text.splitlines(keepends=True) if not pattern.match(line))
    assert out != text, "%s not in the text" % family
    return out


def set_sample(text: str, sample: str, value: float) -> str:
    """The real text with the value of one sample (a name, e.g. vllm:num_preemptions_total) changed."""
    out, n = re.subn(r"(?m)^(%s\{[^}]*\}) \S+$" % re.escape(sample), r"\g<1> %r" % float(value), text)
    assert n == 1, "%s: %d samples" % (sample, n)
    return out


def with_spec_counters(text: str, drafts: float, draft_tokens: float, accepted: float) -> str:
    """Append the three speculative-decoding counters in the exposition format of the real counters."""
    lines = []
    for name, value in (
        ("vllm:spec_decode_num_drafts", drafts),
        ("vllm:spec_decode_num_draft_tokens", draft_tokens),
        ("vllm:spec_decode_num_accepted_tokens", accepted),
    ):
        lines += [
            "# HELP %s_total Speculative decoding counter." % name,
            "# TYPE %s_total counter" % name,
            '%s_total{engine="0",model_name="tiny"} %r' % (name, float(value)),
        ]
    return text + "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------
# The fixtures are the real files
# ------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared fixtures are not on this machine")
def test_fixture_copies_are_verbatim():
    for path in sorted(p for p in FIX.rglob("*") if p.is_file() and p.name != "README.md"):
        original = SHARED / path.relative_to(FIX)
        assert path.read_bytes() == original.read_bytes(), path


# ------------------------------------------------------------------------------------------------
# Parsing
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_pages_parse_and_pass_the_family_check(name):
    facts = metrics.parse(REAL[name])
    assert metrics.check_families(facts, speculative=False) == []
    assert facts.families["vllm:num_preemptions"] == "counter"
    assert facts.families["vllm:iteration_tokens_total"] == "histogram"
    assert facts.engines == ["0"]
    json.dumps(facts.as_dict(), allow_nan=False)  # a fact Ansible can carry


def test_counter_totals_sum_every_series():
    facts = metrics.parse(CPU_AFTER)
    assert facts.counters["vllm:request_success"] == 20.0  # finished_reason=length 20, the others 0
    assert facts.counters["vllm:prompt_tokens"] == 1225.0
    assert facts.counters["vllm:prefix_cache_queries"] == 1225.0
    assert facts.counters["vllm:prefix_cache_hits"] == 512.0
    assert facts.counters["vllm:generation_tokens"] == 280.0
    assert facts.model_names == ["tiny"]


def test_gauges():
    facts = metrics.parse(CPU_AFTER)
    assert facts.gauges["vllm:num_requests_running"] == {"sum": 0.0, "max": 0.0, "series": 1}
    assert facts.gauges["vllm:engine_sleep_state"]["series"] == 3


def test_histogram_count_sum_and_quantiles_from_buckets():
    ttft = metrics.parse(CPU_AFTER).histograms["vllm:time_to_first_token_seconds"]
    assert ttft["count"] == 20.0
    assert ttft["sum"] == pytest.approx(0.12794995307922363)
    assert ttft["mean"] == pytest.approx(0.12794995307922363 / 20)
    # buckets le=0.005: 7, le=0.01: 19, le=0.02: 20 -> p50 rank 10 lies in (0.005, 0.01]
    assert ttft["p50"] == pytest.approx(0.005 + 0.005 * 3 / 12)
    assert ttft["p99"] == pytest.approx(0.01 + 0.01 * 0.8)
    assert ttft["buckets"][-1] == ["+Inf", 20.0]


def test_histogram_quantile_edges():
    assert metrics.histogram_quantile(0.5, [["1", 0], ["+Inf", 0]]) is None
    assert metrics.histogram_quantile(0.99, [["1", 1], ["2", 1], ["+Inf", 10]]) == 2.0  # rank in +Inf
    assert metrics.histogram_quantile(0.5, [["1", 1]]) is None  # no +Inf bucket
    with pytest.raises(ValueError):
        metrics.histogram_quantile(1.5, [["+Inf", 1]])
    idle = metrics.parse(CPU_IDLE).histograms["vllm:e2e_request_latency_seconds"]
    assert idle["count"] == 0 and idle["p50"] is None and idle["mean"] is None


def test_cache_config_info_labels_are_typed():
    cpu = metrics.parse(CPU_AFTER).cache_config
    assert cpu["block_size"] == 128
    assert cpu["cache_dtype"] == "auto"
    assert cpu["enable_prefix_caching"] is True
    assert cpu["gpu_memory_utilization"] == 0.92
    assert cpu["kv_cache_size_tokens"] == 2097152
    assert cpu["kv_cache_max_concurrency"] == 4096.0
    assert cpu["num_gpu_blocks_override"] is None
    assert cpu["kv_cache_dtype_skip_layers"] == []
    h200 = metrics.parse(H200_AUTO).cache_config
    assert h200["block_size"] == 16
    assert h200["kv_cache_memory_bytes"] is None
    assert h200["num_gpu_blocks"] == 132215


def test_the_h200_fp8_page_reads_back_as_fp8():
    facts = metrics.parse(H200_FP8)
    assert facts.cache_config["cache_dtype"] == "fp8"
    assert facts.cache_config["kv_cache_memory_bytes"] == 6300000000
    assert facts.cache_config["kv_cache_size_tokens"] == 219712
    assert metrics.readback(facts, {"kv_cache_dtype": "fp8"}) == []
    assert metrics.readback(facts, {"kv_cache_dtype": "fp8_e4m3"}) == []  # vLLM's alias of fp8 on NVIDIA
    assert metrics.readback(metrics.parse(H200_AUTO), {"kv_cache_dtype": "auto"}) == []


@pytest.mark.parametrize("bad", ["<html><body>502 Bad Gateway</body></html>", 'vllm:x{a="1" 3'])
def test_not_prometheus_text_is_an_error(bad):
    with pytest.raises(MetricsParseError, match="not a Prometheus text exposition"):
        metrics.parse(bad)


def test_parse_wants_text():
    with pytest.raises(MetricsParseError, match="must be a string"):
        metrics.parse(b"vllm:x 1")  # type: ignore[arg-type]


def test_facts_round_trip_through_a_dict():
    facts = metrics.parse(H200_FP8)
    again = metrics.MetricsFacts.from_dict(json.loads(json.dumps(facts.as_dict())))
    assert again == facts
    with pytest.raises(TypeError, match="expected metrics facts"):
        metrics.MetricsFacts.from_dict({"counters": {}})


# ------------------------------------------------------------------------------------------------
# Required families
# ------------------------------------------------------------------------------------------------


def _defined(version: str) -> dict[str, str]:
    rows = (FIX / version / "metrics_defined.tsv").read_text().splitlines()
    return {row.split("\t")[0]: row.split("\t")[1] for row in rows if row.strip()}


@pytest.mark.parametrize("version", ["0.32.0-cpu", "0.33.0"])
def test_required_families_exist_in_0_32_and_0_33(version):
    """Every required family is defined, with that type, in both releases' sources.

    cache_config_info and the spec_decode counters are built outside the simple definitions that
    metrics_defined.tsv lists; cache_config_info is checked on the real pages instead."""
    defined = _defined(version)
    for name, kind in metrics.required_families(speculative=False).items():
        if name == metrics.CACHE_CONFIG_INFO:
            continue
        assert defined.get(name) == kind, "%s (%s) not defined by %s" % (name, kind, version)


def test_no_old_names_are_required():
    old = (
        "gpu_cache_usage_perc",
        "gpu_prefix_cache",
        "time_per_output_token_seconds",
        "num_running_seqs",
        "spec_decode_draft_acceptance_rate",
    )
    for name in metrics.required_families(speculative=True):
        assert not any(o in name for o in old), name


@pytest.mark.parametrize("family", sorted(metrics.required_families(speculative=False)))
def test_a_missing_required_family_fails(family):
    text = drop_family(CPU_AFTER, family)
    errors = metrics.check_families(metrics.parse(text), speculative=False)
    assert errors == [
        "required metric family %s (%s) is missing from /metrics" % (family, metrics.required_families()[family])
    ]


def test_a_family_with_another_type_fails():
    text = CPU_AFTER.replace("# TYPE vllm:kv_cache_usage_perc gauge", "# TYPE vllm:kv_cache_usage_perc untyped")
    assert metrics.check_families(metrics.parse(text)) == [
        "metric family vllm:kv_cache_usage_perc is a unknown, expected a gauge"
    ]


def test_speculative_families_only_when_speculation_is_on():
    plain = metrics.parse(CPU_AFTER)
    assert metrics.check_families(plain, speculative=False) == []
    errors = metrics.check_families(plain, speculative=True)
    assert len(errors) == 3
    assert all("speculative decoding is on" in e for e in errors)
    assert "vllm:spec_decode_num_accepted_tokens" in errors[-1]
    spec = metrics.parse(with_spec_counters(CPU_AFTER, 10, 50, 40))
    assert metrics.check_families(spec, speculative=True) == []


def test_is_speculative_reads_profiles_and_arguments():
    from vllm_fleet import profiles

    shipped = profiles.shipped()
    assert metrics.is_speculative(shipped["rtx4090-7b-decode"]["settings"]) is True
    assert metrics.is_speculative(shipped["rtx4090-7b-prefill"]["settings"]) is False
    assert metrics.is_speculative({"speculative": None}) is False
    assert metrics.is_speculative({"speculative_config": "{}"}) is False
    assert metrics.is_speculative({}, ["model", "--speculative-config", '{"method":"ngram"}']) is True
    assert metrics.is_speculative({}, ["--speculative-model", "Qwen/Qwen2.5-0.5B-Instruct"]) is True
    assert metrics.is_speculative(None, ["--max-num-seqs", "64"]) is False


# ------------------------------------------------------------------------------------------------
# Read-back
# ------------------------------------------------------------------------------------------------


def test_readback_of_the_cpu_page_against_a_matching_profile():
    profile = {
        "model": "lab/tiny-qwen2",
        "kv_cache_dtype": "auto",
        "enable_prefix_caching": True,
        "gpu_memory_utilization": 0.92,
        "max_num_seqs": 8,
    }
    assert metrics.readback(metrics.parse(CPU_AFTER), profile) == []
    assert metrics.readback(metrics.parse(CPU_AFTER), {"model": "x"}) == []  # nothing comparable asked


def test_readback_names_label_expected_and_actual():
    profile = {"kv_cache_dtype": "fp8", "enable_prefix_caching": False, "gpu_memory_utilization": 0.9, "block_size": 16}
    drifts = metrics.readback(metrics.parse(CPU_AFTER), profile)
    assert [(d["label"], d["expected"], d["actual"]) for d in drifts] == [
        ("block_size", 16, 128),
        ("enable_prefix_caching", False, True),
        ("gpu_memory_utilization", 0.9, 0.92),
        ("cache_dtype", "fp8", "auto"),
    ]
    assert drifts[3]["message"] == "cache_config_info cache_dtype is 'auto', profile kv_cache_dtype expects 'fp8'"
    for d in drifts:
        assert d["label"] in d["message"] and repr(d["actual"]) in d["message"]


def test_readback_fp8_page_against_an_auto_profile_drifts():
    drifts = metrics.readback(metrics.parse(H200_FP8), {"kv_cache_dtype": "auto"})
    assert drifts[0]["message"] == "cache_config_info cache_dtype is 'fp8', profile kv_cache_dtype expects 'auto'"
    assert metrics.readback(metrics.parse(H200_FP8), {"kv_cache_dtype": "fp8_e5m2"})[0]["actual"] == "fp8"
    # auto = not quantized: an explicit bfloat16 KV cache is what auto gives a bf16 model
    assert (
        metrics.readback(
            metrics.parse(CPU_AFTER.replace('cache_dtype="auto"', 'cache_dtype="bfloat16"')), {"kv_cache_dtype": "auto"}
        )
        == []
    )


def test_readback_of_sizes_set_by_extra_args():
    fp8 = metrics.parse(H200_FP8)
    assert metrics.readback(fp8, {"kv_cache_memory_bytes": 6300000000, "block_size": 16}) == []
    assert metrics.readback(fp8, {"kv_cache_memory_bytes": 4 << 30})[0]["label"] == "kv_cache_memory_bytes"
    assert metrics.readback(fp8, {"num_gpu_blocks_override": 20})[0]["actual"] is None


def test_readback_skips_dropped_flags_and_unset_keys():
    facts = metrics.parse(CPU_AFTER)
    assert metrics.readback(facts, {"kv_cache_dtype": "fp8"}, skip=["--kv-cache-dtype"]) == []
    assert metrics.readback(facts, {"enable_prefix_caching": False}, skip=["--no-enable-prefix-caching"]) == []
    assert metrics.readback(facts, {"kv_cache_dtype": None, "block_size": None}) == []
    assert metrics.readback(facts, {"enable_prefix_caching": "true"}) == []  # YAML-ish spellings


def test_readback_without_cache_config_info_is_a_drift():
    facts = metrics.parse(drop_family(CPU_AFTER, metrics.CACHE_CONFIG_INFO))
    drifts = metrics.readback(facts, {"kv_cache_dtype": "auto"})
    assert drifts[0]["message"] == "vllm:cache_config_info is missing from /metrics: cannot read back kv_cache_dtype"


def test_check_combines_families_and_readback():
    facts = metrics.parse(drop_family(CPU_AFTER, "vllm:num_preemptions"))
    errors = metrics.check(facts, speculative=False, expected={"gpu_memory_utilization": 0.9})
    assert errors == [
        "required metric family vllm:num_preemptions (counter) is missing from /metrics",
        "cache_config_info gpu_memory_utilization is 0.92, profile gpu_memory_utilization expects 0.9",
    ]


def test_kv_prediction_error_in_percent():
    fp8 = metrics.parse(H200_FP8)  # 219712 tokens
    assert metrics.kv_prediction_error(219712, fp8) == 0.0
    assert metrics.kv_prediction_error(200000, fp8) == pytest.approx(-8.97, abs=0.01)
    assert metrics.kv_prediction_error(2115440 * 1.1, metrics.parse(H200_AUTO)) == pytest.approx(10.0)
    assert metrics.kv_prediction_error(None, fp8) is None
    assert metrics.kv_prediction_error("many", fp8) is None
    assert metrics.kv_prediction_error(1000, metrics.parse(drop_family(CPU_AFTER, metrics.CACHE_CONFIG_INFO))) is None


# ------------------------------------------------------------------------------------------------
# Findings
# ------------------------------------------------------------------------------------------------


def test_the_real_idle_to_after_pair_has_no_finding():
    before, after = metrics.parse(CPU_IDLE), metrics.parse(CPU_AFTER)
    assert metrics.findings(before, after) == []
    r = metrics.rates(before, after)
    assert r["prefix_cache_hit_rate"] == pytest.approx(512 / 1225, abs=1e-4)
    assert r["prefix_cache_basis"] == "window"
    assert r["preemptions_increase"] == 0.0
    assert r["spec_acceptance_basis"] == "not exported"


def test_preemptions_growing_between_two_scrapes():
    after = metrics.parse(set_sample(CPU_AFTER, "vllm:num_preemptions_total", 3))
    found = metrics.findings(metrics.parse(CPU_IDLE), after)
    assert [f["id"] for f in found] == ["preemptions_growing"]
    assert found[0]["value"] == 3.0
    assert "preemptions grew by 3" in found[0]["message"]
    assert "max_num_seqs" in found[0]["advice"]
    assert metrics.findings(metrics.parse(CPU_IDLE), after, max_preemption_increase=5) == []


def test_preemptions_after_a_restart_count_from_zero():
    before = metrics.parse(set_sample(CPU_AFTER, "vllm:num_preemptions_total", 40))
    after = metrics.parse(set_sample(CPU_AFTER, "vllm:num_preemptions_total", 2))  # counter reset
    assert metrics.rates(before, after)["preemptions_increase"] == 2.0
    assert [f["id"] for f in metrics.findings(before, after)] == ["preemptions_growing"]


def test_preemption_growth_needs_two_scrapes():
    after = metrics.parse(set_sample(CPU_AFTER, "vllm:num_preemptions_total", 3))
    assert metrics.findings(None, after) == []


def test_prefix_hit_rate_low_with_traffic_in_the_window():
    after = metrics.parse(set_sample(CPU_AFTER, "vllm:prefix_cache_hits_total", 100))  # 100 / 1225 = 8 %
    found = metrics.findings(metrics.parse(CPU_IDLE), after)
    assert [f["id"] for f in found] == ["prefix_hit_rate_low"]
    assert found[0]["basis"] == "window"
    assert found[0]["value"] == pytest.approx(100 / 1225, abs=1e-4)
    assert "8% is below 30%" in found[0]["message"]


def test_prefix_hit_rate_without_traffic_is_no_finding():
    after = metrics.parse(set_sample(CPU_AFTER, "vllm:prefix_cache_hits_total", 100))
    assert metrics.findings(metrics.parse(CPU_IDLE), after, min_prefix_queries=5000) == []
    assert metrics.rates(metrics.parse(CPU_IDLE), after, min_prefix_queries=5000)["prefix_cache_basis"] == (
        "too little traffic"
    )


def test_prefix_hit_rate_on_the_real_h200_benchmark_since_start():
    # The benchmark's random prompts: under 1 % of the queried tokens hit. A real finding.
    facts = metrics.parse(H200_AUTO)
    rate = facts.counters["vllm:prefix_cache_hits"] / facts.counters["vllm:prefix_cache_queries"]
    assert rate < 0.01
    found = metrics.findings(None, facts)
    assert [f["id"] for f in found] == ["prefix_hit_rate_low"]
    assert found[0]["basis"] == "since start" and found[0]["value"] == pytest.approx(rate, abs=1e-4)


def test_a_quiet_window_falls_back_to_totals_since_start():
    h200 = metrics.parse(H200_AUTO)
    found = metrics.findings(h200, h200)  # two scrapes, nothing in between
    assert [(f["id"], f["basis"]) for f in found] == [("prefix_hit_rate_low", "since start")]


def test_prefix_finding_needs_prefix_caching_on():
    text = H200_AUTO.replace('enable_prefix_caching="True"', 'enable_prefix_caching="False"')
    assert metrics.findings(None, metrics.parse(text)) == []


def test_speculative_acceptance_below_threshold():
    before = metrics.parse(with_spec_counters(CPU_IDLE, 0, 0, 0))
    low = metrics.parse(with_spec_counters(CPU_AFTER, 100, 500, 200))
    found = metrics.findings(before, low)
    assert [f["id"] for f in found] == ["spec_acceptance_low"]
    assert found[0]["value"] == 0.4 and found[0]["threshold"] == 0.6
    good = metrics.parse(with_spec_counters(CPU_AFTER, 100, 500, 400))
    assert metrics.findings(before, good) == []
    assert [f["id"] for f in metrics.findings(before, good, min_acceptance_rate=0.9)] == ["spec_acceptance_low"]
    too_few = metrics.parse(with_spec_counters(CPU_AFTER, 10, 50, 5))
    assert metrics.findings(before, too_few) == []


def test_window_latencies_of_the_real_pair():
    lat = metrics.window_latencies(metrics.parse(CPU_IDLE), metrics.parse(CPU_AFTER))
    assert lat["requests"] == 20.0
    assert lat["e2e_s"] == pytest.approx(0.5819985866546631 / 20, abs=1e-6)
    assert lat["ttft_s"] == pytest.approx(0.12794995307922363 / 20, abs=1e-6)
    quiet = metrics.window_latencies(metrics.parse(CPU_AFTER), metrics.parse(CPU_AFTER))
    assert quiet["requests"] == 0.0 and quiet["e2e_s"] is None


def test_defaults_are_documented_numbers():
    assert metrics.DEFAULTS == {
        "min_acceptance_rate": 0.6,
        "min_draft_tokens": 100,
        "min_prefix_hit_rate": 0.30,
        "min_prefix_queries": 1000,
        "max_preemption_increase": 0,
    }
    assert not any(math.isnan(v) for v in metrics.DEFAULTS.values())
