"""The tune playbook's decisions: the site's load, the candidates, the Pareto front and the pick.

A search measures vLLM's defaults and a few candidate settings on one host with the same load, each more than once,
then decides. Every step here is a plain function of what was measured, so that the playbook, the GPU benchmark
(`gpu/bench/`) and the tests reach the same decision from the same numbers:

- `site_load`: the site's own traffic over a window, from two scrapes of vLLM's ``/metrics`` (the prompt and
  generation token histograms: counts, no content), as the arguments of ``vllm bench serve``'s random dataset;
  `reference_load` is the tuning reference's load for the card when the window holds no request.
- `candidates`: the settings to measure, starting from vLLM's defaults, the host's shipped profile and the planner's
  derived batching, each planned for the host (a candidate the planner refuses is named with its reason and not run).
- `aggregate`: a candidate's figures over its repeats: each repeat's value, and their median, lowest and highest.
- `front`: the Pareto front over the five figures (median and p99 TTFT, mean and p99 inter-token latency, output
  throughput) and the preemptions.
- `pick`: the candidate that meets the operator's targets with the best throughput, or the plain statement that
  vLLM's defaults win; `against_defaults` says, figure by figure, where a candidate is better or worse than vLLM's
  defaults by a stated test (Mann-Whitney U over the repeats), and "level" where the test does not separate them.
- `measured_profile`: the file the inventory takes, with its provenance.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from . import metrics, profiles
from .service_levels import GUIDE_TARGETS, derived_batching, match_card

# The five figures of a load (vllm bench serve's names, as gpu/bench/summarize.py keeps them) and the preemptions,
# each with the direction that is better.
FIGURES: tuple[tuple[str, str], ...] = (
    ("median_ttft_ms", "lower"),
    ("p99_ttft_ms", "lower"),
    ("mean_itl_ms", "lower"),
    ("p99_itl_ms", "lower"),
    ("output_throughput", "higher"),
    ("preemptions", "lower"),
)
FIVE = tuple(name for name, _ in FIGURES[:5])
DEFAULTS = "vllm-defaults"

# The significance level of `against_defaults`' test: a figure is better or worse than vLLM's defaults only where the
# two-sided exact Mann-Whitney U test over the repeats gives a p-value below it.
SIGNIFICANCE = 0.05
TEST = "exact two-sided Mann-Whitney U"

# The knobs a search may set (vLLM engine arguments in the profiles' snake_case). Anything else in a candidate is
# a mistake of the caller.
KNOBS = frozenset(
    {
        "max_num_seqs",
        "max_num_batched_tokens",
        "gpu_memory_utilization",
        "kv_cache_dtype",
        "calculate_kv_scales",  # with kv_cache_dtype: null where a candidate leaves the profile's fp8 cache
        "enable_prefix_caching",
        "enable_chunked_prefill",
        "speculative_config",
        "compilation_config",
    }
)

PROMPT_HISTOGRAM = "vllm:request_prompt_tokens"
OUTPUT_HISTOGRAM = "vllm:request_generation_tokens"


class TuneError(ValueError):
    """A search that cannot go on; the message names what, the value and the fix."""


# ----------------------------------------------------------------------------------------------------- the load


def _window(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any] | None:
    """A histogram's increase between two scrapes (a restart in between, a count that fell, is no window)."""
    if not after:
        return None
    old = {str(le): float(c) for le, c in (before or {}).get("buckets", [])}
    buckets: list[tuple[str, float]] = [
        (str(le), float(c) - old.get(str(le), 0.0)) for le, c in after.get("buckets", [])
    ]
    count = float(after.get("count") or 0) - float((before or {}).get("count") or 0)
    total = float(after.get("sum") or 0) - float((before or {}).get("sum") or 0)
    if count <= 0 or any(c < 0 for _, c in buckets):
        return None
    return {"count": count, "mean": total / count, "buckets": buckets}


def _lengths(window: Mapping[str, Any]) -> dict[str, Any]:
    """The mean (exact: the histogram's sum over its count) and the deciles (estimated within the buckets)."""
    buckets = window["buckets"]
    low, high = metrics.histogram_quantile(0.1, buckets), metrics.histogram_quantile(0.9, buckets)
    bounds = sorted(float(le) for le, _ in buckets)  # float() reads "+Inf"
    one_bucket = low is not None and high is not None and _bucket(bounds, low) == _bucket(bounds, high)
    return {"mean": round(window["mean"], 1), "p10": low, "p90": high, "one_bucket": one_bucket}


