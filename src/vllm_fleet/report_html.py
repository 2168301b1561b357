"""The run report as one self-contained HTML page with plots, for people to look at (report.md stays for text).

Renders what :func:`vllm_fleet.report.merge` folded: a summary, then plots made with matplotlib (embedded as PNG, so
the page needs nothing but itself): the planner's KV-cache prediction against what each engine sized, the smoke
request's latencies, the rollout's unhealthy windows, the benchmark's latency distributions and throughput, and
over a day-2 window the KV-cache usage and preemptions Prometheus recorded; then one table per instance. Nothing
here judges: the verdicts are :mod:`vllm_fleet.verdict`'s and :mod:`vllm_fleet.monitoring`'s.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: render to memory
import matplotlib.pyplot as plt

from . import report as _report
from .tune import DEFAULTS, SIGNIFICANCE, TEST, verdict_text

__all__ = ["render_html", "render_tune_html"]

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #1b1f24; max-width: 70rem; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; margin-top: 2rem; border-bottom: 1px solid #ccd; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 0.9rem; }
td, th { border: 1px solid #ccd; padding: 0.25rem 0.6rem; text-align: left; vertical-align: top; }
th { background: #f3f4f8; } .ok { color: #176f2c; font-weight: 600; } .failed { color: #b3261e; font-weight: 600; }
figure { margin: 1rem 0; } figcaption { font-size: 0.85rem; color: #555; } img { max-width: 100%; }
"""


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _figure(fig: Any, caption: str) -> str:
    return (
        f'<figure><img alt="{html.escape(caption)}" src="data:image/png;base64,{_png(fig)}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
    )


def _bars(names: list[str], series: Mapping[str, list[Any]], ylabel: str, title: str) -> Any:
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(names) + 2), 3.2))
    width = 0.8 / max(len(series), 1)
    for i, (label, values) in enumerate(series.items()):
        xs = [x + i * width for x in range(len(names))]
        ax.bar(xs, [v if isinstance(v, (int, float)) else 0 for v in values], width, label=label)
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(names))], names, rotation=20, ha="right")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if len(series) > 1:
        ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return fig


def _kv_plot(hosts: Mapping[str, Mapping[str, Any]]) -> str:
    rows = [(name, e.get("kv_cache") or {}) for name, e in hosts.items() if (e.get("kv_cache") or {}).get("tokens")]
    if not rows:
        return ""
    names = [n for n, _ in rows]
    fig = _bars(
        names,
        {"planned": [kv.get("predicted_tokens") for _, kv in rows], "engine": [kv.get("tokens") for _, kv in rows]},
        "KV cache tokens",
        "The planner's KV cache against the engine's",
    )
    return _figure(
        fig,
        "KV-cache tokens the planner predicted for each instance and what its engine sized "
        "(vllm:cache_config_info / kv_cache_size_tokens).",
    )


def _smoke_plot(hosts: Mapping[str, Mapping[str, Any]]) -> str:
    rows = [(n, (e.get("smoke") or {}).get("server") or {}) for n, e in hosts.items() if "ok" in e]
    rows = [(n, s) for n, s in rows if s.get("e2e_s") is not None]
    if not rows:
        return ""
    fig = _bars(
        [n for n, _ in rows],
        {key: [(s.get(key) or 0) * 1000 for _, s in rows] for key in ("ttft_s", "e2e_s")},
        "ms",
        "The smoke request, server side",
    )
    return _figure(
        fig,
        "Time to first token and end-to-end latency of each instance's smoke request, from the histograms around it.",
    )


def _rollout_plot(hosts: Mapping[str, Mapping[str, Any]]) -> str:
    rows = [(n, e["rollout"]) for n, e in hosts.items() if e.get("rollout")]
    if not rows:
        return ""
    fig = _bars(
        [n for n, _ in rows],
        {"unhealthy s": [r.get("unhealthy_seconds") for _, r in rows]},
        "seconds",
        "Unhealthy during the rollout, seen by the request loop",
    )
    return _figure(fig, "Seconds each instance did not answer the rollout's bounded request loop (its restart).")


