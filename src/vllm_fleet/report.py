"""Per-host verification results and the rollout report (Markdown and JSON).

Three layers:

- :func:`host_entry` turns the raw probes of one host (the registered results of the ``uri`` calls and
  the health wait) into the host's verification result: the ``vllm_verify_result`` fact. Every check
  that fails adds a line to ``errors``; the role fails the host when there is any.
- Fragments: one small JSON file per host and event, written as the run goes (a host's verification,
  a rollout's load-loop measurements, a rollback). A rollout that stops on its canary still leaves its
  fragments behind. :func:`fragment` builds one, :func:`load_fragments` reads a run's folder.
- :func:`merge` folds fragments into one report; :func:`render_markdown` and :func:`write_report`
  write it. ``python -m vllm_fleet.report --merge reports/<run>`` does the same from a shell.

Fragment kinds the merge understands (``data`` is the payload):

- ``verify``: a :func:`host_entry` result. The latest one is the host's result; earlier ones are kept,
  summarised, under ``verify_attempts`` (a failed verification, a rollback, the verification after it).
- ``rollout``: measurements of a rollout load loop, merged into ``rollout``. Known keys:
  ``unhealthy_seconds`` (the host's measured unhealthy window), ``failed_requests``,
  ``total_requests``; others are shown as they are.
- ``rollback``: one event, appended to ``rollback``. Known keys: ``action`` (``restored``,
  ``rollback_failed``...), ``from``, ``to``, ``reason``, ``ok``.
- anything else is appended under ``events[<kind>]``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import email.utils
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

from vllm_fleet import metrics as _metrics

__all__ = [
    "REPORT_SCHEMA",
    "fragment",
    "fragment_name",
    "host_entry",
    "load_fragments",
    "main",
    "merge",
    "render_markdown",
    "unit_verdict",
    "version_matches",
    "write_report",
]

REPORT_SCHEMA = 1


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _status(result: Mapping[str, Any] | None) -> int | None:
    if not result:
        return None
    try:
        return int(result.get("status"))
    except (TypeError, ValueError):
        return None


def _http_error(what: str, result: Mapping[str, Any] | None) -> str | None:
    """``None`` when the probe answered 200, else a line naming the probe and what came back."""
    if not result:
        return "%s: not probed" % what
    if result.get("skipped"):
        return "%s: not probed (%s)" % (what, result.get("skip_reason") or "skipped")
    status = _status(result)
    if status == 200:
        return None
    detail = str(result.get("msg") or "").strip()
    if status in (None, -1):
        return "%s: no answer (%s)" % (what, detail or "connection failed")
    return "%s: HTTP %s%s" % (what, status, " (%s)" % detail if detail else "")


def version_matches(pinned: str, reported: str) -> bool:
    """``/version`` equals the pinned version; a PEP 440 local label (``0.32.0+cpu``) is ignored."""
    if not pinned or not reported:
        return False
    return str(reported).strip().split("+", 1)[0] == str(pinned).strip().split("+", 1)[0]


def _json_body(result: Mapping[str, Any] | None) -> Any:
    if not result:
        return None
    body = result.get("json")
    if body is None and isinstance(result.get("content"), str):
        try:
            body = json.loads(result["content"])
        except ValueError:
            body = None
    return body


def _metrics_facts(
    what: str, result: Mapping[str, Any] | None, errors: list[str] | None
) -> _metrics.MetricsFacts | None:
    """Parse a /metrics probe; record why not in ``errors`` (when given)."""
    if result and "families" in result:
        return _metrics.MetricsFacts.from_dict(result)
    problem = _http_error(what, result)
    if problem is None:
        try:
            return _metrics.parse(result.get("content") or "")
        except _metrics.MetricsParseError as exc:
            problem = "%s: %s" % (what, exc)
    if errors is not None:
        errors.append(problem)
    return None


def unit_verdict(show_output: str, unit: str, max_restarts: int = 0) -> dict[str, Any]:
    """Judge ``systemctl show --property=LoadState,ActiveState,SubState,Result,NRestarts UNIT``.

    Returns the properties, ``restarts`` (``NRestarts``, plus one while the unit waits in
    ``auto-restart``: it has crashed once more than the counter says yet) and ``error``: ``""`` while the
    unit may still become healthy, else why waiting longer is pointless (not installed, failed,
    stopped, or more than ``max_restarts`` restarts: a crash loop). systemd sets ``NRestarts`` back to
    0 when the unit is stopped and started, so after a rollout's restart every crash counts.
    """
    props: dict[str, Any] = {}
    for line in str(show_output or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    try:
        restarts = int(props.get("NRestarts") or 0)
    except ValueError:
        restarts = 0
    if props.get("SubState") == "auto-restart":
        restarts += 1
    props["restarts"] = restarts
    props["unit"] = unit
    active, sub, result = props.get("ActiveState", ""), props.get("SubState", "?"), props.get("Result", "?")
    if props.get("LoadState") == "not-found":
        error = "unit %s is not installed" % unit
    elif active == "failed":
        error = "unit %s failed (Result=%s, %d restarts)" % (unit, result, restarts)
    elif active in ("inactive", "deactivating"):
        error = "unit %s is not running (%s/%s, Result=%s)" % (unit, active, sub, result)
    elif restarts > int(max_restarts):
        error = "unit %s is crash-looping: %d restarts (at most %d allowed), last Result=%s" % (
            unit, restarts, int(max_restarts), result)
    else:
        error = ""
    props["error"] = error
    return props


def crashed_after_start(health: Mapping[str, Any], unit_after: Mapping[str, Any] | None) -> str | None:
    """Why the release counts as crashed after it answered /health, or ``None``.

    ``unit_after`` is :func:`unit_verdict` of the unit read after the probes. vLLM's API server exits (with
    status 0) when its engine dies, and the unit restarts it: a restart counter above the one the health
    wait saw, or a unit no longer running, is a crash after start, not a slow start.
    """
    if not health.get("ok") or not unit_after:
        return None
    try:
        before = int(health.get("restarts") or 0)
    except (TypeError, ValueError):
        before = 0
    after = int(unit_after.get("restarts") or 0)
    unit = unit_after.get("unit") or "the unit"
    if after > before:
        return ("crashed after start: %s answered /health, then exited and was restarted %d time(s) during the "
                "probes (Result=%s); see its journal" % (unit, after - before, unit_after.get("Result", "?")))
    if unit_after.get("ActiveState") not in (None, "active", "activating", "reloading"):
        return "crashed after start: %s answered /health, then stopped (%s/%s, Result=%s)" % (
            unit, unit_after.get("ActiveState"), unit_after.get("SubState", "?"), unit_after.get("Result", "?"))
    return None


def _startup_seconds(health: Mapping[str, Any], after: _metrics.MetricsFacts | None) -> float | None:
    """Seconds from the API server's process start to the first 200 of /health, both on the host's clock.

    The 200's ``Date`` header (1 s resolution) minus ``process_start_time_seconds`` of the scrape. Only
    when the wait really waited (a service already up when the wait began says nothing about its
    start-up) and the process did not restart since.
    """
    if not health.get("ok") or health.get("already_up") or not health.get("healthy_date") or after is None:
        return None
    started = (after.gauges.get("process_start_time_seconds") or {}).get("max")
    if started is None:
        return None
    try:
        healthy_at = email.utils.parsedate_to_datetime(str(health["healthy_date"])).timestamp()
    except (TypeError, ValueError):
        return None
    seconds = healthy_at - float(started)
    return round(seconds, 1) if seconds >= -1 else None


def _num(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def host_entry(
    host: str,
    probes: Mapping[str, Any],
    expect: Mapping[str, Any],
    thresholds: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The verification result of one host.

    ``probes`` (registered results; any may be missing or skipped):
      ``health``: ``{"ok", "seconds", "restarts", "active_state", "sub_state", "error"}``;
      ``version``, ``models``, ``smoke``: ``uri`` results (``status``, ``json``, ``msg``, ``elapsed``);
      ``metrics_before``, ``metrics_after``: ``uri`` results with ``content`` (or parsed facts).
    ``expect``:
      ``vllm_version`` (pinned), ``served_model_name`` (``""``: take what /v1/models lists),
      ``profile_name``, ``profile`` (the effective profile dict or ``None``), ``extra_args``
      (``vllm_extra_args``: its ``block_size``, ``kv_cache_memory_bytes``... are read back too),
      ``plan`` (the planner's host entry, or the whole plan with ``hosts``, or ``None``),
      ``speculative`` (``None``: from the profile/plan), ``latency_budget_s``,
      ``smoke_requests`` (how many smoke requests were sent, default 1), ``readback`` (default true),
      ``fail_on_findings`` (default false), and ``unit``/``url`` (shown in the report).
    ``thresholds``: keyword arguments of :func:`vllm_fleet.metrics.findings`.
    """
    thresholds = dict(thresholds or {})
    errors: list[str] = []
    warnings: list[str] = []
    profile = expect.get("profile") or None
    plan = expect.get("plan") or None
    if plan and isinstance(plan.get("hosts"), Mapping):  # the whole plan (vllm_plan of the plan role)
        plan = plan["hosts"].get(host) or None
    plan_args = (plan or {}).get("args") or []

    # health -------------------------------------------------------------------------------------
    health = dict(probes.get("health") or {})
    if health.get("skipped"):
        warnings.append("health wait skipped (%s)" % (health.get("skip_reason") or "skipped"))
    elif not health.get("ok"):
        errors.append("health: %s" % (health.get("error") or "/health did not answer 200"))
    if probes.get("aborted"):
        errors.append("verification stopped: %s" % str(probes["aborted"]).strip())
    crash = crashed_after_start(health, probes.get("unit_after"))
    if crash:
        errors.append(crash)
    # When the service never became healthy the API probes are skipped: that is one error (health),
    # not one per probe.
    health_failed = bool(errors)
    not_probed = [
        name for name in ("version", "models", "smoke", "metrics_before", "metrics_after")
        if not probes.get(name) or (probes.get(name) or {}).get("skipped")
    ]
    if health_failed and not_probed:
        warnings.append("not probed because of the errors above: %s" % ", ".join(not_probed))

    def http_error(what: str, name: str) -> str | None:
        if health_failed and name in not_probed:
            return None
        return _http_error(what, probes.get(name))

    # version ------------------------------------------------------------------------------------
    pinned = str(expect.get("vllm_version") or "")
    version_body = _json_body(probes.get("version")) or {}
    reported = version_body.get("version") if isinstance(version_body, Mapping) else None
    version_error = http_error("/version", "version")
    if version_error:
        errors.append(version_error)
    elif "version" in not_probed:
        pass
    elif not pinned:
        warnings.append("vllm_version is not set: /version reports %s, not compared" % reported)
    elif not version_matches(pinned, reported):
        errors.append("/version reports %r, the pinned vllm_version is %r" % (reported, pinned))

    # models -------------------------------------------------------------------------------------
    served = str(expect.get("served_model_name") or "")
    models_body = _json_body(probes.get("models")) or {}
    model_ids = [
        str(m.get("id"))
        for m in (models_body.get("data") or [] if isinstance(models_body, Mapping) else [])
        if isinstance(m, Mapping)
    ]
    models_error = http_error("/v1/models", "models")
    if models_error:
        errors.append(models_error)
    elif "models" in not_probed:
        pass
    elif not model_ids:
        errors.append("/v1/models lists no model")
    elif served and served not in model_ids:
        errors.append("/v1/models lists %s, not the served name %r" % (model_ids, served))
    elif not served:
        warnings.append("no served model name configured: used %r from /v1/models" % model_ids[0])
        served = model_ids[0]

    # metrics ------------------------------------------------------------------------------------
    before = _metrics_facts("/metrics (before the smoke request)", probes.get("metrics_before"), None)
    if before is None and "metrics_before" not in not_probed:
        warnings.append("the first /metrics scrape failed: findings use totals since start")
    after = (
        None if health_failed and "metrics_after" in not_probed
        else _metrics_facts("/metrics", probes.get("metrics_after"), errors)
    )
    health["startup_s"] = _startup_seconds(health, after)
    speculative = expect.get("speculative")
    if speculative is None:
        speculative = _metrics.is_speculative(profile, plan_args)
    speculative = bool(speculative)

    missing: list[str] = []
    drifts: list[dict[str, Any]] = []
    readback_state = "not done"
    if after is not None:
        missing = _metrics.check_families(after, speculative)
        errors.extend(missing)
        if not expect.get("readback", True):
            readback_state = "skipped: vllm_verify_readback is false"
        elif not profile:
            readback_state = "skipped: no vllm_profile_effective fact on this host (run the planning role first)"
        else:
            dropped = [d.get("flag", "") for d in (plan or {}).get("dropped") or [] if isinstance(d, Mapping)]
            wanted = dict(profile)
            wanted.update(expect.get("extra_args") or {})
            drifts = _metrics.readback(after, wanted, skip=dropped)
            errors.extend("read-back: %s" % d["message"] for d in drifts)
            readback_state = "drift" if drifts else "matches the profile"
    if readback_state.startswith("skipped"):
        warnings.append("cache_config_info read-back %s" % readback_state)

    # smoke request ------------------------------------------------------------------------------
    smoke_result = probes.get("smoke")
    smoke_body = _json_body(smoke_result) or {}
    usage = smoke_body.get("usage") or {} if isinstance(smoke_body, Mapping) else {}
    choices = smoke_body.get("choices") or [] if isinstance(smoke_body, Mapping) else []
    budget = _num(expect.get("latency_budget_s"))
    server = _metrics.window_latencies(before, after) if after is not None else {}
    smoke_requests = int(expect.get("smoke_requests") or 1)
    client_elapsed = _num((smoke_result or {}).get("elapsed"))
    server_e2e = server.get("e2e_s")
    latency = max(v for v in (server_e2e, client_elapsed) if v is not None) if (
        server_e2e is not None or client_elapsed is not None
    ) else None
    smoke = {
        "status": _status(smoke_result),
        "model": served or None,
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "finish_reason": (choices[0].get("finish_reason") if choices and isinstance(choices[0], Mapping) else None),
        "client_elapsed_s": client_elapsed,
        "server": server,
        "server_window_requests": server.get("requests"),
        "latency_s": latency,
        "budget_s": budget,
    }
    smoke_error = http_error("smoke chat completion", "smoke")
    if smoke_error:
        errors.append(smoke_error)
    elif "smoke" in not_probed:
        pass
    elif not choices or not usage.get("completion_tokens"):
        errors.append("smoke chat completion: the answer has no generated tokens (%s)" % _short(smoke_body))
    elif budget is not None and latency is not None and latency > budget:
        errors.append(
            "smoke chat completion took %.3f s, over the latency budget of %.3f s" % (latency, budget)
        )
    if server.get("requests") and server["requests"] > smoke_requests:
        warnings.append(
            "server-side latencies are the mean of %d requests finished between the scrapes, not the "
            "smoke request alone" % server["requests"]
        )

    # KV cache, planner, findings ----------------------------------------------------------------
    cache = after.cache_config if after is not None else {}
    predicted = ((plan or {}).get("capacity") or {}).get("kv_cache_tokens")
    kv_cache = {
        "tokens": cache.get("kv_cache_size_tokens"),
        "memory_bytes": cache.get("kv_cache_memory_bytes"),
        "num_gpu_blocks": cache.get("num_gpu_blocks"),
        "block_size": cache.get("block_size"),
        "max_concurrency": cache.get("kv_cache_max_concurrency"),
        "cache_dtype": cache.get("cache_dtype"),
        "enable_prefix_caching": cache.get("enable_prefix_caching"),
        "gpu_memory_utilization": cache.get("gpu_memory_utilization"),
        "predicted_tokens": predicted,
        "prediction_error_pct": _metrics.kv_prediction_error(predicted, after) if after is not None else None,
    }
    found = _metrics.findings(before, after, **thresholds) if after is not None else []
    rates = (
        _metrics.rates(
            before,
            after,
            **{k: thresholds[k] for k in ("min_prefix_queries", "min_draft_tokens") if k in thresholds},
        )
        if after is not None
        else {}
    )
    if expect.get("fail_on_findings"):
        errors.extend("finding: %s" % f["message"] for f in found)

    return {
        "host": host,
        "ok": not errors,
        "errors": errors,
        "warnings": warnings,
        "checked_at": _now(),
        "url": expect.get("url"),
        "unit": expect.get("unit"),
        "version": {"pinned": pinned or None, "reported": reported},
        # The card the plan sized the host for: the detected one on GPU hosts (site.yml plans them again).
        "gpu": (plan or {}).get("gpu"),
        "profile": {
            "name": expect.get("profile_name") or (plan or {}).get("profile"),
            "readback": readback_state,
            "drifts": drifts,
            "speculative": speculative,
        },
        "health": health,
        "served_model_name": served or None,
        "models": model_ids,
        "smoke": smoke,
        "metrics": {
            "families": len(after.families) if after is not None else 0,
            "missing": missing,
            "model_names": after.model_names if after is not None else [],
        },
        "kv_cache": kv_cache,
        "rates": rates,
        "findings": found,
    }


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, sort_keys=True, default=str) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------------------------------------
# Fragments and the merged report
# ------------------------------------------------------------------------------------------------