def _bucket(bounds: list[float], value: float) -> int:
    return next((i for i, le in enumerate(bounds) if value <= le), len(bounds))


def _range_ratio(lengths: Mapping[str, Any]) -> float:
    """vllm bench serve's --random-range-ratio (lengths drawn uniformly within mean x (1 -/+ ratio)) that covers the
    middle 80 % of the window's requests, at most 0.9; 0 when the deciles fall in one bucket (vLLM's buckets go
    1-2-5 per decade: within one, the histogram cannot tell a spread, and the mean is what it knows)."""
    mean, low, high = float(lengths["mean"] or 0), lengths["p10"], lengths["p90"]
    if not mean or low is None or high is None or lengths["one_bucket"]:
        return 0.0
    return round(min(0.9, max(float(high) - mean, mean - float(low)) / mean), 2)


# The traffic a profile is named for (profiles.yml `traffic`): the search loads a profile that says shared-prefix
# with prompts that share prefixes, since prefix caching is what such a profile is tuned for and random prompts
# never hit its cache (run 12, docs/gpu-results.md).
TRAFFICS = ("random", "shared-prefix")
# The share of a prompt that is a shared prefix when the site's own cache cannot tell: the reference load's 768 of
# 1,024 tokens (shared_prefix_load).
REFERENCE_PREFIX_SHARE = 0.75
# Below this prefix cache hit rate the site's prompts share too little to draw as shared prefixes.
MIN_PREFIX_SHARE = 0.05


