"""gpu/bench/summarize.py over the committed runs (results/gpu/). A current run keeps its raw results, and its
summary.json is what summarize.py makes of them and the plan it ran with; a superseded run keeps only its plan and
its summary (made by the same summarize.py before its raw results left the tree). The findings of each run hold."""

from __future__ import annotations

import json

from gpu_modules import ROOT, plan_mod
from gpu_modules import load as _load

GPU_RUNS = ROOT / "results" / "gpu"
# Runs 1 to 5 (2026-11-29) are superseded by runs 6 to 9 (docs/gpu-results.md); their raw results are in the
# project's history, not in the tree.
SUPERSEDED = (
    "2026-11-29-run1-hopper-kernels",
    "2026-11-29-run2-ada-emulation",
    "2026-11-29-run3-l40-comparison",
    "2026-11-29-run4-rtx4090-bf16",
    "2026-11-29-run5-jit-cache",
)


def committed_run(name):
    """A current run (results/gpu/<name>): summarize.py, its folder, the plan it ran with, and the summary that
    summarize.py makes of its results, asserted equal to the committed summary.json."""
    summarize = _load("summarize")
    folder = GPU_RUNS / name
    plan = json.loads((folder / "experiments.json").read_text())
    summary = summarize.summarise(plan, summarize.load_results(folder))
    assert json.loads(json.dumps(summary)) == json.loads((folder / "summary.json").read_text())
    return summarize, folder, plan, summary


def superseded_run(name):
    """A superseded run: summarize.py, the plan it ran with and its committed summary.json."""
    folder = GPU_RUNS / name
    return (
        _load("summarize"),
        json.loads((folder / "experiments.json").read_text()),
        json.loads((folder / "summary.json").read_text()),
    )


def test_every_run_is_current_or_superseded():
    """A current run carries its raw results (results-roundN.json, raw-roundN.tar.gz); a superseded one only its
    plan and summary, so the tree keeps what the results page and the profiles cite and no more."""
    runs = sorted(p.name for p in GPU_RUNS.iterdir() if p.is_dir())
    assert set(SUPERSEDED) < set(runs)
    for name in runs:
        files = {p.name for p in (GPU_RUNS / name).iterdir()}
        if name in SUPERSEDED:
            assert files == {"experiments.json", "summary.json"}, name
        elif "answers-drift" in name:
            # gpu/bench/answers_drift.py's run: its plan, its measures and summary (docs/gpu-results.md, run 14).
            assert {"answers-drift.json", "answers-drift-summary.json", "answers-drift-measures.json"} <= files, name
        else:
            assert {"experiments.json", "summary.json", "results-round1.json", "raw-round1.tar.gz"} <= files, name


def test_summary_of_the_committed_gpu_results():
    """results/gpu/2026-11-29-run2-ada-emulation: all nine experiments of the plan under an emulation of the cards'
    memory and of Ada's kernel choice."""
    summarize, _plan, summary = superseded_run("2026-11-29-run2-ada-emulation")
    rows = {r["experiment"]: r for r in summary["fidelity"]}
    assert len(rows) == 8 and all(abs(r["error_budget_pct"]) < 5 for r in rows.values())
    assert rows["fid-rtx4090-7b-decode"]["engine_kv_tokens"] == 148_736
    assert rows["fid-l40-14b-awq-prefill"]["engine_source"] == "cache_config_info"
    assert [r["experiment"] for r in summary["refusals"]] == ["refuse-rtx4090-7b-decode"]
    assert "vocabulary size" in summary["refusals"][0]["vllm_said"] and summary["refusals"][0]["planner_errors_now"]
    assert [v["as_expected"] for v in summary["verification"]] == [True, True]
    assert {r["experiment"]: r["ratio_pct"] for r in summary["single_stream"]}["fid-rtx4090-7b-prefill"] == 71.0
    verdicts = {c["card"]: c["verdict"] for c in summary["comparisons"]}
    assert verdicts == {"RTX 4090": "goal not met", "L40": "not compared"}
    assert summary["not_run"] == [{"experiment": "default-l40-14b-awq", "action": "guide-128u", "reason": "call time"}]
    assert "| fid-rtx4090-7b-prefill | guide-64u | 192 |" in summarize.tables(summary)