def fragment(host: str, kind: str, data: Mapping[str, Any], recorded_at: str | None = None) -> dict[str, Any]:
    """One host event for the report: ``{"host", "kind", "recorded_at", "data"}``."""
    if not host or not isinstance(host, str):
        raise ValueError("fragment host must be a non-empty string, got %r" % (host,))
    if not kind or not isinstance(kind, str) or not kind.replace("_", "").isalnum():
        raise ValueError("fragment kind must be a word such as verify, rollout or rollback, got %r" % (kind,))
    if not isinstance(data, Mapping):
        raise ValueError("fragment data for %s must be a dict, got %s" % (host, type(data).__name__))
    return {"host": host, "kind": kind, "recorded_at": recorded_at or _now(), "data": dict(data)}


def fragment_name(frag: Mapping[str, Any]) -> str:
    """A file name that sorts in time order and is unique per host and event."""
    stamp = "".join(ch for ch in str(frag["recorded_at"]) if ch.isalnum())
    host = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in str(frag["host"]))
    return "%s--%s--%s.json" % (stamp, host, frag["kind"])


def load_fragments(folder: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read the fragments of one run (``<run>/hosts/*.json``, or ``*.json`` in the folder itself)."""
    base = Path(folder)
    paths = sorted((base / "hosts").glob("*.json")) if (base / "hosts").is_dir() else sorted(base.glob("*.json"))
    out = []
    for path in paths:
        if path.name in ("report.json",):
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ValueError("fragment %s is not JSON: %s" % (path, exc)) from exc
        if not isinstance(data, Mapping) or not {"host", "kind", "data"} <= set(data):
            raise ValueError("fragment %s lacks host/kind/data" % path)
        out.append(dict(data))
    return out


def merge(
    fragments: Iterable[Mapping[str, Any]],
    run_id: str | None = None,
    meta: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Fold fragments (in time order) into one report."""
    ordered = sorted(fragments, key=lambda f: (str(f.get("recorded_at") or ""), str(f.get("host"))))
    hosts: dict[str, dict[str, Any]] = {}
    for frag in ordered:
        host = str(frag["host"])
        kind = str(frag["kind"])
        data = dict(frag.get("data") or {})
        entry = hosts.setdefault(host, {"host": host})
        if kind == "verify":
            attempts = entry.get("verify_attempts", [])
            attempts.append(
                {"checked_at": data.get("checked_at") or frag.get("recorded_at"), "ok": data.get("ok"),
                 "errors": data.get("errors") or []}
            )
            keep = {k: entry[k] for k in ("rollout", "rollback", "events") if k in entry}
            entry.clear()
            entry.update(data)
            entry.update(keep)
            entry["host"] = host
            entry["verify_attempts"] = attempts
        elif kind == "rollout":
            entry.setdefault("rollout", {}).update(data)
        elif kind == "rollback":
            event = dict(data)
            event.setdefault("at", frag.get("recorded_at"))
            entry.setdefault("rollback", []).append(event)
        else:
            event = dict(data)
            event.setdefault("at", frag.get("recorded_at"))
            entry.setdefault("events", {}).setdefault(kind, []).append(event)

    verified = [h for h, e in hosts.items() if "ok" in e]
    summary = {
        "hosts": len(hosts),
        "verified": len(verified),
        "ok": sorted(h for h in verified if hosts[h]["ok"]),
        "failed": sorted(h for h in verified if not hosts[h]["ok"]),
        "rolled_back": sorted(h for h, e in hosts.items() if e.get("rollback")),
        "findings": sum(len(e.get("findings") or []) for e in hosts.values()),
    }
    return {
        "schema": REPORT_SCHEMA,
        "run_id": run_id,
        "generated_at": _now(),
        "meta": dict(meta or {}),
        "summary": summary,
        "hosts": {h: hosts[h] for h in sorted(hosts)},
    }


def _fmt(value: Any, unit: str = "", digits: int = 3) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        text = ("%.*f" % (digits, value)).rstrip("0").rstrip(".") if not value.is_integer() else "%d" % value
    else:
        text = str(value)
    return text + unit


def _startup_cell(health: Mapping[str, Any]) -> str:
    if health.get("startup_s") is not None:
        return _fmt(health["startup_s"], " s", 1)
    if health.get("already_up"):
        return "up before"
    return "-"


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def render_markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown: a summary table, then one section per host."""
    hosts: Mapping[str, Mapping[str, Any]] = report.get("hosts") or {}
    summary = report.get("summary") or {}
    lines = ["# vLLM rollout report: %s" % (report.get("run_id") or "run"), ""]
    lines.append("Generated %s. Hosts: %d; verified ok: %d; failed: %s; rolled back: %s; findings: %d." % (
        report.get("generated_at") or "-",
        summary.get("hosts", len(hosts)),
        len(summary.get("ok") or []),
        ", ".join(summary.get("failed") or []) or "none",
        ", ".join(summary.get("rolled_back") or []) or "none",
        summary.get("findings", 0),
    ))
    for key, value in sorted((report.get("meta") or {}).items()):
        lines.append("- %s: %s" % (key, _cell(value)))
    lines.append("")
    with_rollout = any(e.get("rollout") for e in hosts.values())
    header = ["host", "result", "vLLM", "profile", "start-up", "restarts", "smoke latency",
              "TTFT", "KV tokens", "planner error", "findings"]
    if with_rollout:
        header += ["unhealthy window", "failed requests"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for name, e in hosts.items():
        health = e.get("health") or {}
        smoke = e.get("smoke") or {}
        kv = e.get("kv_cache") or {}
        result = "-" if "ok" not in e else ("ok" if e["ok"] else "FAILED")
        if e.get("rollback"):
            result += ", rolled back"
        row = [
            name,
            result,
            _fmt((e.get("version") or {}).get("reported")),
            _fmt((e.get("profile") or {}).get("name")),
            _startup_cell(health),
            _fmt(health.get("restarts")),
            _fmt(smoke.get("latency_s"), " s"),
            _fmt((smoke.get("server") or {}).get("ttft_s"), " s", 4),
            _fmt(kv.get("tokens")),
            _fmt(kv.get("prediction_error_pct"), " %", 2),
            _fmt(len(e.get("findings") or [])) if "ok" in e else "-",
        ]
        if with_rollout:
            rollout = e.get("rollout") or {}
            row += [_fmt(rollout.get("unhealthy_seconds"), " s", 1),
                    "%s / %s" % (_fmt(rollout.get("failed_requests")), _fmt(rollout.get("total_requests")))
                    if rollout else "-"]
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    lines.append("")

    for name, e in hosts.items():
        lines.append("## %s" % name)
        lines.append("")
        if "ok" in e:
            version = e.get("version") or {}
            profile = e.get("profile") or {}
            health = e.get("health") or {}
            smoke = e.get("smoke") or {}
            server = smoke.get("server") or {}
            kv = e.get("kv_cache") or {}
            lines.append("- result: %s (checked %s)" % ("ok" if e["ok"] else "FAILED", e.get("checked_at")))
            lines.append("- endpoint: %s, unit %s" % (_fmt(e.get("url")), _fmt(e.get("unit"))))
            lines.append("- vLLM: %s (pinned %s)" % (_fmt(version.get("reported")), _fmt(version.get("pinned"))))
            lines.append("- profile: %s; read-back: %s; speculative decoding: %s" % (
                _fmt(profile.get("name")), profile.get("readback", "-"), _fmt(profile.get("speculative"))))
            lines.append("- health: %s; start-up %s; waited %s (%s probes in %s rounds); %s restarts, unit %s" % (
                "healthy" if health.get("ok") else "NOT healthy", _startup_cell(health),
                _fmt(health.get("waited_s"), " s", 1), _fmt(health.get("attempts")), _fmt(health.get("rounds")),
                _fmt(health.get("restarts")), _fmt(health.get("active_state"))))
            lines.append("- served model: %s (listed: %s)" % (
                _fmt(e.get("served_model_name")), ", ".join(e.get("models") or []) or "-"))
            lines.append(
                "- smoke request: HTTP %s, %s prompt / %s completion tokens, latency %s (budget %s); "
                "server side over %s request(s): e2e %s, TTFT %s, queue %s, prefill %s, decode %s, "
                "inter-token %s; client %s" % (
                    _fmt(smoke.get("status")), _fmt(smoke.get("prompt_tokens")),
                    _fmt(smoke.get("completion_tokens")), _fmt(smoke.get("latency_s"), " s"),
                    _fmt(smoke.get("budget_s"), " s"), _fmt(server.get("requests")),
                    _fmt(server.get("e2e_s"), " s", 4), _fmt(server.get("ttft_s"), " s", 4),
                    _fmt(server.get("queue_s"), " s", 4), _fmt(server.get("prefill_s"), " s", 4),
                    _fmt(server.get("decode_s"), " s", 4), _fmt(server.get("inter_token_s"), " s", 4),
                    _fmt(smoke.get("client_elapsed_s"), " s (whole seconds)")))
            lines.append(
                "- KV cache: %s tokens, %s blocks of %s, dtype %s, %s bytes, max concurrency %s, "
                "prefix caching %s, gpu_memory_utilization %s; planner predicted %s (error %s)" % (
                    _fmt(kv.get("tokens")), _fmt(kv.get("num_gpu_blocks")), _fmt(kv.get("block_size")),
                    _fmt(kv.get("cache_dtype")), _fmt(kv.get("memory_bytes")), _fmt(kv.get("max_concurrency"), "", 2),
                    _fmt(kv.get("enable_prefix_caching")), _fmt(kv.get("gpu_memory_utilization")),
                    _fmt(kv.get("predicted_tokens")), _fmt(kv.get("prediction_error_pct"), " %", 2)))
            rates = e.get("rates") or {}
            if rates:
                lines.append(
                    "- rates: prefix cache hit rate %s (%s queried tokens, %s), speculative acceptance %s "
                    "(%s), preemptions +%s (total %s)" % (
                        _fmt(rates.get("prefix_cache_hit_rate"), "", 3), _fmt(rates.get("prefix_cache_queries")),
                        rates.get("prefix_cache_basis", "-"), _fmt(rates.get("spec_acceptance_rate"), "", 3),
                        rates.get("spec_acceptance_basis", "-"), _fmt(rates.get("preemptions_increase")),
                        _fmt(rates.get("preemptions_total"))))
            for title, items in (("Errors", e.get("errors")), ("Warnings", e.get("warnings"))):
                if items:
                    lines.append("")
                    lines.append("%s:" % title)
                    lines.extend("- %s" % _cell(i) for i in items)
            if e.get("findings"):
                lines.append("")
                lines.append("Findings:")
                lines.extend("- %s: %s. %s." % (f.get("id"), f.get("message"), f.get("advice"))
                             for f in e["findings"])
            attempts = e.get("verify_attempts") or []
            if len(attempts) > 1:
                lines.append("")
                lines.append("Verification attempts:")
                lines.extend("- %s: %s%s" % (a.get("checked_at"), "ok" if a.get("ok") else "FAILED",
                                             ": " + "; ".join(a["errors"]) if a.get("errors") else "")
                             for a in attempts)
        else:
            lines.append("- not verified in this run")
        if e.get("rollout"):
            lines.append("")
            lines.append("Rollout load loop:")
            lines.extend("- %s: %s" % (k, _cell(_fmt(v))) for k, v in sorted(e["rollout"].items()))
        if e.get("rollback"):
            lines.append("")
            lines.append("Rollback events:")
            for ev in e["rollback"]:
                rest = {k: v for k, v in ev.items() if k not in ("at", "action", "reason")}
                lines.append("- %s %s: %s%s" % (
                    ev.get("at"), ev.get("action", "rollback"), _cell(ev.get("reason") or "-"),
                    " (%s)" % ", ".join("%s=%s" % (k, _cell(v)) for k, v in sorted(rest.items())) if rest else ""))
        for kind, events in sorted((e.get("events") or {}).items()):
            lines.append("")
            lines.append("%s events:" % kind)
            lines.extend("- %s" % _cell(json.dumps(ev, sort_keys=True, default=str)) for ev in events)
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write_report(report: Mapping[str, Any], out_dir: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write ``report.json`` and ``report.md`` into ``out_dir``; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "report.json", out / "report.md"
    json_path.write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    md_path.write_text(render_markdown(report), encoding="utf-8")
    return json_path, md_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_fleet.report",
        description="Merge the per-host fragments of a run (reports/<run>/hosts/*.json) into report.json "
        "and report.md.",
    )
    parser.add_argument("--merge", metavar="RUN_DIR", required=True, help="the run folder holding hosts/*.json")
    parser.add_argument("--out", metavar="DIR", help="where to write the report (default: RUN_DIR)")
    parser.add_argument("--run-id", help="the run's name in the report (default: RUN_DIR's name)")
    parser.add_argument("--print", dest="show", action="store_true", help="also print the Markdown")
    args = parser.parse_args(argv)
    run_dir = Path(args.merge)
    if not run_dir.is_dir():
        parser.error("%s is not a folder" % run_dir)
    try:
        frags = load_fragments(run_dir)
    except ValueError as exc:
        print("error: %s" % exc, file=sys.stderr)
        return 2
    if not frags:
        print("error: no fragments in %s (expected hosts/*.json)" % run_dir, file=sys.stderr)
        return 2
    report = merge(frags, run_id=args.run_id or run_dir.resolve().name)
    json_path, md_path = write_report(report, args.out or run_dir)
    if args.show:
        sys.stdout.write(render_markdown(report))
    print("wrote %s and %s (%d hosts, failed: %s)" % (
        json_path, md_path, report["summary"]["hosts"], ", ".join(report["summary"]["failed"]) or "none"),
        file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
