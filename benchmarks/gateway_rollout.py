#!/usr/bin/env python3
"""Requests through the gateway while the lab rolls out: failed requests, cut streams, TTFT.

    benchmarks/gateway_rollout.py [--rest-seconds 60] [--concurrency 4] [--max-tokens 48] [--bad]

On the lab (lab/scripts/lab.sh up: lab-1 and lab-2 behind lab-gw), a bounded loop of streamed chat completions
(labtools.streamload) runs through the gateway, first at rest, then during a good rolling change of every lab
instance (`site.yml` with max_num_seqs changed), and with --bad during a change that fails on the canary (a
tokenizer path that does not exist) and is rolled back. Prints one row per phase: requests, failed, cut, p50 and
p99 TTFT. Every loop is bounded in requests and seconds; nothing is sent before this machine is seen to have a
route to the lab network (its bridge holds the lab's gateway address).
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))
from labtools import streamload  # noqa: E402

INVENTORY = ROOT / "lab" / "inventory"
CACHE = Path(os.environ.get("CACHE_DIR", ROOT / ".cache"))


def lab_facts():
    hosts = yaml.safe_load((INVENTORY / "hosts.yml").read_text())["all"]["children"]
    gateway = next(iter(hosts["vllm_gateways"]["hosts"].items()))
    network = yaml.safe_load((INVENTORY / "group_vars" / "all.yml").read_text())
    return gateway[0], gateway[1]["ansible_host"], network["lab_gateway"]


def check_route(bridge_address, target):
    addresses = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
    route = subprocess.run(["ip", "-4", "-o", "route", "get", target], capture_output=True, text=True).stdout
    if f" {bridge_address}/" not in addresses or " via " in route:
        sys.exit(
            f"no route to the lab network from this machine (route to {target}: {route.strip()}); "
            "fix: lab/scripts/lab.sh up"
        )


def loop(stream, concurrency, seconds, stop_file=None):
    return streamload.run(stream, concurrency, seconds, max_requests=20000, stop_file=stop_file)


def during(stream, concurrency, change, run_id, limit=1800):
    """The loop while site.yml applies `change`; (loop result, site.yml's rc, seconds)."""
    stop = Path(f"/tmp/gateway-rollout-{os.getpid()}.stop")
    stop.unlink(missing_ok=True)
    result = {}
    worker = threading.Thread(target=lambda: result.update(loop(stream, concurrency, limit, str(stop))))
    worker.start()
    time.sleep(5)
    began = time.monotonic()
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(INVENTORY),
            str(ROOT / "site.yml"),
            "-e",
            json.dumps(change),
            "-e",
            f"vllm_verify_report_run_id={run_id}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=limit,
    )
    took = time.monotonic() - began
    time.sleep(5)
    stop.touch()
    worker.join(limit)
    stop.unlink(missing_ok=True)
    return result, proc.returncode, took


def row(name, result, extra=""):
    ttft = result["ttft_ms"]
    return (
        f"| {name} | {result['requests']} | {result['failed']} | {result['cut']} | {ttft['p50']} | {ttft['p99']} "
        f"| {extra} |"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rest-seconds", type=float, default=60)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--tenant", default="lab-team-a")
    parser.add_argument("--bad", action="store_true", help="also a change that fails on the canary")
    args = parser.parse_args()
    name, address, bridge = lab_facts()
    check_route(bridge, address)
    key = (CACHE / "lab" / "api-keys" / args.tenant).read_text().strip()
    context = streamload.ssl.create_default_context(cafile=str(CACHE / "lab" / "pki" / "ca.crt"))
    stream = streamload.Stream(f"https://{address}", key, "tiny-qwen2", args.max_tokens, context, timeout=120)

    rows = [row("at rest", loop(stream, args.concurrency, args.rest_seconds))]
    current = subprocess.run(
        ["podman", "exec", "lab-1", "cat", "/etc/vllm/main.args.json"], capture_output=True, text=True, check=True
    ).stdout
    seqs = json.loads(current)
    now = int(seqs[seqs.index("--max-num-seqs") + 1])
    good, rc, took = during(
        stream, args.concurrency, {"vllm_profile": {"max_num_seqs": 6 if now != 6 else 8}}, "gateway-good"
    )
    rows.append(
        row(
            f"good rolling change (max_num_seqs {now} -> {6 if now != 6 else 8})",
            good,
            f"site.yml rc {rc}, {took:.0f} s",
        )
    )
    if args.bad:
        bad, rc, took = during(
            stream,
            args.concurrency,
            {"vllm_extra_args": {"enforce_eager": True, "tokenizer": "/nonexistent/tokenizer"}},
            "gateway-bad",
        )
        rows.append(row("bad change, canary rolled back", bad, f"site.yml rc {rc} (expected 2), {took:.0f} s"))
    print(f"{args.concurrency} concurrent streamed chat completions of {args.max_tokens} tokens through {name}")
    print("| phase | requests | failed | cut | TTFT p50 ms | TTFT p99 ms | notes |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
