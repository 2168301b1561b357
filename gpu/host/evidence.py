#!/usr/bin/env python3
"""Whether a step of site.sh did what it says, read from what it left on the host.

    evidence.py report DIR HOST [--instance NAME] [--ok | --failed] [--error-contains TEXT] [--no-rollback]
                                [--rolled-back-to ID] [--reason-contains TEXT]
        a verification report (DIR/report.json, the vllm_verify role's): the instance was verified, passing or
        failing, with an error that names TEXT; no rollback, or one that restored release ID for a reason
        that names TEXT
    evidence.py args FILE [--with NAME VALUE]... [--without NAME]...
        the arguments the unit runs (<config_dir>/<instance>.args.json): the option --NAME given as VALUE, or
        not given (NAME without its dashes: shutdown-timeout)
    evidence.py streams FILE COUNT [--at EPOCH] [--all-finished]
        drain.py's record: COUNT streams, each receiving tokens; with --at, each still open at EPOCH (the
        restart was issued while they were in flight); with --all-finished, each finished with all its tokens
    evidence.py restored LOG ID
        site.yml's output: the rollout stopped after restoring release ID and verifying it serving

    evidence.py kv METRICS_URL JOURNAL REPORT HOST [--instance NAME]
        a measurement, not a verdict: the KV cache the running engine sized (vllm:cache_config_info), whether
        its start compiled vLLM's graphs or loaded them from the compile cache (the unit's journal since the
        start), against the planner's first-start and warm-restart predictions in the latest verification
        report (REPORT: its report.json); exit 0 whenever it could read them

Each prints one line saying what it found; exit 0 when that is what the step needed, 1 when not, 2 when the
input cannot be read. Stdlib only (the image's python3).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from pathlib import Path
from typing import Any

# The rollout's last words when it restored a release (roles/vllm_rollout/tasks/instance.yml, "Stop the rollout").
RESTORED = re.compile(r"Restored the last working release (\S+) \(([^)\s]+)\) and verified it serving")


class Unreadable(Exception):
    """An input that is missing or not what it should be."""


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise Unreadable(f"{path}: {exc}") from exc


def entry(report: dict[str, Any], host: str, instance: str) -> dict[str, Any] | None:
    """The report's entry of HOST's instance (reports before instances were named have none: that host's entry)."""
    for key, value in (report.get("hosts") or {}).items():
        if value.get("host", key.split("/")[0]) == host and value.get("instance") in (instance, None):
            return value
    return None


def check_report(
    folder: Path,
    host: str,
    instance: str = "main",
    ok: bool | None = None,
    error_contains: str | None = None,
    no_rollback: bool = False,
    rolled_back_to: str | None = None,
    reason_contains: str | None = None,
) -> tuple[bool, str]:
    report = _json(folder / "report.json")
    found = entry(report, host, instance)
    if found is None:
        return False, f"{folder.name}: no entry for {host}/{instance} in report.json"
    misses = []
    verified = "ok" in found
    errors = [str(e) for e in found.get("errors") or []]
    rollbacks = [r for r in found.get("rollback") or [] if r.get("action") == "restored"]
    if not verified:
        misses.append("the instance was not verified")
    elif ok is not None and bool(found["ok"]) is not ok:
        misses.append(f"verification {'failed' if ok else 'passed'}")
    if error_contains is not None and not any(error_contains in e for e in errors):
        misses.append(f"no error names {error_contains!r}")
    if no_rollback and rollbacks:
        misses.append(f"rolled back to {rollbacks[-1].get('release_id')}")
    if rolled_back_to is not None:
        to = [r for r in rollbacks if r.get("release_id") == rolled_back_to and r.get("ok")]
        if not to:
            misses.append(
                f"no rollback to {rolled_back_to} (rollbacks: {[r.get('release_id') for r in rollbacks] or 'none'})"
            )
        elif reason_contains is not None and reason_contains not in str(to[-1].get("reason")):
            misses.append(f"the rollback's reason does not name {reason_contains!r}: {str(to[-1].get('reason'))[:200]}")
    said = (
        f"{folder.name}: {host}/{instance} verification "
        f"{'not run' if not verified else 'ok' if found['ok'] else 'failed'}"
        + (f", errors: {' | '.join(errors)[:300]}" if errors else "")
        + (f", rolled back to {rollbacks[-1].get('to')} ({rollbacks[-1].get('release_id')})" if rollbacks else "")
    )
    return not misses, said + ("" if not misses else "; NOT AS NEEDED: " + "; ".join(misses))


def check_args(path: Path, with_: list[tuple[str, str]], without: list[str]) -> tuple[bool, str]:
    args = _json(path)
    if not isinstance(args, list):
        raise Unreadable(f"{path}: not a list of arguments")
    misses = []
    with_ = [("--" + name.lstrip("-"), value) for name, value in with_]
    without = ["--" + name.lstrip("-") for name in without]
    for flag, value in with_:
        given = [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]
        given += [a.split("=", 1)[1] for a in args if a.startswith(flag + "=")]
        if value not in given:
            misses.append(f"{flag} {value} (given: {' '.join(given) or 'none'})")
    for flag in without:
        if any(a == flag or a.startswith(flag + "=") for a in args):
            misses.append(f"{flag} is given")
    wanted = [f"{f} {v}" for f, v in with_] + [f"no {f}" for f in without]
    if misses:
        return False, f"{path.name}: not as needed: {'; '.join(misses)}"
    return True, f"{path.name}: {', '.join(wanted)}"


def check_streams(path: Path, count: int, at: float | None = None, all_finished: bool = False) -> tuple[bool, str]:
    record = _json(path)
    streams = record.get("streams") or []
    wanted = record.get("wanted_tokens")
    misses = []
    if len(streams) != count:
        misses.append(f"{len(streams)} streams, not {count}")
    started = [s for s in streams if (s.get("tokens") or 0) > 0]
    if len(started) != len(streams):
        errors = [s.get("error") for s in streams if s not in started]
        misses.append(f"{len(errors)} received no token (first error: {errors[0]})")
    in_flight = [s for s in started if at is None or (s.get("t_start") or at) < at <= (s.get("t_end") or 0)]
    if at is not None and len(in_flight) != len(streams):
        misses.append(f"{len(streams) - len(in_flight)} not in flight at the restart (no tokens, or over before it)")
    finished = [s for s in streams if s.get("finish_reason") == "length" and s.get("tokens") == wanted]
    if all_finished and len(finished) != len(streams):
        misses.append(f"{len(streams) - len(finished)} cut")
    said = (
        f"{path.name}: "
        + (
            f"{len(in_flight)} of {len(streams)} streams in flight at the restart, "
            if at is not None
            else f"{len(started)} of {len(streams)} streams answered, "
        )
        + f"{len(finished)} finished with their {wanted} tokens ({[s.get('tokens') for s in streams]} tokens)"
    )
    return not misses, said + ("" if not misses else "; NOT AS NEEDED: " + "; ".join(misses))


def check_restored(path: Path, release_id: str) -> tuple[bool, str]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise Unreadable(f"{path}: {exc}") from exc
    found = RESTORED.findall(text)
    if not found:
        return False, f"{path.name}: the rollout restored no release"
    release, restored = found[-1]
    if restored != release_id:
        return False, f"{path.name}: the rollout restored {release} ({restored}), not {release_id}"
    return True, f"{path.name}: the rollout restored {release} ({restored}) and verified it serving"


def compile_cache(journal: str) -> str:
    """vLLM's own words at a start: it loaded its torch.compile graphs ("warm") or compiled them ("cold")."""
    if "Directly load the compiled graph" in journal:
        return "warm"
    return "cold" if "Compiling a graph for compile range" in journal else "unknown"


def measure_kv(metrics_url: str, journal: Path, report: Path, host: str, instance: str = "main") -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
    from vllm_fleet import bench  # stdlib only: the project's reader of vLLM's metrics

    try:
        with urllib.request.urlopen(metrics_url, timeout=10) as answer:
            labels = bench.info_labels(answer.read().decode(), "vllm:cache_config_info")
        tokens = int(labels["kv_cache_size_tokens"])
        found = entry(_json(report), host, instance)
        if found is None:
            raise KeyError(f"{host}/{instance}")
        kv = found["kv_cache"]
        text = journal.read_text(encoding="utf-8", errors="replace")
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise Unreadable(f"{metrics_url}, {journal}, {report}: {exc!r}") from exc
    said = [f"engine {tokens:,} tokens, compile cache {compile_cache(text)}"]
    for label, key in (("first start", "predicted_tokens"), ("warm restart", "predicted_tokens_warm")):
        planned = kv.get(key)
        if planned:
            said.append(f"planner ({label}) {planned:,} ({(planned - tokens) / tokens * 100:+.2f} %)")
    return "; ".join(said)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("report")
    r.add_argument("folder", type=Path)
    r.add_argument("host")
    r.add_argument("--instance", default="main")
    verdict = r.add_mutually_exclusive_group()
    verdict.add_argument("--ok", dest="ok", action="store_const", const=True)
    verdict.add_argument("--failed", dest="ok", action="store_const", const=False)
    r.add_argument("--error-contains")
    r.add_argument("--no-rollback", action="store_true")
    r.add_argument("--rolled-back-to")
    r.add_argument("--reason-contains")
    a = sub.add_parser("args")
    a.add_argument("file", type=Path)
    a.add_argument("--with", dest="with_", nargs=2, action="append", default=[], metavar=("FLAG", "VALUE"))
    a.add_argument("--without", action="append", default=[], metavar="FLAG")
    s = sub.add_parser("streams")
    s.add_argument("file", type=Path)
    s.add_argument("count", type=int)
    s.add_argument("--at", type=float)
    s.add_argument("--all-finished", action="store_true")
    k = sub.add_parser("kv")
    k.add_argument("metrics_url")
    k.add_argument("journal", type=Path)
    k.add_argument("report", type=Path)
    k.add_argument("host")
    k.add_argument("--instance", default="main")
    d = sub.add_parser("restored")
    d.add_argument("log", type=Path)
    d.add_argument("id")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "report":
            good, said = check_report(
                args.folder,
                args.host,
                args.instance,
                args.ok,
                args.error_contains,
                args.no_rollback,
                args.rolled_back_to,
                args.reason_contains,
            )
        elif args.cmd == "args":
            good, said = check_args(args.file, [tuple(w) for w in args.with_], args.without)
        elif args.cmd == "streams":
            good, said = check_streams(args.file, args.count, args.at, args.all_finished)
        elif args.cmd == "kv":
            good, said = True, measure_kv(args.metrics_url, args.journal, args.report, args.host, args.instance)
        else:
            good, said = check_restored(args.log, args.id)
    except Unreadable as exc:
        print(f"unreadable: {exc}")
        return 2
    print(said)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