def test_summary_of_run_3():
    """results/gpu/2026-11-29-run3-l40-comparison: the L40 pair in one run (goal met), the same KV sizes as the second
    run, and the bf16 4090 start that the old 300 s bound cut off, its KV size read from the start-up log."""
    _summarize, _plan, summary = superseded_run("2026-11-29-run3-l40-comparison")
    rows = {r["experiment"]: r for r in summary["fidelity"]}
    assert all(abs(r["error_budget_pct"]) < 5 and abs(r["error_card_pct"]) < 5 for r in rows.values())
    second = {
        r["experiment"]: r["engine_kv_tokens"] for r in superseded_run("2026-11-29-run2-ada-emulation")[2]["fidelity"]
    }
    repeated = [name for name in rows if rows[name]["engine_source"] == "cache_config_info"]
    assert len(repeated) == 6 and all(rows[n]["engine_kv_tokens"] == second[n] for n in repeated)
    bf16 = rows["fid-rtx4090-7b-prefill"]
    assert (bf16["engine_source"], bf16["engine_kv_tokens"], bf16["planner_card_tokens"]) == (
        "start-up log",
        118_624,
        119_744,
    )
    (l40,) = [c for c in summary["comparisons"] if c["card"] == "L40"]
    assert l40["verdict"] == "goal met" and all(l40["checks"].values()) and l40["preemptions"] == [0.0, 40.0]
    # What never served is listed, and the comparison it leaves open says why.
    assert [(n["experiment"], n["action"]) for n in summary["not_run"]] == [("default-rtx4090-7b", "start")]
    (rtx,) = [c for c in summary["comparisons"] if c["card"] == "RTX 4090"]
    assert rtx["verdict"] == "not compared" and "default-rtx4090-7b start" in rtx["why"]
    assert [v["as_expected"] for v in summary["verification"]] == [True, True]


def test_summary_of_run_4():
    """results/gpu/2026-11-29-run4-rtx4090-bf16: the 4090 with a bf16 KV cache (now the shipped rtx4090-7b-prefill)
    against vLLM's defaults and against the tuning reference's fp8 cache, in one run with one tool; the JIT cache kept
    between starts."""
    _summarize, _plan, summary = superseded_run("2026-11-29-run4-rtx4090-bf16")
    verdicts = {c["tuned"]: c["verdict"] for c in summary["comparisons"] if c["card"] == "RTX 4090"}
    assert verdicts == {"cand-rtx4090-7b-prefill-kv-auto": "goal met", "fid-rtx4090-7b-prefill": "goal not met"}
    rows = {r["experiment"]: r for r in summary["fidelity"]}
    bf16 = rows["cand-rtx4090-7b-prefill-kv-auto"]
    assert (bf16["engine_kv_tokens"], bf16["planner_card_tokens"]) == (118_624, 119_744)  # run 3's, again
    assert rows["fid-rtx4090-7b-prefill"]["engine_kv_tokens"] == 236_080
    # the defaults ran twice: the second start found vLLM's compile cache and sized a larger KV cache; the
    # planner predicts a first start, so fidelity is the first one's and the warm restart is shown beside it
    (repeat,) = summary["repeats"]
    assert (repeat["experiment"], repeat["round"], repeat["engine_kv_tokens"], repeat["compile_cache"]) == (
        "default-rtx4090-7b",
        2,
        120_160,
        "cold",
    )
    default = rows["default-rtx4090-7b"]
    assert (default["round"], default["engine_kv_tokens"], default["compile_cache"]) == (2, 120_160, "cold")
    assert default["memory"]["usage_activation_gib"] == 1.04 and abs(default["error_card_pct"]) < 5
    # summarize.py keeps a warm restart only for a start whose log says it loaded vLLM's compiled graph
    warm = default["warm_restart"]
    assert {k: warm[k] for k in ("round", "start_s", "engine_kv_tokens", "error_card_pct")} == {
        "round": 4,
        "start_s": 252.1,
        "engine_kv_tokens": 134_256,
        "error_card_pct": -9.52,
    }
    # the loads compared are the restart's, the run that served them
    assert [c["p99_itl_ms"][1] for c in summary["comparisons"] if c["card"] == "RTX 4090"] == [56.031] * 2
    # the driver's JIT cache: filled by the first bf16 start, kept for the next ones (start 102 s, not ~300 s)
    assert bf16["round"] == 1 and bf16["jit_cache_mib"] == {"before": 0.0, "after_start": 54.8}
    assert default["jit_cache_mib"] == {"before": 54.8, "after_start": 54.8} and default["start_s"] < 110
    # the warm restart's JIT cache was restored into the wrong folder: the driver compiled again (CUDA graphs 139 s)
    assert warm["jit_cache_mib"] == {"before": 0.0, "after_start": 54.8} and warm["start_s"] > 250
    assert warm["graph_capture_s"] == [139] and default["graph_capture_s"] == [5]


