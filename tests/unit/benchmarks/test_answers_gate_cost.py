"""benchmarks/answers_gate_cost.py over a real excerpt of a site.yml log: the fleet scenario's upgrade on
2026-12-07 (fixtures/answers/site-log-excerpt.txt, cut from the run's log unchanged), the first instance's gate from
its entry task to the rollout's next task."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import FIXTURES, ROOT, load_source

cost = load_source("answers_gate_cost", ROOT / "benchmarks" / "answers_gate_cost.py")
EXCERPT = FIXTURES / "answers" / "site-log-excerpt.txt"


def test_the_gates_window_runs_from_its_entry_to_the_rollouts_next_task():
    found = cost.tasks(EXCERPT.read_text())
    names = [name for name, _ in found]
    assert names[0] == cost.GATE_START and names[-1] == "Clear a mark the sentinel left on the instance"
    (window,) = cost.windows(found)
    assert window["entry"] == cost.GATE_START
    # Every task between is the gate's; the window ends where the next one starts.
    assert window["tasks"] == len(found) - 1
    assert window["seconds"] == round(found[-1][1] - found[0][1], 2) and 5 < window["seconds"] < 15


def test_the_script_prints_the_share_of_the_run():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "answers_gate_cost.py"), str(EXCERPT)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    result = json.loads(done.stdout)
    assert result["gate_windows"] == 1 and result["gate_s"] == round(result["windows"][0]["seconds"], 1)
    assert 0 < result["gate_share_pct"] <= 100