def prefixes_for(users: int) -> int:
    """How many distinct prefixes a shared-prefix load sends for `users` concurrent users: one per 8."""
    return max(1, int(users) // 8)


def profile_traffic(name: str | None) -> str:
    """The traffic the shipped profile `name` is named for (its `traffic`, else random)."""
    entry = profiles.shipped().get(str(name or ""), {})
    traffic = entry.get("traffic", "random")
    if traffic not in TRAFFICS:
        raise TuneError("the profile %s names the traffic %r, not one of %s" % (name, traffic, ", ".join(TRAFFICS)))
    return str(traffic)


def site_load(
    before: str, after: str, minimum_requests: int = 50, shared_prefix: bool = False, users: int = 8
) -> dict[str, Any] | None:
    """The site's traffic between two scrapes of one instance's /metrics: the requests it finished, their prompt and
    output lengths (the mean, and the deciles estimated as PromQL's histogram_quantile does), and the arguments of
    vllm bench serve's random dataset that draw such lengths. None when the window holds fewer than
    `minimum_requests` finished requests (too few to stand for the site; the reference's load is then used).

    With `shared_prefix` (a profile named for such traffic), the prompts are drawn by the prefix_repetition dataset:
    the share of each prompt that is a shared prefix is the window's prefix cache hit rate (vllm:prefix_cache_hits
    over vllm:prefix_cache_queries, in tokens), else the reference's 3/4 where the instance counted no query; a site
    whose hit rate is under 5 % shares no prefix to speak of and keeps random prompts (`prefix_share` says which).
    The prompts of the `users` the search runs share `prefixes_for(users)` prefixes."""
    first, last = metrics.parse(before), metrics.parse(after)
    prompt = _window(first.histograms.get(PROMPT_HISTOGRAM, {}), last.histograms.get(PROMPT_HISTOGRAM, {}))
    output = _window(first.histograms.get(OUTPUT_HISTOGRAM, {}), last.histograms.get(OUTPUT_HISTOGRAM, {}))
    if not prompt or not output or prompt["count"] < minimum_requests:
        return None
    prompt_lengths, output_lengths = _lengths(prompt), _lengths(output)
    input_len = max(1, round(prompt["mean"]))
    output_len = max(1, round(output["mean"]))
    load: dict[str, Any] = {
        "source": "site",
        "requests": int(prompt["count"]),
        "prompt_tokens": prompt_lengths,
        "output_tokens": output_lengths,
        "bench": {
            "dataset_name": "random",
            "random_input_len": input_len,
            "random_output_len": output_len,
            "random_range_ratio": max(_range_ratio(prompt_lengths), _range_ratio(output_lengths)),
        },
    }
    if not shared_prefix:
        return load
    queries = last.counters.get("vllm:prefix_cache_queries", 0.0) - first.counters.get("vllm:prefix_cache_queries", 0.0)
    hits = last.counters.get("vllm:prefix_cache_hits", 0.0) - first.counters.get("vllm:prefix_cache_hits", 0.0)
    if queries > 0 and 0 <= hits <= queries:
        share, source = hits / queries, "the window's prefix cache hit rate"
    else:
        share, source = REFERENCE_PREFIX_SHARE, "the reference's (the instance counted no prefix cache query)"
    load["prefix_share"] = {"share": round(share, 3), "from": source}
    if share < MIN_PREFIX_SHARE or input_len < 2:
        load["prefix_share"]["from"] += "; too little shared: random prompts"
        return load
    prefix_len = min(input_len - 1, max(1, round(input_len * share)))
    load["source"] = "site, shared-prefix"
    load["bench"] = {
        "dataset_name": "prefix_repetition",
        "prefix_repetition_prefix_len": prefix_len,
        "prefix_repetition_suffix_len": input_len - prefix_len,
        "prefix_repetition_num_prefixes": prefixes_for(users),
        "prefix_repetition_output_len": output_len,
    }
    return load


def reference_load(gpu: Mapping[str, Any], prompt_tokens: int = 1024, output_tokens: int = 512) -> dict[str, Any]:
    """The tuning reference's load for the card (its users; GUIDE_TARGETS), for a site without history: the GPU
    runs' ~1K-token prompts and 512-token answers (docs/gpu-results.md), which the reference does not fix."""
    target = match_card(GUIDE_TARGETS, gpu)
    if not target:
        raise TuneError(
            "the card %r has no load in the tuning reference (RTX 4090 and L40 only); fix: let the search read the "
            "site's own load (the instance's histograms over vllm_tune_window) or give vllm_tune_load" % gpu.get("name")
        )
    return {
        "source": "reference",
        "users": target["users"],
        "bench": {
            "dataset_name": "random",
            "random_input_len": prompt_tokens,
            "random_output_len": output_tokens,
            "random_range_ratio": 0.0,
            "max_concurrency": target["users"],
        },
    }


def shared_prefix_load(
    gpu: Mapping[str, Any],
    prefix_tokens: int = 768,
    suffix_tokens: int = 256,
    output_tokens: int = 512,
    prefixes: int | None = None,
) -> dict[str, Any]:
    """A shared-prefix load for a prefix-caching profile: the reference's users and lengths for the card (a ~1K-token
    prompt, a 512-token answer), each prompt a prefix that other requests share (a system prompt, a conversation so
    far) and a suffix of its own; `prefixes` distinct prefixes (default: one per 8 users). `vllm bench serve`'s
    prefix_repetition dataset sends it."""
    target = match_card(GUIDE_TARGETS, gpu)
    if not target:
        raise TuneError(
            "the card %r has no load in the tuning reference (RTX 4090 and L40 only); fix: give the search its own "
            "load" % gpu.get("name")
        )
    for name, value in (
        ("prefix_tokens", prefix_tokens),
        ("suffix_tokens", suffix_tokens),
        ("output_tokens", output_tokens),
        ("prefixes", 1 if prefixes is None else prefixes),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise TuneError("the shared-prefix load's %s=%r is not a positive integer; fix: give one" % (name, value))
    users = int(target["users"])
    return {
        "source": "shared-prefix",
        "users": users,
        "bench": {
            "dataset_name": "prefix_repetition",
            "prefix_repetition_prefix_len": prefix_tokens,
            "prefix_repetition_suffix_len": suffix_tokens,
            "prefix_repetition_num_prefixes": prefixes or prefixes_for(users),
            "prefix_repetition_output_len": output_tokens,
            "max_concurrency": users,
        },
    }


def load_lengths(load: Mapping[str, Any]) -> tuple[int, int]:
    """(prompt tokens, output tokens) of a load's request, whichever dataset sends it."""
    bench = load["bench"]
    if bench.get("dataset_name") == "prefix_repetition":
        return (
            int(bench["prefix_repetition_prefix_len"]) + int(bench["prefix_repetition_suffix_len"]),
            int(bench["prefix_repetition_output_len"]),
        )
    return int(bench["random_input_len"]), int(bench["random_output_len"])


# ----------------------------------------------------------------------------------------------- the candidates


def candidates(
    host: str,
    hostvars: Mapping[str, Any],
    plan: Callable[[str, Mapping[str, Any]], Mapping[str, Any]],
    load: Mapping[str, Any],
    extra: Iterable[Mapping[str, Any]] = (),
    limit: int = 4,
) -> dict[str, Any]:
    """The settings a search measures on `host`, vLLM's defaults first.

    - the host's profile as the inventory resolves it ("profile");
    - the planner's derived batching for the load's lengths on the profile's KV cache ("derived"): as many
      sequences as the cache holds at those lengths, one prompt's worth of batched tokens;
    - `extra`: the operator's own (vllm_tune_candidates), each a dict of KNOBS.

    Each is planned for the host with `plan` (the planner's plan_host) as a profile override of the inventory's; one
    the planner refuses is listed under "refused" with the planner's messages and not run. A candidate equal to
    another is measured once. At most `limit` besides the defaults (the budget: each is loaded in every round, five
    by default)."""
    prompt, output = load_lengths(load)
    base = plan(host, hostvars)
    if base.get("errors"):
        raise TuneError(
            "%s: its own plan fails, so nothing can be tuned from it: %s" % (host, " | ".join(base["errors"]))
        )
    kv_tokens = int((base.get("capacity") or {}).get("kv_cache_tokens") or 0)
    wanted: list[tuple[str, dict[str, Any]]] = [("profile", {})]
    if kv_tokens:
        wanted.append(("derived", derived_batching(kv_tokens, prompt, output)))
    for index, settings in enumerate(extra, start=1):
        unknown = sorted(set(settings) - KNOBS)
        if unknown:
            raise TuneError(
                "%s: vllm_tune_candidates[%d] sets %s, which a search does not tune; fix: use only %s"
                % (host, index - 1, ", ".join(unknown), ", ".join(sorted(KNOBS)))
            )
        wanted.append(("operator-%d" % index, dict(settings)))

    chosen: dict[str, dict[str, Any]] = {}
    refused: dict[str, list[str]] = {}
    seen: list[dict[str, Any]] = []
    profile = dict(hostvars.get("vllm_profile") or {})
    for name, settings in wanted:
        if len(chosen) >= limit:
            break
        entry = plan(host, dict(hostvars, vllm_profile=dict(profile, **settings))) if settings else base
        if entry.get("errors"):
            refused[name] = list(entry["errors"])
            continue
        effective = {k: v for k, v in (entry.get("profile_effective") or {}).items() if k in KNOBS}
        if effective in seen:
            continue
        seen.append(effective)
        chosen[name] = {
            "settings": settings,
            "effective": effective,
            "kv_cache_tokens": (entry.get("capacity") or {}).get("kv_cache_tokens"),
            "args": _instance_args(entry),
        }
    return {"defaults": DEFAULTS, "candidates": chosen, "refused": refused}


def _instance_args(entry: Mapping[str, Any]) -> dict[str, list[str]]:
    """{instance: its vllm serve arguments} of a host's plan entry."""
    return {str(i["name"]): list(i["args"]) for i in entry.get("instances") or [] if "args" in i}


# vLLM's defaults on a host: its profile without any knob a search sets (``null`` removes a key), so that vLLM
# chooses them; the model, its length and the serving settings stay the host's.
DEFAULT_SETTINGS: dict[str, Any] = dict.fromkeys(sorted(KNOBS))


def defaults_candidate(
    host: str, hostvars: Mapping[str, Any], plan: Callable[[str, Mapping[str, Any]], Mapping[str, Any]]
) -> dict[str, Any]:
    """vLLM's defaults planned for `host`, in the shape of a candidate: its arguments per instance (the host's model
    and serving settings, no tuning knob)."""
    profile = dict(hostvars.get("vllm_profile") or {})
    entry = plan(host, dict(hostvars, vllm_profile=dict(profile, **DEFAULT_SETTINGS)))
    if entry.get("errors"):
        raise TuneError("%s: vLLM's defaults cannot be planned for it: %s" % (host, " | ".join(entry["errors"])))
    return {
        "settings": dict(DEFAULT_SETTINGS),
        "effective": {},
        "kv_cache_tokens": (entry.get("capacity") or {}).get("kv_cache_tokens"),
        "args": _instance_args(entry),
    }


# ------------------------------------------------------------------------------------------------- the decision


def aggregate(runs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A candidate's figures over its repeats: for each, every repeat's value (in the repeats' order: `against_defaults`
    tests them), their median and their spread (lowest, highest). A repeat with a failed request makes the candidate
    unfit: a setting that loses requests is not a trade-off."""
    runs = list(runs)
    if not runs:
        raise TuneError("a candidate with no measured run")
    result: dict[str, Any] = {"repeats": len(runs), "failed": sum(int(r.get("failed") or 0) for r in runs)}
    for name, _ in FIGURES:
        values = [float(r[name]) for r in runs if r.get(name) is not None]
        if not values:
            result[name] = None
            continue
        result[name] = {"median": statistics.median(values), "low": min(values), "high": max(values), "values": values}
    return result


def _value(figures: Mapping[str, Any], name: str) -> float | None:
    cell = figures.get(name)
    return None if cell is None else float(cell["median"])


def _better(name: str, a: float, b: float) -> bool:
    return a > b if dict(FIGURES)[name] == "higher" else a < b


def dominates(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """`a` is no worse than `b` on every figure both have and better on one (the medians of the repeats)."""
    strictly = False
    for name, _ in FIGURES:
        x, y = _value(a, name), _value(b, name)
        if x is None or y is None:
            continue
        if _better(name, y, x):
            return False
        strictly |= _better(name, x, y)
    return strictly


def front(measured: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The candidates no other one dominates (unfit ones, which lost requests, left out), in the given order."""
    fit = {n: f for n, f in measured.items() if not f.get("failed")}
    return [n for n, f in fit.items() if not any(dominates(g, f) for m, g in fit.items() if m != n)]


def least_p(n: int, m: int) -> float:
    """The lowest p-value the exact two-sided Mann-Whitney U test can give for `n` and `m` repeats: every one of one
    side beyond every one of the other, 2 of the C(n + m, n) orders of the values (without ties)."""
    return min(1.0, 2.0 / math.comb(n + m, n))


def figure_against(
    name: str, a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, alpha: float = SIGNIFICANCE
) -> dict[str, Any]:
    """One figure of a candidate (`a`, what `aggregate` made of its repeats) against vLLM's defaults' (`b`): the verdict
    of the exact two-sided Mann-Whitney U test over the two sets of repeats at the level `alpha`, its p-value, the
    medians' difference (candidate minus defaults, and in % of the defaults') and why."""
    if a is None or b is None:
        return {
            "verdict": "not measured",
            "p": None,
            "difference": None,
            "difference_pct": None,
            "repeats": None,
            "why": "%s lacks the figure" % ("the candidate" if a is None else "vLLM's defaults"),
        }
    # numpy and scipy: loaded only where a search is decided (a filter plugin's import stays light). scipy ships no
    # type hints (scipy-stubs is a package of its own, not pinned here).
    from scipy.stats import mannwhitneyu  # type: ignore[import-untyped]

    x, y = [float(v) for v in a["values"]], [float(v) for v in b["values"]]
    difference = float(a["median"]) - float(b["median"])
    test = mannwhitneyu(x, y, alternative="two-sided", method="exact")
    p, floor = float(test.pvalue), least_p(len(x), len(y))
    out: dict[str, Any] = {
        "verdict": "level",
        "p": round(p, 4),
        "difference": round(difference, 4),
        "difference_pct": round(100.0 * difference / float(b["median"]), 2) if b["median"] else None,
        "repeats": [len(x), len(y)],
    }
    over = "by the %s test over %d and %d repeats" % (TEST, len(x), len(y))
    if floor >= alpha:
        out["why"] = "not separated: p=%.3g %s, which can never go below %.3g; separating needs p < %g" % (
            p,
            over,
            floor,
            alpha,
        )
    elif p >= alpha:
        out["why"] = "not separated: p=%.3g %s, not below %g" % (p, over, alpha)
    else:
        # U counts the pairs in which the candidate's repeat is the higher: more than half, its figure is the higher.
        higher = float(test.statistic) > len(x) * len(y) / 2
        out["verdict"] = "better" if higher == (dict(FIGURES)[name] == "higher") else "worse"
        out["why"] = "separated: p=%.3g %s, below %g" % (p, over, alpha)
    return out


def against_defaults(
    candidate: Mapping[str, Any], defaults: Mapping[str, Any], alpha: float = SIGNIFICANCE
) -> dict[str, dict[str, Any]]:
    """Figure by figure (`figure_against`): "better" or "worse" where a stated test separates the candidate's repeats
    from vLLM's defaults' (the exact two-sided Mann-Whitney U test, p below `alpha`, 0.05 by default), "level" where it
    does not (with its p-value, or why no test could), "not measured" where either lacks the figure. Each with the
    medians' difference (candidate minus defaults, and in %) and the p-value.

    Why a test and why five repeats: two sets of repeats whose lowest-highest ranges do not overlap look separated,
    but with few repeats that happens by chance often (run 10 to 12's two repeats each, issue #49: one repeat more
    that overlaps undoes it). The exact test states how often: with 5 and 5 repeats, all of one side beyond all of
    the other gives p = 2/C(10, 5) = 0.0079; with 3 and 3 it can never go below 2/C(6, 3) = 0.1, and with 2 and 2
    never below 2/C(4, 2) = 0.33. So two or three repeats a side can never call a figure better or worse, which is
    the point: such a search says "level" and why, rather than a verdict one overlapping repeat would undo. Ties (the
    same preemptions, say) are ranked as scipy's exact test ranks them; all equal gives p = 1."""
    return {name: figure_against(name, candidate.get(name), defaults.get(name), alpha) for name, _ in FIGURES}


def verdict_text(entry: Mapping[str, Any]) -> str:
    """One figure's verdict as reports show it: "worse (+81.5 %, p=0.0079)", "level (+3.1 %, p=0.33)"."""
    if entry.get("verdict") == "not measured":
        return "not measured"
    shown = [] if entry.get("difference_pct") is None else ["%+.1f %%" % entry["difference_pct"]]
    shown += [] if entry.get("p") is None else ["p=%.2g" % entry["p"]]
    return "%s (%s)" % (entry["verdict"], ", ".join(shown)) if shown else str(entry["verdict"])


def targets(slo: Mapping[str, Any] | None, gpu: Mapping[str, Any]) -> dict[str, float]:
    """The operator's targets (vllm_slo: median_ttft_ms, p99_ttft_ms, tokens_per_s_per_user), or the tuning
    reference's for the card (its TTFT as the median's, its lowest decode rate per user)."""
    if slo:
        known = {"median_ttft_ms", "p99_ttft_ms", "tokens_per_s_per_user"}
        unknown = sorted(set(slo) - known)
        bad = [k for k in known & set(slo) if not _positive(slo[k])]
        if unknown or bad:
            raise TuneError(
                "vllm_slo has %s; fix: give positive numbers for any of %s"
                % (
                    ", ".join(
                        ["%s (not a target)" % k for k in unknown] + ["%s=%r" % (k, slo[k]) for k in sorted(bad)]
                    ),
                    ", ".join(sorted(known)),
                )
            )
        return {k: float(v) for k, v in slo.items()}
    target = match_card(GUIDE_TARGETS, gpu)
    if not target:
        return {}
    return {"median_ttft_ms": float(target["ttft_ms"]), "tokens_per_s_per_user": float(target["min_tokens_per_s"])}


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def misses(figures: Mapping[str, Any], wanted: Mapping[str, float]) -> list[str]:
    """The targets a candidate's medians miss, each with the measured value."""
    out = []
    for name, limit in sorted(wanted.items()):
        if name == "tokens_per_s_per_user":
            itl = _value(figures, "mean_itl_ms")
            rate = 1000.0 / itl if itl else None
            if rate is None or rate < limit:
                out.append("%s %s < %g" % (name, "?" if rate is None else "%.1f" % rate, limit))
        else:
            value = _value(figures, name)
            if value is None or value > limit:
                out.append("%s %s > %g" % (name, "?" if value is None else "%.1f" % value, limit))
    return out


def pick(measured: Mapping[str, Mapping[str, Any]], wanted: Mapping[str, float]) -> dict[str, Any]:
    """The decision: among the candidates on the front that meet every target, the one with the best output
    throughput (vLLM's defaults included: when they are the one, the decision says so). When none meets them, none
    is picked, and each candidate's misses are given."""
    if DEFAULTS not in measured:
        raise TuneError("a search without vLLM's defaults measured beside it cannot say what a setting wins")
    on_front = front(measured)
    meeting = [n for n in on_front if not misses(measured[n], wanted)]
    result: dict[str, Any] = {
        "front": on_front,
        "targets": dict(wanted),
        "misses": {n: misses(f, wanted) for n, f in measured.items()},
        "unfit": sorted(n for n, f in measured.items() if f.get("failed")),
    }
    if not meeting:
        result.update(choice=None, verdict="no setting measured meets the targets")
        return result
    best = max(meeting, key=lambda n: (_value(measured[n], "output_throughput") or 0.0, n == DEFAULTS))
    versus = against_defaults(measured[best], measured[DEFAULTS]) if best != DEFAULTS else {}
    result.update(choice=best, against_defaults=versus)
    if best == DEFAULTS:
        result["verdict"] = "vLLM's defaults win: no candidate meets the targets with more throughput"
    elif all(versus[n]["verdict"] == "better" for n in FIVE):
        result["verdict"] = "%s beats vLLM's defaults on all five figures" % best
    else:
        lost = [n for n in FIVE if versus[n]["verdict"] == "worse"]
        result["verdict"] = "%s meets the targets with the best throughput; against vLLM's defaults it %s" % (
            best,
            "gives up " + ", ".join(lost)
            if lost
            else "is worse on no figure by the %s test at p < %g" % (TEST, SIGNIFICANCE),
        )
    return result


def run_of(
    result: Mapping[str, Any], preemptions: float | None, prefix_cache: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """One repeat of a candidate: the five figures of a ``vllm bench serve --save-result`` JSON, the preemptions
    (vllm:num_preemptions' increase over the load), the requests sent and failed, and the prefix cache's hit rate
    where the load shares prefixes."""
    sent = int(result.get("completed") or 0) + int(result.get("failed") or 0)
    run: dict[str, Any] = {
        **{k: result.get(k) for k in FIVE},
        "preemptions": preemptions,
        "failed": int(result.get("failed") or 0),
        "sent": sent,
    }
    if prefix_cache and prefix_cache.get("hit_rate") is not None:
        run["prefix_hit_rate"] = prefix_cache["hit_rate"]
    return run


def search(
    profile: str,
    card: Any,
    load: Mapping[str, Any],
    runs_of: Mapping[str, list[Mapping[str, Any]]],
    wanted: Mapping[str, float],
    refused: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A search's result: each candidate's repeats aggregated (a candidate with no completed repeat is listed as not
    measured), the prefix cache's hit rate beside the figures, the decision at `wanted` (the targets) and every
    candidate against vLLM's defaults figure by figure."""
    measured: dict[str, dict[str, Any]] = {}
    for name, runs in runs_of.items():
        if not runs:
            continue
        measured[name] = aggregate(runs)
        rates = [float(r["prefix_hit_rate"]) for r in runs if r.get("prefix_hit_rate") is not None]
        if rates:  # what the prefix cache saved, beside the figures the front compares
            measured[name]["prefix_hit_rate"] = {
                "median": statistics.median(rates),
                "low": min(rates),
                "high": max(rates),
            }
    decision = pick(measured, wanted) if DEFAULTS in measured else None
    versus = {
        n: against_defaults(f, measured[DEFAULTS])
        for n, f in measured.items()
        if n != DEFAULTS and DEFAULTS in measured
    }
    return {
        "profile": profile,
        "card": card,
        "load": dict(load),
        "measured": measured,
        "runs": {n: list(r) for n, r in runs_of.items()},
        "not_measured": sorted(n for n, r in runs_of.items() if not r),
        "against_defaults": versus,
        "decision": decision,
        "refused": dict(refused or {}),
    }


# What a measured profile records of where it was measured.
PROVENANCE = ("card", "driver", "vllm_version", "model", "load", "date")


def measured_profile(
    name: str,
    base_profile: str,
    settings: Mapping[str, Any],
    decision: Mapping[str, Any],
    measured: Mapping[str, Mapping[str, Any]],
    provenance: Mapping[str, Any],
) -> dict[str, Any]:
    """The profile a search wrote: the base profile's name, the picked settings and the provenance (card, driver,
    vLLM version, model, load, date) with every candidate's figures and the decision, so that the inventory takes it
    with one line and the plan can say it was measured."""
    missing = sorted(set(PROVENANCE) - set(provenance))
    if missing:
        raise TuneError("the measured profile %s lacks its provenance: %s" % (name, ", ".join(missing)))
    return {
        "name": name,
        "base": base_profile,
        "settings": dict(settings),
        "measured": {
            **dict(provenance),
            "decision": {k: decision[k] for k in ("choice", "verdict", "front", "targets") if k in decision},
            "figures": {n: dict(f) for n, f in measured.items()},
        },
    }


def _card(name: Any) -> str | None:
    """The tuning reference's name of a card (RTX 4090, L40...) for a GPU name, None for a card it does not list."""
    targets = match_card(GUIDE_TARGETS, {"name": name})
    return targets["card"] if targets else None


def taken_profile(
    host: str, doc: Any, profile_name: str | None, gpu: Any, version: Any
) -> tuple[list[str], list[str], dict[str, Any], dict[str, Any]]:
    """A measured profile the inventory gives a host (``vllm_profile_measured``: what `measured_profile` made), checked
    against the host: (errors, warnings, the settings it sets over the host's shipped profile, where the profile comes
    from for the plan). An error names the host, the setting and the fix; the settings are only a search's knobs."""
    where = "%s: vllm_profile_measured" % host
    whole = "fix: the file a tune search wrote (summarize.py --measured-profile), taken whole"
    if not isinstance(doc, Mapping):
        return ["%s is a %s, not a measured profile; %s" % (where, type(doc).__name__, whole)], [], {}, {}
    missing = [k for k in ("name", "base", "settings", "measured") if k not in doc]
    if missing:
        return ["%s lacks %s; %s" % (where, ", ".join(missing), whole)], [], {}, {}
    settings, measured = doc["settings"], doc["measured"]
    if not isinstance(settings, Mapping) or not isinstance(measured, Mapping):
        return ["%s: its settings and measured must be mappings; %s" % (where, whole)], [], {}, {}
    errors: list[str] = []
    lacking = [k for k in PROVENANCE if measured.get(k) in (None, "")]
    if lacking:
        errors.append(
            "%s (%s) lacks its provenance: %s; fix: take the file a tune search wrote, which records them"
            % (where, doc["name"], ", ".join(lacking))
        )
    unknown = sorted(str(k) for k in settings if k not in KNOBS)
    if unknown:
        errors.append(
            "%s (%s) sets %s, which a search does not set (it sets %s); fix: put other settings in vllm_profile"
            % (where, doc["name"], ", ".join(unknown), ", ".join(sorted(KNOBS)))
        )
    if profile_name and doc["base"] != profile_name:
        errors.append(
            "%s (%s) was measured for the profile %s, and this host's vllm_profile_name is %s; fix: set "
            "vllm_profile_name: %s, or take the measured profile of %s"
            % (where, doc["name"], doc["base"], profile_name, doc["base"], profile_name)
        )
    warnings: list[str] = []
    if isinstance(version, str) and measured.get("vllm_version") and str(measured["vllm_version"]) != version:
        warnings.append(
            "%s (%s) was measured on vLLM %s and this host runs %s: its figures are that release's; search "
            "again on this release to measure it" % (where, doc["name"], measured["vllm_version"], version)
        )
    theirs, ours = _card(measured.get("card")), _card(gpu.get("name") if isinstance(gpu, Mapping) else None)
    if theirs and ours and theirs != ours:
        errors.append(
            "%s (%s) was measured on an %s and this host's cards are %s; fix: take a profile measured on this "
            "card, or search on one of these hosts" % (where, doc["name"], theirs, ours)
        )
    found = measured.get("decision")
    decision: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    source = {
        "kind": "measured",
        "name": doc["name"],
        **{k: measured.get(k) for k in PROVENANCE},
        "choice": decision.get("choice"),
        "verdict": decision.get("verdict"),
    }
    return errors, warnings, dict(settings) if not errors else {}, source
