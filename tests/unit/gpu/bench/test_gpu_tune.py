"""The tune search on the GPU host (gpu/bench/plan.py --tune, summarize.py's tune section): the plan vllm_fleet.tune
makes for a shipped profile, and the decision summarize.py makes of results in the harness's own record format
(here made of the five figures runs 7 to 9 measured on an H200 host: vLLM's defaults for the 4090's 7B three times,
the shipped prefill settings and the derived batching once each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpu_modules import GPU, ROOT, as_shipped_until_run12, load, plan_mod
from test_gpu_harness import fake_site  # noqa: F401  (the harness's stand-in vLLM, a fixture)

summarize = load("summarize")
RUNS = ROOT / "results" / "gpu"


def rows(run: str) -> dict[str, dict]:
    return {r["experiment"]: r for r in json.loads((RUNS / run / "summary.json").read_text())["side_by_side"]}


def test_the_tune_plan_measures_the_defaults_and_each_planned_candidate_with_repeats_of_their_own_prompts():
    """Five repeats by default (the fewest that the exact Mann-Whitney test can separate with room: p down to 0.0079),
    repeat r with seed r for every setting, and every experiment of the search marked for the harness to interleave
    (one search, one name); their servers side by side fit the H200 (4 x 0.157 of it)."""
    plan = plan_mod.build_tune("rtx4090-7b-prefill", "RTX 4090", extra=({"max_num_batched_tokens": 4096},))
    names = [e["name"] for e in plan["experiments"]]
    assert names == [
        "tune-default-rtx4090-7b-prefill",
        "tune-profile-rtx4090-7b-prefill",
        "tune-derived-rtx4090-7b-prefill",
        "tune-operator-1-rtx4090-7b-prefill",
    ]
    # The derived batching from the planner's KV cache for the card (119,744 tokens for vLLM 0.26): 77 sequences of
    # 1,024 + 512 tokens, 1,152 batched tokens: run 7's derived candidate.
    assert plan["experiments"][2]["overrides"] == {"max_num_seqs": 77, "max_num_batched_tokens": 1152}
    for exp in plan["experiments"]:
        loads = exp["actions"]
        assert [(a["kind"], a["seed"], a["max_concurrency"], a["input_len"]) for a in loads] == [
            ("bench", seed, 64, 1024) for seed in range(1, 6)
        ]
        assert exp["planner"]["errors"] == [] and exp["interleave"] == "tune-rtx4090-7b-prefill"
    assert sum(e["emulated_utilization"] for e in plan["experiments"]) < 0.9
    assert plan["tune"]["repeats"] == 5
    assert plan["tune"]["defaults"] == names[0] and list(plan["tune"]["candidates"]) == names[1:]
    # A candidate the planner refuses is named, not planned.
    refused = plan_mod.build_tune("rtx4090-7b-prefill", "RTX 4090", extra=({"gpu_memory_utilization": 0.99},))
    assert list(refused["tune"]["refused"]) == ["operator-1"]
    assert len(refused["experiments"]) == 3
    # Side by side, the L40's 14B takes 0.29 of the H200 a server: four of them do not fit, and the plan says so.
    with pytest.raises(ValueError, match=r"4 servers side by side would take 1\.16 of the H200's memory.*--limit"):
        plan_mod.build_tune("l40-14b-awq-prefill", "L40", extra=({"max_num_seqs": 64},))


def served_by_the_stand_in(plan, site, tmp_path, port_offset=0, **small):
    """The plan's first experiment run by the harness against its stand-in vLLM (test_gpu_harness.py), each load made
    small (`small`); the experiment's record."""
    plan["experiments"] = plan["experiments"][:1]
    for action in plan["experiments"][0]["actions"]:
        action.update(num_prompts=4, max_concurrency=2, save_detailed=False, **small)
    plan["tokenizer_vocab_size"] = 64
    plan["port"] = 17000 + (os.getpid() + port_offset) % 1000
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(GPU / "harness.py"), "run", "--plan", str(tmp_path / "plan.json"), "--budget-s", "900"],
        env=dict(os.environ, GPU_HARNESS_TMP=str(site), OUT=str(out)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (served,) = json.loads((out / "results-round1.json").read_text())["experiments"]
    return served


def test_the_harness_runs_each_repeat_with_its_own_seed_and_summarize_reads_them(fake_site, tmp_path):  # noqa: F811
    """The tune plan's defaults through the harness against its stand-in vLLM (test_gpu_harness.py): five loads by
    `vllm bench serve`, repeat r with seed r (the same prompts again would be answered from the prefix cache), and
    summarize.py takes them all as the repeats of one candidate."""
    plan = plan_mod.build_tune("rtx4090-7b-prefill", "RTX 4090")
    served = served_by_the_stand_in(plan, fake_site, tmp_path, input_len=8, output_len=4)
    seeds = [a["argv"][a["argv"].index("--seed") + 1] for a in served["actions"]]
    assert seeds == ["1", "2", "3", "4", "5"]
    found = summarize.tune_search(plan, [served])
    assert found["measured"]["vllm-defaults"]["repeats"] == 5
    assert found["measured"]["vllm-defaults"]["output_throughput"]["median"] == 1000.0  # the stand-in's figure
    assert found["not_measured"] == ["tune-derived-rtx4090-7b-prefill", "tune-profile-rtx4090-7b-prefill"]


def record(name: str, figures: list[dict], failed: int = 0) -> dict:
    """A harness record (results-roundN.json) of one experiment whose bench actions measured `figures`."""
    return {
        "name": name,
        "status": "ran",
        "actions": [
            {
                "name": f"guide-64u-bench-r{i}",
                "kind": "bench",
                "preemptions": f["preemptions"],
                "result": {
                    "completed": 192 - failed,
                    "failed": failed,
                    **{k: f[k] for k in ("median_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "p99_itl_ms")},
                    "output_throughput": f["output_throughput"],
                },
            }
            for i, f in enumerate(figures, start=1)
        ],
    }


def test_summarize_aggregates_the_repeats_and_at_the_reference_targets_vllms_defaults_win():
    plan = plan_mod.build_tune("rtx4090-7b-prefill", "RTX 4090")
    r7, r8, r9 = (
        rows("2026-12-01-run7-rtx4090-side-by-side"),
        rows("2026-12-02-run8-side-by-side"),
        rows("2026-12-02-run9-rtx4090-prefix-heavy"),
    )
    records = {
        "tune-default-rtx4090-7b-prefill": record(
            "tune-default-rtx4090-7b-prefill",
            [r7["r7-default-rtx4090-7b"], r8["r8-default-rtx4090-7b"], r9["r9-default-rtx4090-7b"]],
        ),
        "tune-profile-rtx4090-7b-prefill": record("tune-profile-rtx4090-7b-prefill", [r7["r7-rtx4090-7b-prefill"]]),
        "tune-derived-rtx4090-7b-prefill": record(
            "tune-derived-rtx4090-7b-prefill", [r7["cand-rtx4090-7b-prefill-derived"]], failed=1
        ),
    }
    found = summarize.tune_search(plan, list(records.values()))
    assert found["measured"]["vllm-defaults"]["repeats"] == 3
    assert found["measured"]["tune-derived-rtx4090-7b-prefill"]["failed"] == 1
    decision = found["decision"]
    assert decision["unfit"] == ["tune-derived-rtx4090-7b-prefill"]
    assert decision["choice"] == "vllm-defaults" and decision["verdict"].startswith("vLLM's defaults win")
    # One repeat against three: no test can separate them (least p 2/C(4, 1) = 0.5), however far apart.
    ttft = found["against_defaults"]["tune-profile-rtx4090-7b-prefill"]["median_ttft_ms"]
    assert (ttft["verdict"], ttft["p"], ttft["repeats"]) == ("level", 0.5, [1, 3])
    table = summarize.tables(
        {
            "fidelity": [],
            "refusals": [],
            "verification": [],
            "loads": [],
            "single_stream": [],
            "comparisons": [],
            "repeats": [],
            "not_run": [],
            "jit_cache": [],
            "tune": found,
        }
    )
    assert "Tune search: rtx4090-7b-prefill on the RTX 4090" in table and "vLLM's defaults win" in table
    assert "| 962.3 (962.3-962.3), n 1; level (+" in table


def test_the_committed_searches_are_what_plan_py_writes_today(monkeypatch):
    """gpu/bench/tune-*.json (the commands in gpu/bench/README.md and docs/gpu-results.md) are build_tune's output
    today from the profiles as they were when the searches ran (runs 10 to 12, 2026-12-04): the prefix-heavy search
    searched the profile shipped then, with its fp8 cache, and the plan records that; the bf16 settings it chose ship
    since. The L40's defaults get the AWQ checkpoint's quantization, as in runs 2 to 8."""
    as_shipped_until_run12(monkeypatch)
    # They ran two repeats each, one experiment after the other (before issue #49's five interleaved repeats).
    old = {"repeats": 2, "interleave": False}
    rtx4090 = plan_mod.build_tune("rtx4090-7b-prefill", "RTX 4090", extra=({"max_num_batched_tokens": 4096},), **old)
    l40 = plan_mod.build_tune("l40-14b-awq-prefill", "L40", limit=1, **old)
    # The prefix-heavy profile (fp8, as shipped then) under the traffic it is named for, beside a bf16 cache (its fp8
    # scales dropped): the candidate run 12 chose.
    shared = plan_mod.build_tune(
        "rtx4090-7b-prefix-heavy",
        "RTX 4090",
        extra=({"kv_cache_dtype": "auto", "calculate_kv_scales": None},),
        limit=3,
        load_kind="shared-prefix",
        **old,
    )
    for name, today in (
        ("tune-rtx4090-7b-prefill.json", rtx4090),
        ("tune-l40-14b-awq-prefill.json", l40),
        ("tune-rtx4090-7b-prefix-heavy-shared.json", shared),
    ):
        assert json.loads((GPU / name).read_text()) == json.loads(json.dumps(today)), name
    assert (
        "--quantization" in l40["experiments"][0]["args"] and "--quantization" not in rtx4090["experiments"][0]["args"]
    )


def test_a_shared_prefix_search_sends_prefix_repetition_and_summarize_shows_the_caches_hits(fake_site, tmp_path):  # noqa: F811
    """plan.py --tune ... --load shared-prefix: each load carries vllm bench serve's prefix_repetition options (its
    prompts share 8 prefixes of 768 tokens), the candidates are planned for the same request lengths as the
    reference's; the harness passes the options on (against its stand-in vLLM), and summarize.py shows the prefix
    cache's hit rate each candidate reached beside the five figures."""
    plan = plan_mod.build_tune("rtx4090-7b-prefix-heavy", "RTX 4090", load_kind="shared-prefix")
    assert plan["tune"]["load"]["source"] == "shared-prefix"
    first = plan["experiments"][1]["actions"][0]
    assert first["name"] == "guide-64u-shared-prefix-bench-r1" and first["dataset"] == {
        "dataset_name": "prefix_repetition",
        "prefix_repetition_prefix_len": 768,
        "prefix_repetition_suffix_len": 256,
        "prefix_repetition_num_prefixes": 8,
        "prefix_repetition_output_len": 512,
    }
    assert (first["input_len"], first["output_len"], first["num_prompts"]) == (1024, 512, 192)
    served = served_by_the_stand_in(plan, fake_site, tmp_path, port_offset=7)
    argv = served["actions"][0]["argv"]
    assert argv[argv.index("--dataset-name") + 1] == "prefix_repetition" and "--random-input-len" not in argv
    assert argv[argv.index("--prefix-repetition-num-prefixes") + 1] == "8"
    assert argv[argv.index("--prefix-repetition-prefix-len") + 1] == "768"
    # The stand-in's /metrics does not move: no queries between the scrapes, so no hit rate.
    assert served["actions"][0]["prefix_cache"] is None
    for i, action in enumerate(served["actions"]):
        action["prefix_cache"] = {"hits": 700.0 + i, "queries": 1000.0, "hit_rate": 0.7 + i / 1000}
    found = summarize.tune_search(plan, [served])
    rate = found["measured"]["vllm-defaults"]["prefix_hit_rate"]
    assert (round(rate["median"], 4), rate["low"], rate["high"]) == (0.702, 0.7, 0.704)
    assert "prefix cache hits" in summarize.tables(
        {k: [] for k in ("fidelity", "refusals", "verification", "loads", "single_stream", "comparisons", "repeats")}
        | {"not_run": [], "jit_cache": [], "tune": found}
    )


def test_the_harness_reads_the_prefix_caches_hits_between_two_scrapes():
    harness = load("harness")
    before = 'vllm:prefix_cache_queries_total{engine="0"} 1000.0\nvllm:prefix_cache_hits_total{engine="0"} 100.0\n'
    after = 'vllm:prefix_cache_queries_total{engine="0"} 5000.0\nvllm:prefix_cache_hits_total{engine="0"} 3100.0\n'
    assert harness.prefix_cache_delta(before, after) == {"hits": 3000.0, "queries": 4000.0, "hit_rate": 0.75}
    assert harness.prefix_cache_delta(before, before) is None


def test_summarize_pools_every_round_of_a_setting_and_tests_the_pooled_repeats():
    """A search run in two rounds (the harness's --again, or a round cut short and taken up by the next): each
    setting's loads from both rounds are its repeats, 2 + 3 = 5 a side, and the verdict is the test's over all five.
    The figures are run 7's (results/gpu), each repeat's median TTFT and throughput moved a little (invented) so that
    the profile's five lie above the defaults'; the latest round alone (3 and 3) could not separate them."""
    plan = plan_mod.build_tune("rtx4090-7b-prefill", "RTX 4090")
    r7 = rows("2026-12-01-run7-rtx4090-side-by-side")
    default, profile = r7["r7-default-rtx4090-7b"], r7["r7-rtx4090-7b-prefill"]

    def repeats(row: dict, ttfts: list[float]) -> list[dict]:
        return [dict(row, median_ttft_ms=t, output_throughput=row["output_throughput"] + t / 100) for t in ttfts]

    rounds = [
        dict(record("tune-default-rtx4090-7b-prefill", repeats(default, [437.2, 421.9])), _round=1),
        dict(record("tune-profile-rtx4090-7b-prefill", repeats(profile, [962.3, 948.0])), _round=1),
        dict(record("tune-default-rtx4090-7b-prefill", repeats(default, [455.0, 430.1, 447.6])), _round=2),
        dict(record("tune-profile-rtx4090-7b-prefill", repeats(profile, [971.5, 955.8, 940.2])), _round=2),
    ]
    found = summarize.tune_search(plan, rounds)
    assert found["measured"]["vllm-defaults"]["repeats"] == 5
    assert found["measured"]["tune-profile-rtx4090-7b-prefill"]["median_ttft_ms"]["values"] == [
        962.3,
        948.0,
        971.5,
        955.8,
        940.2,
    ]
    ttft = found["against_defaults"]["tune-profile-rtx4090-7b-prefill"]["median_ttft_ms"]
    assert (ttft["verdict"], ttft["p"], ttft["repeats"]) == ("worse", 0.0079, [5, 5])
    latest = summarize.tune_search(plan, rounds[2:])["against_defaults"]["tune-profile-rtx4090-7b-prefill"]
    assert (latest["median_ttft_ms"]["verdict"], latest["median_ttft_ms"]["p"]) == ("level", 0.1)
    table = summarize.tables(
        {k: [] for k in ("fidelity", "refusals", "verification", "loads", "single_stream", "comparisons", "repeats")}
        | {"not_run": [], "jit_cache": [], "tune": found}
    )
    assert "| 955.8 (940.2-971.5), n 5; worse (+" in table and "%, p=0.0079) |" in table
