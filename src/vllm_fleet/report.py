"""Per-instance verification results and the rollout report (Markdown and JSON).

The results it renders are :func:`vllm_fleet.verdict.host_entry`'s, one per vLLM instance (a host runs one per
GPU or tensor-parallel group), keyed ``host/instance``. Two layers:

- Fragments: one small JSON file per instance and event, written as the run goes (an instance's verification,
  a rollout's load-loop measurements, a rollback). A rollout that stops on its canary still leaves its
  fragments behind. :func:`fragment` builds one, :func:`load_fragments` reads a run's folder.
- :func:`merge` folds fragments into one report; :func:`render_markdown` and :func:`write_report`
  write it. ``python -m vllm_fleet.report --merge reports/<run>`` does the same from a shell.

Fragment kinds the merge understands (``data`` is the payload):

- ``verify``: a :func:`vllm_fleet.verdict.host_entry` result. The latest one is the host's result; earlier
  ones are kept, summarised, under ``verify_attempts`` (a failed verification, a rollback, the verification
  after it).
- ``rollout``: measurements of a rollout load loop, merged into ``rollout``. Known keys:
  ``unhealthy_seconds`` (the host's measured unhealthy window), ``failed_requests``,
  ``total_requests``; others are shown as they are.
- ``rollback``: one event, appended to ``rollback``. Known keys: ``action`` (``restored``,
  ``rollback_failed``...), ``from``, ``to``, ``reason``, ``ok``.
- anything else is appended under ``events[<kind>]`` (``benchmark``: playbooks/benchmark.yml's measurement;
  ``diagnose``: playbooks/diagnose.yml's day-2 window, whose findings the summary counts).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

__all__ = [
    "REPORT_SCHEMA",
    "fragment",
    "fragment_name",
    "load_fragments",
    "main",
    "merge",
    "render_markdown",
    "write_report",
]

REPORT_SCHEMA = 1


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def fragment(host: str, kind: str, data: Mapping[str, Any], recorded_at: str | None = None,
             instance: str | None = None) -> dict[str, Any]:
    """One event of an instance for the report: ``{"host", "instance", "kind", "recorded_at", "data"}``."""
    if not host or not isinstance(host, str):
        raise ValueError("fragment host must be a non-empty string, got %r" % (host,))
    if not kind or not isinstance(kind, str) or not kind.replace("_", "").isalnum():
        raise ValueError("fragment kind must be a word such as verify, rollout or rollback, got %r" % (kind,))
    if not isinstance(data, Mapping):
        raise ValueError("fragment data for %s must be a dict, got %s" % (host, type(data).__name__))
    if instance is not None and (not isinstance(instance, str) or not instance):
        raise ValueError("fragment instance of %s must be a name, got %r" % (host, instance))
    return {"host": host, "instance": instance, "kind": kind, "recorded_at": recorded_at or _now(), "data": dict(data)}


def key(frag: Mapping[str, Any]) -> str:
    """Where a fragment lands in the report: ``host/instance`` (a rollout probe's fragment names its target so)."""
    return "%s/%s" % (frag["host"], frag["instance"]) if frag.get("instance") else str(frag["host"])


def fragment_name(frag: Mapping[str, Any]) -> str:
    """A file name that sorts in time order and is unique per instance and event."""
    stamp = "".join(ch for ch in str(frag["recorded_at"]) if ch.isalnum())
    who = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in key(frag))
    return "%s--%s--%s.json" % (stamp, who, frag["kind"])


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
    ordered = sorted(fragments, key=lambda f: (str(f.get("recorded_at") or ""), key(f)))
    hosts: dict[str, dict[str, Any]] = {}
    for frag in ordered:
        host = key(frag)
        kind = str(frag["kind"])
        data = dict(frag.get("data") or {})
        entry = hosts.setdefault(host, {"host": str(frag["host"]), "instance": frag.get("instance")})
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
            entry["host"], entry["instance"] = str(frag["host"]), frag.get("instance")
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
        "findings": sum(len(e.get("findings") or [])
                        + len((((e.get("events") or {}).get("diagnose") or [{}])[-1]).get("findings") or [])
                        for e in hosts.values()),
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
    header = ["instance", "result", "vLLM", "profile", "start-up", "restarts", "smoke latency",
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
            lines.append("- health: %s; start-up %s; waited %s (%s probes); %s restarts, unit %s" % (
                "healthy" if health.get("ok") else "NOT healthy", _startup_cell(health),
                _fmt(health.get("waited_s"), " s", 1), _fmt(health.get("attempts")),
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
    """Write ``report.json``, ``report.md`` and ``report.html`` (:mod:`vllm_fleet.report_html`) into ``out_dir``;
    return the first two's paths."""
    from .report_html import render_html  # matplotlib: loaded only where a page is written

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "report.json", out / "report.md"
    json_path.write_text(json.dumps(report, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    md_path.write_text(render_markdown(report), encoding="utf-8")
    (out / "report.html").write_text(render_html(report), encoding="utf-8")
    return json_path, md_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vllm_fleet.report",
        description="Merge the per-host fragments of a run (reports/<run>/hosts/*.json) into report.json, "
        "report.md and report.html.",
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
    print("wrote %s, %s and report.html (%d hosts, failed: %s)" % (
        json_path, md_path, report["summary"]["hosts"], ", ".join(report["summary"]["failed"]) or "none"),
        file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
