#!/usr/bin/env python3
"""Time re-runs of site.yml against the lab where nothing changes (the lab must be up: lab/scripts/lab.sh up).

    benchmarks/rerun.py                       # every case below, once each
    benchmarks/rerun.py --case fast-one --runs 3

Cases: fast-one (site.yml -l lab-1: the fast path), fast-all (every host), full-one (-l lab-1 -e
vllm_fast_path=false: every task of the rollout), check-all (--check --diff on every host). Prints, per run, the
wall time, the recap's changed count per host, and the five largest task costs from the profile_tasks callback.
A run that changes anything is reported as such (a re-run must change nothing). Each run is bounded (900 s).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
CASES = {
    "fast-one": ["-l", "lab-1"],
    "fast-all": [],
    "full-one": ["-l", "lab-1", "-e", "vllm_fast_path=false"],
    "check-all": ["--check", "--diff"],
}
COST = re.compile(r"^(.+?) -+ (\d+\.\d+)s$")


def run(extra):
    env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default")
    cmd = [os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "site.yml", *extra]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - start
    out = proc.stdout
    recap = {}
    for line in out.split("PLAY RECAP", 1)[-1].splitlines()[1:]:
        name, sep, counts = line.partition(" : ")
        if not sep:
            break
        recap[name.strip()] = {k: int(v) for k, v in (p.split("=") for p in counts.split())}
    costs = [
        (m.group(1).strip(), float(m.group(2)))
        for m in map(COST.match, out.split("TASKS RECAP", 1)[-1].splitlines())
        if m
    ]
    return {
        "rc": proc.returncode,
        "seconds": round(seconds, 1),
        "changed": {host: counts.get("changed", 0) for host, counts in recap.items()},
        "tasks": sum(counts.get("ok", 0) + counts.get("changed", 0) for counts in recap.values()),
        "largest": sorted(costs, key=lambda c: -c[1])[:5],
        "tail": out[-1500:] if proc.returncode else "",
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=sorted(CASES), action="append")
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    for case in args.case or list(CASES):
        for i in range(args.runs):
            result = run(CASES[case])
            print(json.dumps({"case": case, "run": i + 1, **result}))
            if result["rc"]:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