def _benchmark_plots(hosts: Mapping[str, Mapping[str, Any]]) -> str:
    rows = [(n, ((e.get("events") or {}).get("benchmark") or [{}])[-1]) for n, e in hosts.items()]
    rows = [(n, b) for n, b in rows if (b.get("load") or {}).get("completed")]
    if not rows:
        return ""
    names = [n for n, _ in rows]
    out = []
    for key, title in (("ttft_ms", "Time to first token"), ("itl_ms", "Inter-token latency")):
        series = {q: [((b["load"].get(key) or {}).get(q)) for _, b in rows] for q in ("p50", "p90", "p99")}
        out.append(
            _figure(
                _bars(names, series, "ms", f"{title} under the benchmark's load"),
                f"{title} percentiles of each instance's bounded load (playbooks/benchmark.yml).",
            )
        )
    out.append(
        _figure(
            _bars(
                names,
                {"output tok/s": [b["load"].get("output_tokens_per_s") for _, b in rows]},
                "tokens/s",
                "Output throughput",
            ),
            "Output tokens per second of each instance under the benchmark's load.",
        )
    )
    return "".join(out)


def _window_plots(hosts: Mapping[str, Mapping[str, Any]]) -> str:
    diagnosed = [(n, ((e.get("events") or {}).get("diagnose") or [{}])[-1]) for n, e in hosts.items()]
    diagnosed = [(n, d) for n, d in diagnosed if d.get("series")]
    if not diagnosed:
        return ""
    out = []
    for key, title, ylabel in (
        ("kv_cache_usage", "KV-cache usage", "share of the cache"),
        ("preemptions", "Preemptions", "preemptions per minute"),
    ):
        fig, ax = plt.subplots(figsize=(8, 3.2))
        drawn = False
        for name, d in diagnosed:
            points = d["series"].get(key) or []
            if points:
                t0 = points[0][0]
                ax.plot([(t - t0) / 60 for t, _ in points], [v for _, v in points], label=name)
                drawn = True
        if not drawn:
            plt.close(fig)
            continue
        ax.set_xlabel("minutes into the window")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} over the window")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        out.append(_figure(fig, f"{title} of each instance over the day-2 window, as Prometheus recorded it."))
    return "".join(out)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    return html.escape("-" if value in (None, "") else str(value))


def _kv_error(kv: Mapping[str, Any]) -> Any:
    """The planner's error against the start the engine's KV cache matches, or the band it missed (a result made
    before the match was reported: the first start's error alone)."""
    if kv.get("start") in ("first start", "warm restart"):
        return f"{_cell(kv.get('start_error_pct'))} ({kv['start']})"
    return kv.get("planned") or kv.get("prediction_error_pct")


def _instance_table(name: str, e: Mapping[str, Any]) -> str:
    """The instance's rows that this run has something for (a day-2 run has no verification)."""
    rows = []
    if "ok" in e:
        rows.append(("result", f'<span class="{"ok" if e["ok"] else "failed"}">{"ok" if e["ok"] else "FAILED"}</span>'))
    for label, value in (
        ("vLLM", (e.get("version") or {}).get("reported")),
        ("profile", (e.get("profile") or {}).get("name")),
        ("read-back", (e.get("profile") or {}).get("readback")),
        ("installed from", _report.bundle_text(e.get("bundle")) if "bundle" in e else None),
        ("card", (e.get("gpu") or {}).get("name")),
        ("port", (e.get("placement") or {}).get("port")),
        ("KV tokens", (e.get("kv_cache") or {}).get("tokens")),
        ("planner error %", _kv_error(e.get("kv_cache") or {})),
    ):
        if value not in (None, ""):
            rows.append((label, _cell(value)))
    for error in e.get("errors") or []:
        rows.append(("error", _cell(error)))
    findings = list(e.get("findings") or [])
    for event in ((e.get("events") or {}).get("diagnose") or [])[-1:]:
        rows.append(
            (
                "day-2 window",
                _cell(
                    f"the last {event.get('window')}" + ("" if event.get("scraped") else " (Prometheus has no samples)")
                ),
            )
        )
        findings += event.get("findings") or []
    for finding in findings:
        rows.append(("finding", _cell(f"{finding.get('message')}: {finding.get('advice')}")))
    if not findings and (e.get("events") or {}).get("diagnose"):
        rows.append(("finding", "none"))
    for event in e.get("rollback") or []:
        rows.append(("rollback", _cell(f"{event.get('action')} {event.get('to')}: {event.get('reason')}")))
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f"<h3>{html.escape(name)}</h3><table>{body}</table>"


