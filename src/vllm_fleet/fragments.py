"""The run's fragments and their merge: what a rollout, a verification, a rollback or a benchmark leaves behind.

One small JSON file per instance and event, written as the run goes, so a rollout that stops on its canary still
leaves its fragments behind; :func:`merge` folds a run's fragments into one report, keyed ``host/instance``, that
:mod:`vllm_fleet.report` renders. :func:`fragment` builds one, :func:`load_fragments` reads a run's folder.

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

import datetime as _dt
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from . import __version__

__all__ = ["REPORT_SCHEMA", "fragment", "fragment_name", "key", "load_fragments", "merge"]

REPORT_SCHEMA = 1


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def fragment(
    host: str, kind: str, data: Mapping[str, Any], recorded_at: str | None = None, instance: str | None = None
) -> dict[str, Any]:
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
    """Fold fragments (in time order) into one report, which names the vllm-fleet version that wrote it."""
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
                {
                    "checked_at": data.get("checked_at") or frag.get("recorded_at"),
                    "ok": data.get("ok"),
                    "errors": data.get("errors") or [],
                }
            )
            keep: dict[str, Any] = {k: entry[k] for k in ("rollout", "rollback", "events") if k in entry}
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
        "findings": sum(
            len(e.get("findings") or [])
            + len((((e.get("events") or {}).get("diagnose") or [{}])[-1]).get("findings") or [])
            for e in hosts.values()
        ),
    }
    return {
        "schema": REPORT_SCHEMA,
        "run_id": run_id,
        "generated_at": _now(),
        "vllm_fleet_version": __version__,
        "meta": dict(meta or {}),
        "summary": summary,
        "hosts": {h: hosts[h] for h in sorted(hosts)},
    }
