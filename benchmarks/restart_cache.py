#!/usr/bin/env python3
"""Restart-to-healthy seconds of a vLLM host with its persistent compile cache, against a cold cache.

    benchmarks/restart_cache.py [-i lab/inventory] [--host lab-1] [--runs 3] [--eager]

On the host (through Ansible, so any inventory works), each run stops vllm@main, for a cold run empties
the cache folder (vllm_cache_dir: torch.compile, inductor and Triton caches), starts the unit and polls
/health on the host until 200; the seconds from `systemctl start` to 200 are measured on the host.
Cold and warm runs alternate; the medians are printed. By default the benchmark first deploys the host
with torch.compile on (the lab profile runs --enforce-eager for fast starts, where there is nothing to
cache) and puts the inventory's configuration back at the end; --eager measures the configuration as it
is. Numbers depend on the machine; they are printed, not asserted.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ON_HOST = r"""
set -eu
unit=vllm@main.service
systemctl stop "$unit"
systemctl reset-failed "$unit" || true  # manual starts count against StartLimitBurst too
if [ "{mode}" = cold ]; then find {cache} -mindepth 1 -delete; fi
t0=$(date +%s.%N)
systemctl start "$unit"
for i in $(seq 1 {limit}); do
  code=$(python3 -c 'import urllib.request,sys
try: print(urllib.request.urlopen("http://127.0.0.1:{port}/health", timeout=2).status)
except Exception: print(0)')
  [ "$code" = 200 ] && break
  [ "$(systemctl show -p ActiveState --value "$unit")" = failed ] && {{ echo failed; exit 1; }}
  sleep 0.5
done
t1=$(date +%s.%N)
python3 -c "print(round($t1 - $t0, 1))"
"""


def ansible(inventory, host, *args):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    return subprocess.run(
        ["ansible", host, "-i", inventory, "-b", *args], capture_output=True, text=True, env=env, cwd=ROOT
    )


def deploy(inventory, host, extra_args):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    cmd = ["ansible-playbook", "-i", inventory, "site.yml", "-l", host]
    if extra_args is not None:
        cmd += ["-e", json.dumps({"vllm_extra_args": extra_args})]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode:
        sys.exit(f"deploying {host} failed:\n{proc.stdout[-3000:]}")


def measure(inventory, host, mode, cache, port, limit):
    script = ON_HOST.format(mode=mode, cache=cache, port=port, limit=limit * 2)
    proc = ansible(inventory, host, "-m", "ansible.builtin.shell", "-a", script)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    try:
        return float(lines[-1])
    except (ValueError, IndexError):
        sys.exit(f"{mode} restart of {host} failed:\n{proc.stdout[-2000:]}{proc.stderr[-1000:]}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-i", "--inventory", default="lab/inventory")
    parser.add_argument("--host", default="lab-1")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cache", default="/var/cache/vllm")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--limit", type=int, default=600, help="seconds to wait for /health per start")
    parser.add_argument("--eager", action="store_true", help="measure the inventory's configuration as it is")
    args = parser.parse_args()
    if not args.eager:
        deploy(args.inventory, args.host, {})  # no --enforce-eager: torch.compile and its cache in play
    times = {"cold": [], "warm": []}
    for run in range(args.runs):
        for mode in ("cold", "warm"):
            seconds = measure(args.inventory, args.host, mode, args.cache, args.port, args.limit)
            times[mode].append(seconds)
            print(f"run {run + 1}: {mode:4} cache: {seconds:6.1f} s to /health 200", flush=True)
    if not args.eager:
        deploy(args.inventory, args.host, None)  # back to the inventory's configuration
    cold, warm = statistics.median(times["cold"]), statistics.median(times["warm"])
    print(
        f"{args.host}: restart to healthy, median of {args.runs}: cold cache {cold:.1f} s, "
        f"persistent cache {warm:.1f} s ({cold - warm:+.1f} s saved, {100 * (cold - warm) / cold:.0f}%)"
    )


if __name__ == "__main__":
    main()