def render_html(report: Mapping[str, Any]) -> str:
    """The report as one HTML page, plots embedded."""
    hosts: Mapping[str, Mapping[str, Any]] = report.get("hosts") or {}
    summary = report.get("summary") or {}
    title = f"vLLM fleet report: {report.get('run_id') or 'run'}"
    parts = [
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
        f"<p>Generated {html.escape(str(report.get('generated_at') or '-'))} by vllm-fleet "
        f"{html.escape(str(report.get('vllm_fleet_version') or '-'))}. Instances: {len(hosts)}; verified "
        f"ok: {len(summary.get('ok') or [])}; failed: {html.escape(', '.join(summary.get('failed') or []) or 'none')};"
        f" rolled back: {html.escape(', '.join(summary.get('rolled_back') or []) or 'none')}; findings: "
        f"{summary.get('findings', 0)}.</p>",
    ]
    plots = "".join(
        (_kv_plot(hosts), _smoke_plot(hosts), _rollout_plot(hosts), _benchmark_plots(hosts), _window_plots(hosts))
    )
    if plots:
        parts.append("<h2>Plots</h2>" + plots)
    parts.append("<h2>Instances</h2>" + "".join(_instance_table(n, e) for n, e in hosts.items()))
    parts.append("</body></html>\n")
    return "".join(parts)


# The tune page: each plot puts one figure against the output throughput, the axes a search trades.
_TUNE_PLOTS = (
    ("median_ttft_ms", "median TTFT (ms)"),
    ("p99_ttft_ms", "p99 TTFT (ms)"),
    ("mean_itl_ms", "mean inter-token latency (ms)"),
    ("p99_itl_ms", "p99 inter-token latency (ms)"),
)
_TUNE_COLUMNS = (
    ("output_throughput", "output tok/s", "{:,.1f}"),
    ("median_ttft_ms", "TTFT median ms", "{:,.1f}"),
    ("p99_ttft_ms", "TTFT p99 ms", "{:,.1f}"),
    ("mean_itl_ms", "ITL mean ms", "{:,.2f}"),
    ("p99_itl_ms", "ITL p99 ms", "{:,.2f}"),
    ("preemptions", "preemptions", "{:,.0f}"),
)


def _spread(figure: Any, fmt: str) -> str:
    """A figure's median with its lowest and highest over the repeats, as the GPU results write it."""
    if not isinstance(figure, Mapping):
        return "-"
    low, high = figure.get("low"), figure.get("high")
    text = fmt.format(figure["median"])
    return text if low == high else f"{text} ({fmt.format(low)}-{fmt.format(high)})"


