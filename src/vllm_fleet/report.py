"""The rollout report, rendered: Markdown here, the page with plots in :mod:`vllm_fleet.report_html`.

It renders what :func:`vllm_fleet.fragments.merge` folded from a run's fragments:
:func:`vllm_fleet.verdict.host_entry`'s results, one per vLLM instance (a host runs one per GPU or tensor-parallel
group), keyed ``host/instance``, with the run's rollout measurements, rollbacks and events. :func:`write_report`
writes report.json, report.md and report.html; ``python -m vllm_fleet.report --merge reports/<run>`` merges and
writes a run's report from a shell.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .fragments import load_fragments, merge

__all__ = ["main", "render_markdown", "write_report"]


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


def _kv_error_cell(kv: Mapping[str, Any]) -> str:
    """The planner's error against the start the engine's KV cache matches (first start, warm restart), or
    the band it is outside of; a result without the match (made before it) shows the first start's error."""
    if not kv.get("start"):
        return _fmt(kv.get("prediction_error_pct"), " %", 2)
    kind = {"between first start and warm restart": "between starts", "outside the planned band": "outside band"}
    return "%s (%s)" % (_fmt(kv.get("start_error_pct"), " %", 2), kind.get(kv["start"], kv["start"]))


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def bundle_text(bundle: Mapping[str, Any] | None) -> str:
    """The signed bundle a release came from, in words (the running release's bundle.json, vllm_fleet.verdict)."""
    if not bundle:
        return "no signed bundle recorded (installed without vllm_signed_manifest_url, or before releases recorded it)"
    text = "signed bundle %s" % (bundle.get("name") or "-")
    if bundle.get("version"):
        text += " (vllm-fleet %s)" % bundle["version"]
    if bundle.get("commit"):
        text += ", project %s" % bundle["commit"]
    return text + ", manifest SHA-256 %s" % (bundle.get("manifest_sha256") or "-")