def test_the_carried_jit_cache_was_taken_by_the_driver():
    """results/gpu/2026-11-29-run5-jit-cache: a fresh machine, run 4's JIT cache unpacked by the harness before
    the start of vLLM's bf16 4090 defaults. The driver compiled nothing (the cache did not grow) and the FULL CUDA
    graphs took 4 s, against 139 s when it compiled (run 4, its fourth start). The start ran past the 110 s bound that
    the run's time left allowed, after sizing its cache (start-up log)."""
    _summarize, _plan, summary = superseded_run("2026-11-29-run5-jit-cache")
    (restored,) = summary["jit_cache"]
    assert restored["round"] == 1 and restored["restored"] and restored["mib"] == 123.9
    (row,) = summary["fidelity"]
    assert row["jit_cache_mib"] == {"before": 123.9, "after_start": 123.9}
    assert row["status"] == "start-timeout" and row["start_s"] == 110.1
    assert row["graph_capture_s"] == [4]
    cold = {r["experiment"]: r for r in superseded_run("2026-11-29-run4-rtx4090-bf16")[2]["fidelity"]}
    assert cold["default-rtx4090-7b"]["warm_restart"]["graph_capture_s"] == [139]
    assert (row["engine_kv_tokens"], row["engine_source"]) == (120_160, "start-up log")


def test_graph_captures_and_jit_cache_read_from_the_logs_and_rounds():
    """What summarize.py records of a start's CUDA graph captures and of the JIT cache a round unpacked."""
    summarize = _load("summarize")
    log = (
        "INFO Graph capturing finished in 4 secs, took 0.52 GiB\n"
        "INFO Graph capturing finished in 139 secs, took 0.50 GiB\n"
    )
    assert summarize.graph_captures(log) == [4, 139] and summarize.graph_captures("") == []
    records = [
        {"_round": 2, "_jit_cache": {"restored": True, "why": "earlier on this machine", "mib": 1.0}},
        {"_round": 1, "_jit_cache": {"restored": True, "seconds": 1.6, "mib": 1.0}},
        {"_round": 1, "_jit_cache": {"restored": True, "seconds": 1.6, "mib": 1.0}},
        {"_round": 3, "_jit_cache": None},
    ]
    assert summarize.jit_cache(records) == [
        {"round": 1, "restored": True, "seconds": 1.6, "mib": 1.0},
        {"round": 2, "restored": True, "why": "earlier on this machine", "mib": 1.0},
    ]