def _front_plot(measured: Mapping[str, Mapping[str, Any]], front: list[str], key: str, label: str) -> str:
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for name, figures in measured.items():
        x, y = figures.get("output_throughput"), figures.get(key)
        if not isinstance(x, Mapping) or not isinstance(y, Mapping):
            continue
        on_front = name in front
        ax.errorbar(
            x["median"],
            y["median"],
            xerr=[[x["median"] - x["low"]], [x["high"] - x["median"]]],
            yerr=[[y["median"] - y["low"]], [y["high"] - y["median"]]],
            fmt="o" if on_front else "x",
            color="#b3261e" if name == DEFAULTS else "#1f5fbf",
            capsize=3,
        )
        ax.annotate(name, (x["median"], y["median"]), fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("output throughput (tok/s), higher is better")
    ax.set_ylabel(f"{label}, lower is better")
    ax.set_title(f"{label} against throughput")
    ax.grid(alpha=0.3)
    return _figure(
        fig,
        f"{label} against output throughput: the median of the repeats, bars from the lowest to the highest; "
        "circles on the Pareto front, crosses off it; vLLM's defaults in red.",
    )


def render_tune_html(search: Mapping[str, Any], title: str) -> str:
    """A tune search (vllm_fleet.tune's decision over what was measured: gpu/bench/summarize.py's ``tune`` entry) as
    one page: the decision, the front plotted figure by figure against the throughput, and every candidate's figures
    with their spread and their verdict against vLLM's defaults."""
    measured: Mapping[str, Mapping[str, Any]] = search.get("measured") or {}
    decision: Mapping[str, Any] = search.get("decision") or {}
    front = list(decision.get("front") or [])
    versus: Mapping[str, Mapping[str, Mapping[str, Any]]] = search.get("against_defaults") or {}
    targets = decision.get("targets") or {}
    parts = [
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
        f"<p>Profile {html.escape(str(search.get('profile')))} on the {html.escape(str(search.get('card')))}; load: "
        f"{html.escape(str((search.get('load') or {}).get('source')))}, "
        f"{html.escape(str((search.get('load') or {}).get('users')))} users. Targets: "
        f"{html.escape(', '.join(f'{k} {v}' for k, v in targets.items()) or 'none')}.</p>",
        f"<p><strong>Decision:</strong> {html.escape(str(decision.get('verdict') or 'none'))}"
        f" (choice: {html.escape(str(decision.get('choice')))}). On the front: {html.escape(', '.join(front))}.</p>",
        # The playbook's search names the vllm-fleet that made it (vllm_tune_search); a GPU summary's does not.
        f"<p>Searched by vllm-fleet {html.escape(str(search['vllm_fleet_version']))}.</p>"
        if search.get("vllm_fleet_version")
        else "",
        "<h2>The front</h2>",
        *(_front_plot(measured, front, key, label) for key, label in _TUNE_PLOTS),
        "<h2>Every candidate</h2><table><tr><th>candidate</th><th>repeats</th>",
        *(f"<th>{html.escape(label)}</th>" for _, label, _ in _TUNE_COLUMNS),
        "<th>on the front</th><th>misses</th><th>against vLLM's defaults (the medians' difference, the %s test's "
        "p-value; better or worse only at p &lt; %g)</th></tr>" % (html.escape(TEST), SIGNIFICANCE),
    ]
    misses: Mapping[str, list[str]] = decision.get("misses") or {}
    for name, figures in measured.items():
        verdicts = versus.get(name) or {}
        against = "; ".join(f"{k} {verdict_text(v)}" for k, v in verdicts.items()) or "-"
        parts.append(
            f"<tr><td>{html.escape(name)}</td><td>{figures.get('repeats', '-')}</td>"
            + "".join(f"<td>{html.escape(_spread(figures.get(key), fmt))}</td>" for key, _, fmt in _TUNE_COLUMNS)
            + f"<td>{'yes' if name in front else 'no'}</td>"
            + f"<td>{html.escape('; '.join(misses.get(name) or []) or '-')}</td><td>{html.escape(against)}</td></tr>"
        )
    parts.append("</table>")
    refused = search.get("refused") or {}
    if refused:
        parts.append(
            "<h2>Refused by the planner (not run)</h2><ul>"
            + "".join(f"<li>{html.escape(n)}: {html.escape('; '.join(m))}</li>" for n, m in refused.items())
            + "</ul>"
        )
    parts.append("</body></html>\n")
    return "".join(parts)
