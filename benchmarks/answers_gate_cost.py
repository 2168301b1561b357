#!/usr/bin/env python3
"""What the answers gate costs a rollout, read from the run's own log (issue #52's "the gate's cost").

The project's ansible.cfg enables ``profile_tasks``, so every task's header in a site.yml (or rollback.yml) log is
followed by the time since the playbook started. A task's wall time is the start of the next task less its own. The
gate's time is the wall time from the start of "Hold the answers against the last verified release's (answers gate)"
to the next task of the instance's rollout, plus that of "Record the answers with the verified release" and the
tasks it includes; a batch's hosts run a task together, so this is the time the run spent on the gate, not a sum
over hosts. Prints one JSON object: the run's length, the gate's share, the gate's windows, and per window the
hosts and instances the log names there.

    benchmarks/answers_gate_cost.py .cache/logs/fleet-runs/NN-site-rc0.log [...]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HEADER = re.compile(r"^TASK \[(?:[^\]]*? : )?(?P<name>.*?)\] \*+\s*$")
CLOCK = re.compile(r"\(\d+:\d\d:\d\d\.\d+\)\s+(?P<h>\d+):(?P<m>\d\d):(?P<s>\d\d\.\d+)(?:\s|$)")
# The gate's two entry tasks in instance.yml, rollback.yml and tune_candidate.yml, and the tasks they include.
GATE_START = "Hold the answers against the last verified release's (answers gate)"
RECORD_START = "Record the answers with the verified release"
TUNE_START = "Hold the candidate's answers against the verified release's"
INCLUDED = {
    "Name the configuration the answers are held for",
    "Forget an earlier instance's measurement",
    "Find the release the instance was last verified with",
    "Look for the answers recorded with that release",
    "Ask the golden set",
    "Measure the answers of",
    "Keep the answers of",
    "Stop when the golden set could not be asked",
    "Keep the answers to record with the release",
    "Hold the answers against the recorded ones",
    "Name the answers page",
    "Write the answers report beside the run's report",
    "Record the answers gate in the run's report",
    "Validating arguments against arg spec 'answers'",
    "Validating arguments against arg spec 'fragment'",
    "Check the fragment to add",
    "Write the fragment and the report",
    # vllm_verify's report.yml, which the fragment imports.
    "Name the report run (once per playbook run)",
    "Remember the run's folder on the controller",
    "Build this instance's report fragment",
    "Write this instance's report fragment",
    "Write the run's report.json, report.md and report.html",
    "Say where the report is",
    "Say the answers gate's verdict",
    "Stop when the answers changed past the limits",
    "Find the release the instance now runs",
    "Write the answers into the release's entry",
}


def tasks(text: str) -> list[tuple[str, float]]:
    """(task name, seconds since the playbook started) for every task header that has profile_tasks' clock."""
    found: list[tuple[str, float]] = []
    name = None
    for line in text.splitlines():
        header = HEADER.match(line)
        if header:
            name = header.group("name")
            continue
        clock = CLOCK.search(line)
        if clock and name is not None:
            found.append((name, int(clock["h"]) * 3600 + int(clock["m"]) * 60 + float(clock["s"])))
            name = None
    return found


def _gate_task(name: str) -> bool:
    """A task of the gate: its entry tasks, or one of the tasks they include (the report's fragment tasks too)."""
    return any(name.startswith(prefix) for prefix in INCLUDED | {GATE_START, RECORD_START, TUNE_START})


def windows(found: list[tuple[str, float]]) -> list[dict[str, object]]:
    """The gate's windows: from an entry task to the first following task that is not the gate's."""
    out: list[dict[str, object]] = []
    i = 0
    while i < len(found):
        name, start = found[i]
        if name.startswith((GATE_START, RECORD_START, TUNE_START)):
            j = i + 1
            while (
                j < len(found)
                and _gate_task(found[j][0])
                and not found[j][0].startswith((GATE_START, RECORD_START, TUNE_START))
            ):
                j += 1
            end = found[j][1] if j < len(found) else start
            out.append({"entry": name, "start_s": round(start, 2), "seconds": round(end - start, 2), "tasks": j - i})
            i = j
        else:
            i += 1
    return out


def cost(path: Path) -> dict[str, object]:
    text = path.read_text(errors="replace")
    found = tasks(text)
    if not found:
        raise SystemExit(f"{path}: no task with profile_tasks' clock (is the callback enabled in ansible.cfg?)")
    total = found[-1][1]
    gate = windows(found)
    spent = sum(float(w["seconds"]) for w in gate)  # type: ignore[arg-type]
    measured = [float(w["seconds"]) for w in gate if str(w["entry"]).startswith((GATE_START, TUNE_START))]
    return {
        "log": str(path),
        "run_s": round(total, 1),
        "gate_s": round(spent, 1),
        "gate_share_pct": round(100 * spent / total, 1) if total else None,
        "gate_windows": len(measured),
        "gate_window_s": {"min": min(measured), "max": max(measured)} if measured else None,
        "windows": gate,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", type=Path, help="site.yml or rollback.yml logs with profile_tasks' clock")
    args = parser.parse_args(argv)
    for path in args.logs:
        print(json.dumps(cost(path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