def render_markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown: a summary table, then one section per host."""
    hosts: Mapping[str, Mapping[str, Any]] = report.get("hosts") or {}
    summary = report.get("summary") or {}
    lines = ["# vLLM rollout report: %s" % (report.get("run_id") or "run"), ""]
    lines.append(
        "Generated %s by vllm-fleet %s. Hosts: %d; verified ok: %d; failed: %s; rolled back: %s; findings: %d."
        % (
            report.get("generated_at") or "-",
            report.get("vllm_fleet_version") or "-",
            summary.get("hosts", len(hosts)),
            len(summary.get("ok") or []),
            ", ".join(summary.get("failed") or []) or "none",
            ", ".join(summary.get("rolled_back") or []) or "none",
            summary.get("findings", 0),
        )
    )
    for key, value in sorted((report.get("meta") or {}).items()):
        lines.append("- %s: %s" % (key, _cell(value)))
    lines.append("")
    with_rollout = any(e.get("rollout") for e in hosts.values())
    header = [
        "instance",
        "result",
        "vLLM",
        "profile",
        "start-up",
        "restarts",
        "smoke latency",
        "TTFT",
        "KV tokens",
        "planner error",
        "findings",
    ]
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
            _kv_error_cell(kv),
            _fmt(len(e.get("findings") or [])) if "ok" in e else "-",
        ]
        if with_rollout:
            rollout = e.get("rollout") or {}
            row += [
                _fmt(rollout.get("unhealthy_seconds"), " s", 1),
                "%s / %s" % (_fmt(rollout.get("failed_requests")), _fmt(rollout.get("total_requests")))
                if rollout
                else "-",
            ]
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
            if "bundle" in e:
                lines.append("- installed from: %s" % bundle_text(e.get("bundle")))
            lines.append(
                "- profile: %s; read-back: %s; speculative decoding: %s"
                % (_fmt(profile.get("name")), profile.get("readback", "-"), _fmt(profile.get("speculative")))
            )
            lines.append(
                "- health: %s; start-up %s; waited %s (%s probes); %s restarts, unit %s"
                % (
                    "healthy" if health.get("ok") else "NOT healthy",
                    _startup_cell(health),
                    _fmt(health.get("waited_s"), " s", 1),
                    _fmt(health.get("attempts")),
                    _fmt(health.get("restarts")),
                    _fmt(health.get("active_state")),
                )
            )
            lines.append(
                "- served model: %s (listed: %s)"
                % (_fmt(e.get("served_model_name")), ", ".join(e.get("models") or []) or "-")
            )
            lines.append(
                "- smoke request: HTTP %s, %s prompt / %s completion tokens, latency %s (budget %s); "
                "server side over %s request(s): e2e %s, TTFT %s, queue %s, prefill %s, decode %s, "
                "inter-token %s; client %s"
                % (
                    _fmt(smoke.get("status")),
                    _fmt(smoke.get("prompt_tokens")),
                    _fmt(smoke.get("completion_tokens")),
                    _fmt(smoke.get("latency_s"), " s"),
                    _fmt(smoke.get("budget_s"), " s"),
                    _fmt(server.get("requests")),
                    _fmt(server.get("e2e_s"), " s", 4),
                    _fmt(server.get("ttft_s"), " s", 4),
                    _fmt(server.get("queue_s"), " s", 4),
                    _fmt(server.get("prefill_s"), " s", 4),
                    _fmt(server.get("decode_s"), " s", 4),
                    _fmt(server.get("inter_token_s"), " s", 4),
                    _fmt(smoke.get("client_elapsed_s"), " s (whole seconds)"),
                )
            )
            lines.append(
                "- KV cache: %s tokens, %s blocks of %s, dtype %s, %s bytes, max concurrency %s, "
                "prefix caching %s, gpu_memory_utilization %s; planner predicted %s at a first start (error %s), "
                "%s on a warm restart (error %s): %s"
                % (
                    _fmt(kv.get("tokens")),
                    _fmt(kv.get("num_gpu_blocks")),
                    _fmt(kv.get("block_size")),
                    _fmt(kv.get("cache_dtype")),
                    _fmt(kv.get("memory_bytes")),
                    _fmt(kv.get("max_concurrency"), "", 2),
                    _fmt(kv.get("enable_prefix_caching")),
                    _fmt(kv.get("gpu_memory_utilization")),
                    _fmt(kv.get("predicted_tokens")),
                    _fmt(kv.get("prediction_error_pct"), " %", 2),
                    _fmt(kv.get("predicted_tokens_warm")),
                    _fmt(kv.get("prediction_error_warm_pct"), " %", 2),
                    _fmt(kv.get("planned")),
                )
            )
            rates = e.get("rates") or {}
            if rates:
                lines.append(
                    "- rates: prefix cache hit rate %s (%s queried tokens, %s), speculative acceptance %s "
                    "(%s), preemptions +%s (total %s)"
                    % (
                        _fmt(rates.get("prefix_cache_hit_rate"), "", 3),
                        _fmt(rates.get("prefix_cache_queries")),
                        rates.get("prefix_cache_basis", "-"),
                        _fmt(rates.get("spec_acceptance_rate"), "", 3),
                        rates.get("spec_acceptance_basis", "-"),
                        _fmt(rates.get("preemptions_increase")),
                        _fmt(rates.get("preemptions_total")),
                    )
                )
            for title, items in (("Errors", e.get("errors")), ("Warnings", e.get("warnings"))):
                if items:
                    lines.append("")
                    lines.append("%s:" % title)
                    lines.extend("- %s" % _cell(i) for i in items)
            if e.get("findings"):
                lines.append("")
                lines.append("Findings:")
                lines.extend("- %s: %s. %s." % (f.get("id"), f.get("message"), f.get("advice")) for f in e["findings"])
            attempts = e.get("verify_attempts") or []
            if len(attempts) > 1:
                lines.append("")
                lines.append("Verification attempts:")
                lines.extend(
                    "- %s: %s%s"
                    % (
                        a.get("checked_at"),
                        "ok" if a.get("ok") else "FAILED",
                        ": " + "; ".join(a["errors"]) if a.get("errors") else "",
                    )
                    for a in attempts
                )
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
                lines.append(
                    "- %s %s: %s%s"
                    % (
                        ev.get("at"),
                        ev.get("action", "rollback"),
                        _cell(ev.get("reason") or "-"),
                        " (%s)" % ", ".join("%s=%s" % (k, _cell(v)) for k, v in sorted(rest.items())) if rest else "",
                    )
                )
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
    print(
        "wrote %s, %s and report.html (%d hosts, failed: %s)"
        % (json_path, md_path, report["summary"]["hosts"], ", ".join(report["summary"]["failed"]) or "none"),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