def test_summary_of_run_6():
    """results/gpu/2026-11-29-run6-whole-plan: the whole plan rerun in one run on a fresh machine with the carried JIT
    cache. Every shipped profile vLLM accepts sized its cache within 5% of the planner at its first start; both
    cards' shipped profiles met the goal against vLLM's defaults; the tuning reference's decode profile was refused
    by vLLM and by the planner; the verification passed and the wrong expectation failed."""
    summarize, folder, plan, summary = committed_run("2026-11-29-run6-whole-plan")
    results = summarize.load_results(folder)
    assert summary["vllm_version"] == "0.26.0"
    shipped = {e["name"] for e in plan["experiments"] if e["name"].startswith("fid-")}
    rows = {r["experiment"]: r for r in summary["fidelity"]}
    assert shipped <= set(rows) and not summary["not_run"]
    assert all(abs(rows[n]["error_card_pct"]) < 5 and rows[n]["compile_cache"] == "cold" for n in shipped)
    # prefix-heavy: its first start (round 2) sized its cache and ran past the start bound its round left it;
    # it was run again by hand in round 5, found vLLM's compile cache and sized 8.2% more (as in run 4)
    heavy = rows["fid-rtx4090-7b-prefix-heavy"]
    assert (heavy["round"], heavy["status"], heavy["engine_kv_tokens"], heavy["engine_source"]) == (
        2,
        "start-timeout",
        238_128,
        "start-up log",
    )
    assert heavy["warm_restart"]["engine_kv_tokens"] == 257_696 and heavy["warm_restart"]["round"] == 5
    (refusal,) = summary["refusals"]
    assert refusal["experiment"] == "refuse-rtx4090-7b-decode" and "vocab" in refusal["vllm_said"]
    assert refusal["planner_errors_now"]
    assert [(v["action"], v["as_expected"]) for v in summary["verification"]] == [
        ("verify-pass", True),
        ("verify-wrong-kv-dtype", True),
    ]
    verdicts = {c["tuned"]: c["verdict"] for c in summary["comparisons"]}
    assert verdicts == {
        "fid-rtx4090-7b-prefill": "goal met",
        "fid-l40-14b-awq-prefill": "goal met",
        "cand-rtx4090-7b-prefix-heavy-kv-auto": "goal not met",
    }
    assert {s["experiment"] for s in summary["single_stream"]} == {
        "fid-rtx4090-7b-awq",
        "fid-rtx4090-7b-prefill",
        "fid-l40-14b-awq-prefill",
    }
    # the carried JIT cache: unpacked once, and no start made the driver compile (the cache never grew)
    assert all(r["jit_cache_mib"] == {"before": 123.9, "after_start": 123.9} for r in results if "jit_cache_mib" in r)
    first = json.loads((folder / "results-round1.json").read_text())
    assert first["jit_cache"]["restored"] and "seconds" in first["jit_cache"]
    assert summary["jit_cache"][0] == dict(round=1, **first["jit_cache"]) and len(summary["jit_cache"]) == 5


def test_summary_of_run_1_is_kept():
    """Run 1 (FlashAttention 3, before the planner's rework): its summary stays readable beside its own plan."""
    summarize, _plan, summary = superseded_run("2026-11-29-run1-hopper-kernels")
    assert "| fid-rtx4090-7b-decode |" in summarize.tables(summary)
    assert {r["experiment"]: r["engine_kv_tokens"] for r in summary["fidelity"]}["fid-rtx4090-7b-decode"] == 145_776


def test_side_by_side_of_run7():
    """results/gpu/2026-12-01-run7-rtx4090-side-by-side: each configuration against the defaults of the same run on
    issue #23's five figures; none is no worse on all five."""
    summarize, _folder, _plan, summary = committed_run("2026-12-01-run7-rtx4090-side-by-side")
    rows = {r["experiment"]: r for r in summary["side_by_side"]}
    assert rows["r7-default-rtx4090-7b"]["is_defaults"] and rows["r7-default-rtx4090-7b"]["kv_cache_tokens"] == 120_160
    assert rows["r7-rtx4090-7b-prefill"]["gives_up"] == ["median TTFT"]
    assert rows["cand-rtx4090-7b-prefill-derived"]["gives_up"] == ["p99 TTFT", "mean ITL", "output throughput"]
    assert rows["r7-rtx4090-7b-prefill"]["detail"]["later"]["median_ttft_ms"] == 911.0
    assert "| r7-rtx4090-7b-prefill | RTX 4090 | 6,912.7 | 962.3 / 1,557.3 |" in summarize.tables(summary)
    # runs before 7 had no rN-default: their summaries carry no side_by_side
    assert "side_by_side" not in json.loads((ROOT / "results/gpu/2026-11-29-run6-whole-plan/summary.json").read_text())


