#!/usr/bin/env python3
"""vLLM's prefix cache hit rate and TTFT of a multi-turn workload with shared prefixes, by how the gateway routes.

    benchmarks/prefix_affinity.py [--applications 2] [--conversations 6] [--turns 4] [--users 4] [--max-tokens 16]

On the lab (lab/scripts/lab.sh up: lab-1 and lab-2, two instances each, behind lab-gw and lab-gw2), the same shape of
workload (vllm_fleet.conversations: applications with their own long system prompt, conversations of several turns,
each turn sending the conversation so far) is played three times, each with new text (its own seed):
1. straight to one instance (lab-1's first): the hit rate one instance reaches, the reference;
2. through the gateways' shared address with `vllm_gateway_balance: leastconn`;
3. through it with `vllm_gateway_balance: prefix` (a consistent hash of the body's start, bounded by load).
The gateways' balance is set as an operator sets it: `site.yml -l vllm_gateways -e vllm_gateway_balance=...` (the
plan, the gateway's role, `haproxy -c`, a reload without dropping connections); it is put back to the inventory's at
the end, whatever happened. Prints one row per way: requests, failed, the hit rate (every instance's
`vllm:prefix_cache_hits_total` over `queries_total`, read with the Prometheus parser, before and after), each
instance's share of the prompt tokens, and TTFT (median and p99, all turns and the later ones). Bounded in requests
(applications x conversations x turns) and seconds; nothing is sent before this machine is seen to have a route to
the lab network.
"""

import argparse
import json
import os
import random
import ssl
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from gateway_failover import pair_facts  # noqa: E402
from gateway_rollout import check_route  # noqa: E402

from vllm_fleet import conversations, streamload  # noqa: E402

INVENTORY = ROOT / "lab" / "inventory"
CACHE = Path(os.environ.get("CACHE_DIR", ROOT / ".cache"))


def instances():
    """{host/instance: base URL} of the lab's vLLM instances, from the lab's own inventory and plan settings."""
    hosts = yaml.safe_load((INVENTORY / "hosts.yml").read_text())["all"]["children"]
    nodes = hosts["vllm_nodes"]["children"]["lab_nodes"]["hosts"]
    return {
        f"{name}/cpu{index}": f"http://{host['ansible_host']}:{8000 + index}"
        for name, host in sorted(nodes.items())
        for index in range(2)
    }


def set_balance(gateway, balance=None, timeout=900):
    """The operator's change of the gateway's balance: site.yml limited to the gateway (None: the inventory's)."""
    change = ["-e", json.dumps({"vllm_gateway_balance": balance})] if balance else []
    playbook = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(INVENTORY), str(ROOT / "site.yml")]
    proc = subprocess.run(
        [*playbook, "-l", gateway, *change],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        sys.exit(f"site.yml -l {gateway} with vllm_gateway_balance={balance} failed:\n{proc.stdout[-3000:]}")


def measure(name, url, key, context, urls, args, seed):
    stream = streamload.Stream(url, key, "tiny-qwen2", args.max_tokens, context, timeout=120)
    work = conversations.workload(args.applications, args.conversations, args.turns, seed, args.system_words)
    before = conversations.prefix_counters(conversations.scrape(urls))
    began = time.monotonic()
    results = conversations.play(
        lambda messages: stream.send(messages, keep_text=True), work, args.users, args.max_seconds
    )
    took = time.monotonic() - began
    time.sleep(2)  # the last requests' counters
    after = conversations.prefix_counters(conversations.scrape(urls))
    return dict(
        name=name, **conversations.summarise(results, took, args.users), **conversations.hit_rate(before, after)
    )


def row(result, reference=None):
    ratio = (
        f"{result['hit_rate'] / reference:.2f}"
        if reference and result["hit_rate"] is not None and result["name"] != "one instance"
        else ""
    )
    shares = ", ".join(f"{k.split('/')[0][-1]}/{k.split('/')[1]} {v}" for k, v in result["share"].items() if v)
    return (
        f"| {result['name']} | {result['requests']} | {result['failed'] + result['cut']} | {result['hit_rate']} "
        f"| {ratio} | {shares} "
        f"| {result['ttft_ms']['p50']} | {result['ttft_ms']['p99']} | {result['ttft_ms_later_turns']['p50']} "
        f"| {result['ttft_ms_later_turns']['p99']} |"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--applications", type=int, default=2)
    parser.add_argument("--conversations", type=int, default=6, help="per application")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--system-words", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-seconds", type=float, default=600)
    parser.add_argument("--tenant", default="lab-team-a")
    parser.add_argument(
        "--seed", type=int, default=None, help="default: a new one, so that no earlier run's cache helps"
    )
    args = parser.parse_args()
    _, address, bridge = pair_facts()
    gateway = "vllm_gateways"  # every gateway gets the balance; requests go to the address they share
    check_route(bridge, address)
    urls = {name: f"{url}/metrics" for name, url in instances().items()}
    key = (CACHE / "lab" / "api-keys" / args.tenant).read_text().strip()
    context = ssl.create_default_context(cafile=str(CACHE / "lab" / "pki" / "ca.crt"))
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    results = []
    try:
        first = next(iter(instances().values()))
        results.append(measure("one instance", first, "", None, urls, args, seed))
        for offset, balance in enumerate(("leastconn", "prefix"), start=1):
            set_balance(gateway, balance)
            results.append(
                measure(f"gateway, {balance}", f"https://{address}", key, context, urls, args, seed + offset)
            )
    finally:
        set_balance(gateway)
    print(
        f"{args.applications} applications x {args.conversations} conversations x {args.turns} turns "
        f"({args.system_words}-word system prompts, {args.max_tokens} tokens an answer), {args.users} users, "
        f"seed {seed}"
    )
    print(
        "| routing | requests | failed | prefix cache hit rate | of one instance's | prompt tokens by instance "
        "| TTFT p50 ms | TTFT p99 ms | later turns p50 | later turns p99 |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    reference = results[0]["hit_rate"] if results else None
    for result in results:
        print(row(result, reference))
    print(json.dumps(results, indent=1), file=sys.stderr)


if __name__ == "__main__":
    main()
