"""Parse a vLLM ``/metrics`` page and judge it.

The text is parsed with prometheus_client's own text-format parser, so the rules of the format
(escaping, ``_total`` suffixes, histogram buckets) are the library's, not ours. The result is a
:class:`MetricsFacts`: plain numbers keyed by metric family name, safe to turn into JSON (an Ansible
fact or a report).

Family names are the parser's: a counter ``vllm:num_preemptions_total`` is the family
``vllm:num_preemptions``; a histogram keeps its full name (``vllm:iteration_tokens_total`` is a
histogram whose name happens to end in ``_total``). The names below are those of vLLM 0.32 and 0.33
(``../shared/reference/VLLM.md``); the tuning reference's older names (``gpu_cache_usage_perc``,
``gpu_prefix_cache_*``, ``time_per_output_token_seconds``, ``spec_decode_draft_acceptance_rate``) are
gone and are not looked for.

Functions that take facts accept a :class:`MetricsFacts` or its ``as_dict()`` form, because in Ansible
the facts travel as a dict.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .inputs import short

__all__ = [
    "CACHE_CONFIG_INFO",
    "DEFAULTS",
    "MetricsFacts",
    "MetricsParseError",
    "check",
    "check_families",
    "findings",
    "histogram_quantile",
    "is_speculative",
    "kv_prediction_error",
    "parse",
    "rates",
    "readback",
    "required_families",
    "window_latencies",
]

CACHE_CONFIG_INFO = "vllm:cache_config_info"

# The families an operator relies on: the tuning reference's dashboard, in today's names. Both 0.32 and
# 0.33 export every one of them (tests check this list against both versions' metrics_defined.tsv).
_REQUIRED: dict[str, str] = {
    # gauges
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    CACHE_CONFIG_INFO: "gauge",
    # counters (exposed with a _total suffix)
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    # histograms
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:iteration_tokens_total": "histogram",
}

# Registered only when the engine runs with a speculative config (draft model, EAGLE, ngram).
# There is no ready-made acceptance-rate metric any more: rate = accepted / draft tokens.
_REQUIRED_SPECULATIVE: dict[str, str] = {
    "vllm:spec_decode_num_drafts": "counter",
    "vllm:spec_decode_num_draft_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens": "counter",
}

DEFAULTS: dict[str, float] = {
    # The tuning reference: a drafter that gets fewer than 60 % of its tokens accepted does not pay for itself.
    "min_acceptance_rate": 0.6,
    # Below this many draft tokens the acceptance rate is noise (one 16-token smoke request with
    # 5 speculative tokens proposes at most ~80), so no finding is made.
    "min_draft_tokens": 100,
    # The tuning reference: a hit rate under 30 % with a fixed system prompt means the prompt varies.
    "min_prefix_hit_rate": 0.30,
    # "With traffic": prefix_cache_queries counts queried prompt *tokens*, not requests. 1000 tokens is
    # a handful of real chat requests with a system prompt; a verification smoke request (~20 tokens)
    # stays below it, so an idle or freshly restarted host gives no finding.
    "min_prefix_queries": 1000,
    # Preemptions may not grow at all between two scrapes (swap space is gone in today's vLLM, so a
    # preempted request is recomputed from scratch: every one costs latency).
    "max_preemption_increase": 0,
}

# Latency histograms whose window mean the report shows for the smoke request.
_LATENCY_HISTOGRAMS: dict[str, str] = {
    "e2e_s": "vllm:e2e_request_latency_seconds",
    "ttft_s": "vllm:time_to_first_token_seconds",
    "queue_s": "vllm:request_queue_time_seconds",
    "prefill_s": "vllm:request_prefill_time_seconds",
    "decode_s": "vllm:request_decode_time_seconds",
    "inter_token_s": "vllm:inter_token_latency_seconds",
}

_INT_RE = re.compile(r"^[+-]?\d+$")
_FLOAT_RE = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")


class MetricsParseError(ValueError):
    """The text is not a Prometheus text exposition."""


@dataclass
class MetricsFacts:
    """What a /metrics page says, in plain JSON-able values.

    - ``families``: every family with at least one sample -> its type (``counter``, ``gauge``,
      ``histogram``, ...). ``empty``: families declared (HELP/TYPE) without any sample.
    - ``counters``: counter family -> total over all its series (engines, labels such as
      ``finished_reason``).
    - ``gauges``: gauge family -> ``{"sum", "max", "series"}`` over its series.
    - ``histograms``: family -> ``{"count", "sum", "mean", "buckets", "p50", "p90", "p99"}``; buckets are
      ``[le, cumulative count]`` pairs summed over series, ``le`` kept as the exposition's string
      (``"+Inf"`` is not valid JSON as a number); quantiles are estimated from the buckets the way
      PromQL's ``histogram_quantile`` does.
    - ``cache_config``: the labels of ``vllm:cache_config_info`` with typed values (``"True"`` -> true,
      ``"None"`` -> null, numbers as numbers), from the lowest ``engine``; ``{}`` when absent.
    - ``model_names``, ``engines``: the label values seen on ``vllm:`` families.
    """

    families: dict[str, str] = field(default_factory=dict)
    empty: list[str] = field(default_factory=list)
    counters: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, dict[str, float | None]] = field(default_factory=dict)
    histograms: dict[str, dict[str, Any]] = field(default_factory=dict)
    cache_config: dict[str, Any] = field(default_factory=dict)
    model_names: list[str] = field(default_factory=list)
    engines: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "families": dict(self.families),
            "empty": list(self.empty),
            "counters": dict(self.counters),
            "gauges": {k: dict(v) for k, v in self.gauges.items()},
            "histograms": {k: dict(v) for k, v in self.histograms.items()},
            "cache_config": dict(self.cache_config),
            "model_names": list(self.model_names),
            "engines": list(self.engines),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MetricsFacts:
        if not isinstance(data, Mapping) or "families" not in data:
            raise TypeError("expected metrics facts (the output of vllm_fleet.metrics.parse), got %s" % short(data, 80))
        return cls(
            families=dict(data.get("families") or {}),
            empty=list(data.get("empty") or []),
            counters=dict(data.get("counters") or {}),
            gauges={k: dict(v) for k, v in (data.get("gauges") or {}).items()},
            histograms={k: dict(v) for k, v in (data.get("histograms") or {}).items()},
            cache_config=dict(data.get("cache_config") or {}),
            model_names=list(data.get("model_names") or []),
            engines=list(data.get("engines") or []),
        )

    def counter(self, name: str) -> float | None:
        return self.counters.get(name)


def _facts(value: MetricsFacts | Mapping[str, Any]) -> MetricsFacts:
    if isinstance(value, MetricsFacts):
        return value
    return MetricsFacts.from_dict(value)


def _typed(raw: str) -> Any:
    """A label value as the Python value vLLM stringified (``str(True)``, ``str(None)``, numbers)."""
    if raw == "True":
        return True
    if raw == "False":
        return False
    if raw == "None":
        return None
    if _INT_RE.match(raw):
        return int(raw)
    if _FLOAT_RE.match(raw):
        return float(raw)
    if raw.startswith("[") and raw.endswith("]"):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def _le_value(le: str) -> float:
    return math.inf if le in ("+Inf", "Inf", "inf") else float(le)


def histogram_quantile(q: float, buckets: Iterable[Iterable[Any]]) -> float | None:
    """Estimate quantile ``q`` (0..1) from cumulative ``[le, count]`` buckets, as PromQL does.

    Linear interpolation inside the bucket that holds the rank; the first bucket's lower bound is 0;
    a rank in the ``+Inf`` bucket gives the highest finite bound. ``None`` when there are no
    observations.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError("quantile must be within 0..1, got %r" % (q,))
    points = sorted((_le_value(str(le)), float(count)) for le, count in buckets)
    if not points or not math.isinf(points[-1][0]):
        return None
    total = points[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for index, (le, count) in enumerate(points):
        if count >= rank:
            if math.isinf(le):
                return points[index - 1][0] if index > 0 else None
            if index == 0 and le <= 0:
                return le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return points[-2][0] if len(points) > 1 else None


def _summarise_histogram(count: float, total: float, buckets: list[list[Any]]) -> dict[str, Any]:
    return {
        "count": count,
        "sum": total,
        "mean": (total / count) if count else None,
        "buckets": buckets,
        "p50": histogram_quantile(0.5, buckets),
        "p90": histogram_quantile(0.9, buckets),
        "p99": histogram_quantile(0.99, buckets),
    }


def parse(text: str) -> MetricsFacts:
    """Parse the text of a /metrics page into :class:`MetricsFacts`.

    Raises :class:`MetricsParseError` when the text is not a Prometheus exposition (an HTML error page,
    a truncated line), naming what the parser rejected.
    """
    if not isinstance(text, str):
        raise MetricsParseError("metrics text must be a string, got %s" % type(text).__name__)
    facts = MetricsFacts()
    model_names: set[str] = set()
    engines: set[str] = set()
    # Imported here, not at the top: Ansible's filter plugins load this module in every worker process of every
    # task (tests/unit/plugins/test_plugin_imports.py), and prometheus_client's package costs about 0.13 s.
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError, IndexError, KeyError on bad input
        raise MetricsParseError("not a Prometheus text exposition: %s" % exc) from exc

    for family in families:
        if not family.samples:
            facts.empty.append(family.name)
            continue
        facts.families[family.name] = family.type
        if family.name.startswith("vllm:"):
            for sample in family.samples:
                if "model_name" in sample.labels:
                    model_names.add(sample.labels["model_name"])
                if "engine" in sample.labels:
                    engines.add(sample.labels["engine"])

        if family.type == "counter":
            facts.counters[family.name] = float(
                sum(s.value for s in family.samples if s.name == family.name + "_total")
            )
        elif family.type == "gauge":
            values = [s.value for s in family.samples if s.name == family.name]
            facts.gauges[family.name] = {
                "sum": float(sum(values)),
                "max": float(max(values)) if values else None,
                "series": len(values),
            }
            if family.name == CACHE_CONFIG_INFO and family.samples:
                first = sorted(family.samples, key=lambda s: _engine_key(s.labels.get("engine")))[0]
                facts.cache_config = {k: _typed(v) for k, v in sorted(first.labels.items())}
        elif family.type in ("histogram", "summary"):
            count = total = 0.0
            cumulative: dict[str, float] = {}
            for sample in family.samples:
                if sample.name == family.name + "_count":
                    count += sample.value
                elif sample.name == family.name + "_sum":
                    total += sample.value
                elif sample.name == family.name + "_bucket":
                    le = sample.labels.get("le", "+Inf")
                    cumulative[le] = cumulative.get(le, 0.0) + sample.value
            buckets = [[le, c] for le, c in sorted(cumulative.items(), key=lambda kv: _le_value(kv[0]))]
            facts.histograms[family.name] = _summarise_histogram(count, total, buckets)

    facts.model_names = sorted(model_names)
    facts.engines = sorted(engines, key=_engine_key)
    return facts


def _engine_key(engine: Any) -> tuple[int, str]:
    text = "" if engine is None else str(engine)
    return (int(text), "") if text.isdigit() else (1 << 30, text)


# --------------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------------


def required_families(speculative: bool = False) -> dict[str, str]:
    """The families that must be present, name -> type. Speculative ones only when speculation is on."""
    required = dict(_REQUIRED)
    if speculative:
        required.update(_REQUIRED_SPECULATIVE)
    return required


def check_families(facts: MetricsFacts | Mapping[str, Any], speculative: bool = False) -> list[str]:
    """Errors for required families that are missing or exported with another type."""
    facts = _facts(facts)
    errors = []
    for name, kind in required_families(speculative).items():
        found = facts.families.get(name)
        if found is None and name in facts.empty:
            errors.append("required metric family %s (%s) is declared on /metrics but has no samples" % (name, kind))
        elif found is None:
            why = " (speculative decoding is on)" if name in _REQUIRED_SPECULATIVE else ""
            errors.append("required metric family %s (%s) is missing from /metrics%s" % (name, kind, why))
        elif found != kind:
            errors.append("metric family %s is a %s, expected a %s" % (name, found, kind))
    return errors


def is_speculative(profile: Mapping[str, Any] | None, args: Iterable[str] | None = None) -> bool:
    """Whether a profile (or the rendered arguments) turns speculative decoding on.

    The profile's ``speculative`` dict (profiles.py), or ``speculative_config`` / the tuning reference's
    ``speculative_model`` in a hand-made profile; in the arguments, ``--speculative-config`` (0.33 and
    recent releases), ``--speculative-model`` (older ones) or the ``--spec-*`` shorthands.
    """
    profile = profile or {}
    for key in ("speculative", "speculative_config"):
        spec = profile.get(key)
        if isinstance(spec, str) and spec.strip().lower() in ("", "none", "null", "{}"):
            spec = None
        if spec:
            return True
    if profile.get("speculative_model") or profile.get("num_speculative_tokens"):
        return True
    for arg in args or ():
        flag = str(arg).split("=", 1)[0]
        if flag in (
            "--speculative-config",
            "-sc",
            "--speculative-model",
            "--spec-model",
            "--spec-method",
            "--spec-tokens",
        ):
            return True
    return False


_FP8_ALIASES = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3"}
_UNQUANTIZED_KV = {"auto", "bfloat16", "float16", "half", "float32", "float"}


def _norm_kv_dtype(value: Any) -> str:
    text = "auto" if value is None else str(value).strip().lower()
    return _FP8_ALIASES.get(text, text)


def _kv_dtype_matches(expected: Any, actual: Any) -> bool:
    """``auto`` means the model's own dtype: any unquantized KV dtype satisfies it.

    ``fp8`` is vLLM's alias of ``fp8_e4m3`` (on NVIDIA); other names must be equal.
    """
    want, got = _norm_kv_dtype(expected), _norm_kv_dtype(actual)
    if want == "auto":
        return got in _UNQUANTIZED_KV
    return want == got


def _as_bool(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    return None


def _num_equal(expected: Any, actual: Any, tolerance: float = 1e-6) -> bool:
    try:
        return abs(float(expected) - float(actual)) <= tolerance
    except (TypeError, ValueError):
        return False


def _flag_key(flag: str) -> str:
    key = str(flag).split("=", 1)[0].lstrip("-").replace("-", "_")
    return key[3:] if key.startswith("no_") else key


# profile key -> (cache_config_info label, comparison)
_READBACK = {
    "kv_cache_dtype": ("cache_dtype", _kv_dtype_matches),
    "enable_prefix_caching": ("enable_prefix_caching", lambda e, a: _as_bool(e) == _as_bool(a)),
    "gpu_memory_utilization": ("gpu_memory_utilization", _num_equal),
    "block_size": ("block_size", _num_equal),
    "kv_cache_memory_bytes": ("kv_cache_memory_bytes", _num_equal),
    "num_gpu_blocks_override": ("num_gpu_blocks_override", _num_equal),
}


def readback(
    facts: MetricsFacts | Mapping[str, Any],
    expected: Mapping[str, Any] | None,
    skip: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """Compare ``vllm:cache_config_info`` with the profile the host was meant to run.

    ``expected`` is the effective profile (snake_case engine-argument names). Only keys the profile
    sets are compared: ``kv_cache_dtype`` (with ``auto`` meaning "not quantized", ``fp8`` = ``fp8_e4m3``),
    ``enable_prefix_caching``, ``gpu_memory_utilization``, and ``block_size``, ``kv_cache_memory_bytes``,
    ``num_gpu_blocks_override`` when the profile gives them. ``skip`` names profile keys (or flags such
    as ``--kv-cache-dtype``) to leave out, e.g. the plan's dropped flags.

    Returns one drift per mismatch: ``{"key", "label", "expected", "actual", "message"}``.
    """
    facts = _facts(facts)
    expected = dict(expected or {})
    skipped = {_flag_key(s) for s in skip}
    wanted = {k: v for k, v in expected.items() if k in _READBACK and v is not None and k not in skipped}
    if not wanted:
        return []
    if not facts.cache_config:
        return [
            {
                "key": None,
                "label": CACHE_CONFIG_INFO,
                "expected": "present",
                "actual": None,
                "message": "%s is missing from /metrics: cannot read back %s"
                % (CACHE_CONFIG_INFO, ", ".join(sorted(wanted))),
            }
        ]
    drifts = []
    for key in sorted(wanted):
        label, same = _READBACK[key]
        want = wanted[key]
        got = facts.cache_config.get(label)
        if label not in facts.cache_config:
            message = "cache_config_info has no label %s (profile %s=%r)" % (label, key, want)
        elif same(want, got):
            continue
        else:
            message = "cache_config_info %s is %r, profile %s expects %r" % (label, got, key, want)
        drifts.append({"key": key, "label": label, "expected": want, "actual": got, "message": message})
    return drifts


def check(
    facts: MetricsFacts | Mapping[str, Any],
    speculative: bool = False,
    expected: Mapping[str, Any] | None = None,
    skip: Iterable[str] = (),
) -> list[str]:
    """All verification errors of one scrape: missing families, then read-back drifts."""
    errors = check_families(facts, speculative)
    errors.extend(d["message"] for d in readback(facts, expected, skip))
    return errors


def kv_prediction_error(predicted_tokens: Any, facts: MetricsFacts | Mapping[str, Any]) -> float | None:
    """The planner's error in percent: (predicted - actual) / actual * 100, rounded to 0.01.

    Positive means the planner promised more KV tokens than the engine allocated. ``actual`` is
    ``kv_cache_size_tokens`` of ``vllm:cache_config_info``. ``None`` when either side is unknown.
    """
    facts = _facts(facts)
    actual = facts.cache_config.get("kv_cache_size_tokens")
    if predicted_tokens is None or isinstance(predicted_tokens, bool) or actual in (None, 0):
        return None
    try:
        predicted = float(predicted_tokens)
        actual = float(actual)
    except (TypeError, ValueError):
        return None
    return round((predicted - actual) / actual * 100.0, 2)


# --------------------------------------------------------------------------------------------------
# Day-2 findings
# --------------------------------------------------------------------------------------------------


def _increase(after: float | None, before: float | None) -> float | None:
    """Counter increase with Prometheus' reset rule (a drop means the process restarted)."""
    if after is None:
        return None
    if before is None:
        return after
    return after - before if after >= before else after


def rates(
    before: MetricsFacts | Mapping[str, Any] | None,
    after: MetricsFacts | Mapping[str, Any],
    min_prefix_queries: float = DEFAULTS["min_prefix_queries"],
    min_draft_tokens: float = DEFAULTS["min_draft_tokens"],
) -> dict[str, Any]:
    """Prefix hit rate, speculative acceptance rate and preemption growth.

    Rates are taken over the window between the two scrapes when that window carries enough traffic
    (``min_prefix_queries`` queried tokens, ``min_draft_tokens`` draft tokens); otherwise over the
    totals since the engine started (``after`` alone), when those carry enough; otherwise they are
    ``None`` and the ``*_basis`` says ``"too little traffic"``.
    """
    after = _facts(after)
    before = _facts(before) if before is not None else None

    def pick(hits_name: str, total_name: str, minimum: float) -> tuple[float | None, float, str]:
        hits_after, total_after = after.counter(hits_name), after.counter(total_name)
        if hits_after is None or total_after is None:
            return None, 0.0, "not exported"
        if before is not None:
            hits = _increase(hits_after, before.counter(hits_name)) or 0.0
            total = _increase(total_after, before.counter(total_name)) or 0.0
            if total >= minimum and total > 0:
                return hits / total, total, "window"
        if total_after >= minimum and total_after > 0:
            return hits_after / total_after, total_after, "since start"
        return None, (total if before is not None else total_after), "too little traffic"

    hit_rate, queries, hit_basis = pick("vllm:prefix_cache_hits", "vllm:prefix_cache_queries", min_prefix_queries)
    acceptance, drafts, acc_basis = pick(
        "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_draft_tokens", min_draft_tokens
    )
    preempt_after = after.counter("vllm:num_preemptions")
    preemptions = None
    if before is not None and preempt_after is not None:
        preemptions = _increase(preempt_after, before.counter("vllm:num_preemptions"))
    return {
        "prefix_cache_hit_rate": None if hit_rate is None else round(hit_rate, 4),
        "prefix_cache_queries": queries,
        "prefix_cache_basis": hit_basis,
        "spec_acceptance_rate": None if acceptance is None else round(acceptance, 4),
        "spec_draft_tokens": drafts,
        "spec_acceptance_basis": acc_basis,
        "preemptions_increase": preemptions,
        "preemptions_total": preempt_after,
    }


def findings(
    before: MetricsFacts | Mapping[str, Any] | None,
    after: MetricsFacts | Mapping[str, Any],
    min_acceptance_rate: float = DEFAULTS["min_acceptance_rate"],
    min_draft_tokens: float = DEFAULTS["min_draft_tokens"],
    min_prefix_hit_rate: float = DEFAULTS["min_prefix_hit_rate"],
    min_prefix_queries: float = DEFAULTS["min_prefix_queries"],
    max_preemption_increase: float = DEFAULTS["max_preemption_increase"],
) -> list[dict[str, Any]]:
    """The tuning reference's diagnosis, from two scrapes (``before`` may be ``None``: then growth is unknown).

    Each finding: ``{"id", "severity", "value", "threshold", "basis", "message", "advice"}``. Findings
    are advice for day 2, not verification failures.
    """
    after_facts = _facts(after)
    r = rates(before, after_facts, min_prefix_queries=min_prefix_queries, min_draft_tokens=min_draft_tokens)
    found = []
    if r["spec_acceptance_rate"] is not None and r["spec_acceptance_rate"] < min_acceptance_rate:
        found.append(
            {
                "id": "spec_acceptance_low",
                "severity": "warning",
                "value": r["spec_acceptance_rate"],
                "threshold": min_acceptance_rate,
                "basis": r["spec_acceptance_basis"],
                "message": "speculative acceptance rate %.2f is below %.2f (%d draft tokens, %s)"
                % (r["spec_acceptance_rate"], min_acceptance_rate, r["spec_draft_tokens"], r["spec_acceptance_basis"]),
                "advice": "the drafter does not pay for itself: use a same-family draft, fewer speculative "
                "tokens, or turn speculation off (also for batches above ~32 requests)",
            }
        )
    if r["preemptions_increase"] is not None and r["preemptions_increase"] > max_preemption_increase:
        found.append(
            {
                "id": "preemptions_growing",
                "severity": "warning",
                "value": r["preemptions_increase"],
                "threshold": max_preemption_increase,
                "basis": "window",
                "message": "preemptions grew by %d between the two scrapes (total %d)"
                % (r["preemptions_increase"], r["preemptions_total"] or 0),
                "advice": "too many sequences for the KV cache: lower max_num_seqs or max_model_len, use "
                "an FP8 KV cache, or a more quantized model",
            }
        )
    prefix_on = after_facts.cache_config.get("enable_prefix_caching")
    if (
        prefix_on is not False
        and r["prefix_cache_hit_rate"] is not None
        and r["prefix_cache_hit_rate"] < min_prefix_hit_rate
    ):
        found.append(
            {
                "id": "prefix_hit_rate_low",
                "severity": "warning",
                "value": r["prefix_cache_hit_rate"],
                "threshold": min_prefix_hit_rate,
                "basis": r["prefix_cache_basis"],
                "message": "prefix cache hit rate %.0f%% is below %.0f%% (%d queried tokens, %s)"
                % (
                    r["prefix_cache_hit_rate"] * 100,
                    min_prefix_hit_rate * 100,
                    r["prefix_cache_queries"],
                    r["prefix_cache_basis"],
                ),
                "advice": "with a fixed system prompt this means the prompt varies (a timestamp, a date, "
                "a request id early in the prompt): move what varies to the end",
            }
        )
    return found


def window_latencies(
    before: MetricsFacts | Mapping[str, Any] | None, after: MetricsFacts | Mapping[str, Any]
) -> dict[str, Any]:
    """Server-side latencies of the requests that finished between two scrapes.

    Mean of each latency histogram over the window (``after - before``) and the number of requests in
    it (``requests``, from the e2e histogram). Around a lone smoke request that is its own latency;
    with other traffic it is the window's mean. Values are ``None`` when nothing finished.
    """
    after = _facts(after)
    before = _facts(before) if before is not None else MetricsFacts()
    out: dict[str, Any] = {}
    for key, name in _LATENCY_HISTOGRAMS.items():
        a, b = after.histograms.get(name), before.histograms.get(name) or {}
        if not a:
            out[key] = None
            continue
        count = _increase(a.get("count"), b.get("count")) or 0.0
        if a.get("count", 0) < b.get("count", 0):  # reset: the window is everything since restart
            total = a.get("sum") or 0.0
        else:
            total = (a.get("sum") or 0.0) - (b.get("sum") or 0.0)
        out[key] = round(total / count, 6) if count > 0 else None
        if key == "e2e_s":
            out["requests"] = count
    out.setdefault("requests", 0.0)
    return out