def test_summary_of_run8():
    """results/gpu/2026-12-02-run8-side-by-side: the L40's three settings, the 4090's fourth candidate and the AWQ
    profile, each beside vLLM's defaults of the same card and model in the same run; no setting is no worse on all
    five figures, the derived L40 setting gives up one (p99 TTFT, the burst at t=0)."""
    _summarize, _folder, _plan, summary = committed_run("2026-12-02-run8-side-by-side")
    rows = {r["experiment"]: r for r in summary["side_by_side"]}
    assert set(rows) == set(plan_mod.RUN8) - {"r8-rtx4090-7b-prefix-heavy"}
    assert [n["experiment"] for n in summary["not_run"]] == ["r8-rtx4090-7b-prefix-heavy"]
    assert {n: r["defaults"] for n, r in rows.items()} == {
        **dict.fromkeys(
            ["r8-default-l40-14b-awq", "r8-l40-14b-awq-prefill", "cand-l40-14b-awq-prefill-derived"],
            "r8-default-l40-14b-awq",
        ),
        **dict.fromkeys(["r8-default-rtx4090-7b", "cand-rtx4090-7b-prefill-seqs"], "r8-default-rtx4090-7b"),
        **dict.fromkeys(["r8-default-rtx4090-7b-awq", "r8-rtx4090-7b-awq"], "r8-default-rtx4090-7b-awq"),
    }
    assert {n: r.get("gives_up") for n, r in rows.items() if not r["is_defaults"]} == {
        "r8-l40-14b-awq-prefill": ["median TTFT", "p99 TTFT"],
        "cand-l40-14b-awq-prefill-derived": ["p99 TTFT"],
        "cand-rtx4090-7b-prefill-seqs": ["median TTFT"],
        "r8-rtx4090-7b-awq": ["median TTFT", "p99 TTFT", "output throughput"],
    }
    assert rows["r8-default-l40-14b-awq"]["preemptions"] == 40 and all(
        not r["preemptions"] for n, r in rows.items() if n != "r8-default-l40-14b-awq"
    )
    # every start sized its cache within 2 % of the planner for the card
    assert all(abs(r["error_card_pct"]) < 2 for r in summary["fidelity"]) and len(summary["fidelity"]) == 7


def test_summary_of_run9():
    """results/gpu/2026-12-02-run9-rtx4090-prefix-heavy: rtx4090-7b-prefix-heavy (its fp8 settings, shipped until run
    12) beside vLLM's defaults in one round; on the reference's random prompts it gives up four of the five figures (it
    keeps the mean ITL); the derived candidate did not fit in the round."""
    _summarize, _folder, _plan, summary = committed_run("2026-12-02-run9-rtx4090-prefix-heavy")
    rows = {r["experiment"]: r for r in summary["side_by_side"]}
    assert set(rows) == {"r9-default-rtx4090-7b", "r9-rtx4090-7b-prefix-heavy"}
    assert [n["experiment"] for n in summary["not_run"]] == ["cand-rtx4090-7b-prefix-heavy-derived"]
    heavy = rows["r9-rtx4090-7b-prefix-heavy"]
    assert heavy["defaults"] == "r9-default-rtx4090-7b" and rows["r9-default-rtx4090-7b"]["is_defaults"]
    assert heavy["gives_up"] == ["median TTFT", "p99 TTFT", "p99 ITL", "output throughput"]
    assert not heavy["preemptions"] and not rows["r9-default-rtx4090-7b"]["preemptions"]
    # the same caches as the same arguments sized before (runs 2 and 8: 238,128 fp8, 120,160 bf16 tokens)
    assert {r["experiment"]: r["engine_kv_tokens"] for r in summary["fidelity"]} == {
        "r9-default-rtx4090-7b": 120_160,
        "r9-rtx4090-7b-prefix-heavy": 238_128,
    }


def test_run10_the_4090s_tune_search_finds_vllms_defaults_win_at_the_reference_targets():
    """results/gpu/2026-12-04-run10-tune-rtx4090 (docs/gpu-results.md, "Runs 10 and 11"): vLLM's defaults and three
    candidates, two repeats each; all four on the front, the defaults picked. Two repeats a side cannot separate a
    figure (the exact Mann-Whitney test's least p-value for 2 and 2 is 0.33, issue #49): every figure is level, even
    the profile's median TTFT, whose two repeats (837 and 883 ms) both lie above the defaults' (304 and 537 ms)."""
    _summarize, _folder, _plan, summary = committed_run("2026-12-04-run10-tune-rtx4090")
    t = summary["tune"]
    assert {n: f["repeats"] for n, f in t["measured"].items()} == {
        "vllm-defaults": 2,
        "tune-profile-rtx4090-7b-prefill": 2,
        "tune-derived-rtx4090-7b-prefill": 2,
        "tune-operator-1-rtx4090-7b-prefill": 2,
    }
    assert len(t["decision"]["front"]) == 4 and t["decision"]["choice"] == "vllm-defaults"
    assert {v["verdict"] for figures in t["against_defaults"].values() for v in figures.values()} == {"level"}
    ttft = t["against_defaults"]["tune-profile-rtx4090-7b-prefill"]["median_ttft_ms"]
    assert (ttft["p"], ttft["repeats"], ttft["difference_pct"]) == (0.3333, [2, 2], 104.44)
    assert "can never go below 0.333" in ttft["why"]
    assert (
        t["measured"]["tune-profile-rtx4090-7b-prefill"]["median_ttft_ms"]["low"]
        > (t["measured"]["vllm-defaults"]["median_ttft_ms"]["high"])
    )
    assert round(t["measured"]["vllm-defaults"]["output_throughput"]["median"], 1) == 6851.4


def test_run11_the_l40s_tune_search_repeats_run_8s_trade_off():
    """results/gpu/2026-12-04-run11-tune-l40: the shipped L40 profile beside vLLM's defaults, two repeats each: the
    medians are higher only on the p99 TTFT, lower (throughput higher) on the rest, but two repeats a side separate
    nothing by the exact Mann-Whitney test (p >= 0.33): level on all six; neither meets the reference's 800 ms median
    TTFT."""
    _summarize, _folder, _plan, summary = committed_run("2026-12-04-run11-tune-l40")
    t = summary["tune"]
    versus = t["against_defaults"]["tune-profile-l40-14b-awq-prefill"]
    assert {v["verdict"] for v in versus.values()} == {"level"}
    assert min(v["p"] for v in versus.values()) == 0.3333
    assert [k for k, v in versus.items() if v["difference"] > 0] == ["p99_ttft_ms", "output_throughput"]
    assert t["decision"]["choice"] is None and t["measured"]["vllm-defaults"]["preemptions"]["median"] == 62


def test_run10s_measured_profile_is_what_summarize_writes_and_the_plan_takes_it(tmp_path, capsys):
    """--measured-profile over run 10 writes the committed file: vLLM's defaults won, so its settings are the knobs
    their experiment set (256 sequences, 2,048 batched tokens, at the profile's memory share), with the run's
    provenance (the card emulated, the host's driver, vLLM 0.26.0, the model, the load, the date). The plan takes it
    whole for a 4090 host on that release and marks the profile measured; its one warning more than the shipped
    profile's is the planner's of 256 sequences at typical lengths; run 11 chose nothing, so nothing is written
    and the reason is printed."""
    import yaml

    from vllm_fleet import planner

    summarize, folder, _plan, _summary = committed_run("2026-12-04-run10-tune-rtx4090")
    out = tmp_path / "measured.yml"
    assert (
        summarize.main(["--results", str(folder), "--out", str(tmp_path / "s.json"), "--measured-profile", str(out)])
        == 0
    )
    committed = folder / "measured-profile.yml"
    assert out.read_text() == committed.read_text()
    doc = yaml.safe_load(committed.read_text())
    assert (doc["base"], doc["settings"]) == (
        "rtx4090-7b-prefill",
        {"gpu_memory_utilization": 0.92, "max_num_batched_tokens": 2048, "max_num_seqs": 256},
    )
    assert {k: doc["measured"][k] for k in ("card", "driver", "vllm_version", "date")} == {
        "card": "RTX 4090 (emulated on an H200)",
        "driver": "580.159.04",
        "vllm_version": "0.26.0",
        "date": "2026-12-04",
    }
    assert doc["measured"]["decision"]["choice"] == "vllm-defaults"
    host = {
        "vllm_profile_name": "rtx4090-7b-prefill",
        "vllm_gpu": {"name": "NVIDIA GeForce RTX 4090", "memory_mib": 24564, "bandwidth_gb_s": 1008, "count": 1},
        "vllm_version": "0.26.0",
    }
    shipped = planner.plan_host("gpu-1", host)
    taken = planner.plan_host("gpu-1", dict(host, vllm_profile_measured=doc))
    # vLLM's 256 sequences did not bind at the 64 users measured; the planner says what they would cost at more.
    assert taken["errors"] == [] and taken["warnings"] == [
        *shipped["warnings"],
        "gpu-1: the KV cache holds 121,472 tokens, less than max_num_seqs=256 requests of typical length 768 (512 "
        "prompt + 256 output) = 196,608: expect preemptions; fix: max_num_seqs <= 158, kv_cache_dtype: fp8, or a "
        "quantized model",
    ], taken
    assert (taken["profile_effective"]["max_num_seqs"], taken["profile_effective"]["max_num_batched_tokens"]) == (
        256,
        2048,
    )
    assert taken["profile_source"]["kind"] == "measured"
    capsys.readouterr()
    summarize, folder, _plan, _summary = committed_run("2026-12-04-run11-tune-l40")
    nothing = tmp_path / "l40.yml"
    assert (
        summarize.main(
            ["--results", str(folder), "--out", str(tmp_path / "s11.json"), "--measured-profile", str(nothing)]
        )
        == 1
    )
    assert not nothing.exists()
    assert "the search chose no setting (no setting measured meets the targets)" in capsys.readouterr().err


def test_summarize_writes_a_searchs_page_and_refuses_results_without_one(tmp_path, capsys):
    summarize, folder, _plan, _summary = committed_run("2026-12-04-run11-tune-l40")
    page = tmp_path / "tune.html"
    assert summarize.main(["--results", str(folder), "--out", str(tmp_path / "s.json"), "--tune-html", str(page)]) == 0
    assert page.read_text().count("<img ") == 4 and "Tune search: l40-14b-awq-prefill, 2026-12-04" in page.read_text()
    capsys.readouterr()
    summarize, folder, _plan, _summary = committed_run("2026-12-02-run9-rtx4090-prefix-heavy")
    other = tmp_path / "none.html"
    assert (
        summarize.main(["--results", str(folder), "--out", str(tmp_path / "s9.json"), "--tune-html", str(other)]) == 1
    )
    assert not other.exists() and "these results hold no tune search" in capsys.readouterr().err


def test_run12_the_prefix_heavy_profile_under_the_shared_prefix_traffic_it_is_named_for():
    """Run 12 (an H200 host, 2026-12-04): the prefix-heavy search with vllm bench serve's prefix_repetition load.
    Every setting's prefix cache hit about 72 % of the prompt tokens (768 of 1,024 shared, the first request of each
    prefix missing); the settings shipped then (fp8 cache) give up three figures and win the p99 ITL; the same
    settings with a bf16 cache are the choice (shipped since) and take vLLM's defaults off the front. Two repeats a
    side separate no figure by the exact Mann-Whitney test (issue #49): against vLLM's defaults every figure of both
    is level, and the medians' differences are kept (the fp8 cache's output throughput 9.67 % lower)."""
    _summarize, _folder, plan, summary = committed_run("2026-12-04-run12-tune-rtx4090-prefix-shared")
    assert plan["tune"]["load"]["bench"]["dataset_name"] == "prefix_repetition"
    search = summary["tune"]
    for name, figures in search["measured"].items():
        assert figures["repeats"] == 2 and figures["failed"] == 0, name
        assert 0.71 < figures["prefix_hit_rate"]["low"] <= figures["prefix_hit_rate"]["high"] < 0.73, name
    bf16, fp8 = "tune-operator-1-rtx4090-7b-prefix-heavy", "tune-profile-rtx4090-7b-prefix-heavy"
    decision = search["decision"]
    assert decision["choice"] == bf16 and "vllm-defaults" not in decision["front"]
    for name in (bf16, fp8):
        assert {v["verdict"] for v in search["against_defaults"][name].values()} == {"level"}, name
    assert search["against_defaults"][fp8]["output_throughput"]["difference_pct"] == -9.67
    assert decision["verdict"].endswith("is worse on no figure by the exact two-sided Mann-Whitney U test at p < 0.05")
    assert plan["experiments"][3]["settings"]["kv_cache_dtype"] == "auto"
    assert "calculate_kv_scales" not in plan["experiments"][3]["settings"]


def test_run13_the_prefix_heavy_rerun_separates_a_trade_off_and_the_planner_holds_on_warm_restarts():
    """Run 13 (an H100 host, 2026-12-06): run 12's search rerun with five interleaved repeats a side (the two servers
    side by side, their loads alternated), vLLM's defaults against the profile as shipped since run 12 (bf16 cache,
    4,096 batched tokens, 64 sequences). By the exact Mann-Whitney test the profile is worse on the median TTFT
    (+49 %), better on both ITLs (p99 -54 %), level on the throughput and the p99 TTFT: run 12's "no worse on any of
    the five figures" does not hold. Each setting was started again alone after its loads: with vLLM's compile cache
    warm it sized 11.8 % and 8.2 % more KV cache than at its first start, and the planner's warm-restart prediction is
    within 2 % of both (its first-start one within 2 % of the first starts)."""
    _summarize, _folder, plan, summary = committed_run("2026-12-06-run13-tune-prefix-heavy-h100")
    assert plan["host_gpu"]["name"] == "H100" and plan["tune"]["repeats"] == 5
    assert {e["interleave"] for e in plan["experiments"]} == {"tune-rtx4090-7b-prefix-heavy-shared-prefix"}
    search = summary["tune"]
    profile = "tune-profile-rtx4090-7b-prefix-heavy"
    verdicts = {figure: v["verdict"] for figure, v in search["against_defaults"][profile].items()}
    assert verdicts["median_ttft_ms"] == "worse" and verdicts["p99_itl_ms"] == verdicts["mean_itl_ms"] == "better"
    assert verdicts["output_throughput"] == verdicts["p99_ttft_ms"] == "level"
    assert search["against_defaults"][profile]["median_ttft_ms"]["p"] < 0.01
    rows = {r["experiment"]: r for r in summary["fidelity"]}
    for row in rows.values():
        assert row["compile_cache"] == "cold" and abs(row["error_card_pct"]) < 2
        warm = row["warm_restart"]
        assert warm["compile_cache"] == "warm" and warm["engine_kv_tokens"] > row["engine_kv_tokens"] * 1.08
        assert warm["error_card_pct"] < -5 and abs(warm["error_card_warm_pct"]) < 2
    assert (
        rows["tune-default-rtx4090-7b-prefix-heavy"]["warm_restart"]["engine_kv_tokens"],
        rows[profile]["warm_restart"]["engine_kv_tokens"],
    ) == (133_584, 128_768)
