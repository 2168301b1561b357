#!/usr/bin/env python3
"""vLLM's prefix cache hit rate and TTFT of a multi-turn workload with shared prefixes, by how requests are routed.

    benchmarks/prefix_affinity.py [--applications 2] [--conversations 6] [--turns 4] [--users 4] [--max-tokens 16]
        [--repeats 3] [--vllm-router .cache/vllm-router/bin/vllm-router]

On the lab (lab/scripts/lab.sh up: lab-1 and lab-2, two instances each, behind lab-gw and lab-gw2), the same shape of
workload (labtools.conversations: applications with their own long system prompt, conversations of several turns,
each turn sending the conversation so far) is played, each time with new text (its own seed):
1. straight to one instance (lab-1's first): the hit rate one instance reaches, the reference;
2. through the gateways' shared address with `vllm_gateway_balance: leastconn`;
3. through it with `vllm_gateway_balance: prefix` (a consistent hash of the body's start, bounded by load);
4. with --vllm-router: through vllm-router's `cache_aware` policy (its own approximate prefix tree of what each
   instance was sent, bounded by load), started here on loopback over the four instances' plain HTTP ports: the
   alternative the gateway could run behind HAProxy. It has no TLS, no tenant keys and no HAProxy hop in this path,
   which favours its TTFT against the gateway's rows.
`--prefix-bytes` and `--load-factor` set the prefix balance's key length and load bound for this run (the role's
`vllm_gateway_prefix_bytes` and `vllm_gateway_prefix_load_factor`). `--repeats` rounds play all of them, the two
balances in turn (leastconn then prefix, then prefix then leastconn, ...) so that a slow minute of the machine does
not fall on one balance alone; one row per round and way, then one per way over all rounds (TTFT percentiles over
every request of every round).
The gateways' balance is set as an operator sets it: `site.yml -l vllm_gateways -e vllm_gateway_balance=...` (the
plan, the gateway's role, `haproxy -c`, a reload without dropping connections); it is put back to the inventory's at
the end, whatever happened. Each row: requests, failed, the hit rate (every instance's `vllm:prefix_cache_hits_total`
over `queries_total`, read with the Prometheus parser, before and after), each instance's share of the prompt tokens,
and TTFT (median and p99, all turns and the later ones). Bounded in requests (repeats x applications x conversations x
turns) and seconds; nothing is sent before this machine is seen to have a route to the lab network.
"""

import argparse
import json
import os
import random
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from gateway_failover import pair_facts  # noqa: E402
from gateway_rollout import check_route  # noqa: E402

from labtools import conversations, streamload  # noqa: E402

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


def set_balance(gateway, balance=None, settings=None, timeout=900):
    """The operator's change of the gateway's balance: site.yml limited to the gateway (None: the inventory's), with
    the prefix balance's own settings when it is the one set."""
    extra = dict(settings or {}) if balance == "prefix" else {}
    change = ["-e", json.dumps({"vllm_gateway_balance": balance, **extra})] if balance else []
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
    work = conversations.workload(
        args.applications, args.conversations, args.turns, seed, args.system_words, args.question_words
    )
    before = conversations.prefix_counters(conversations.scrape(urls))
    began = time.monotonic()
    results = conversations.play(
        lambda messages: stream.send(messages, keep_text=True), work, args.users, args.max_seconds
    )
    took = time.monotonic() - began
    time.sleep(2)  # the last requests' counters
    after = conversations.prefix_counters(conversations.scrape(urls))
    return dict(
        name=name,
        results=results,
        **conversations.summarise(results, took, args.users),
        **conversations.hit_rate(before, after),
    )


def pooled(name, runs, users):
    """One way's rounds together: TTFT over every request, the hit rate over every queried token."""
    results = [r for run in runs for r in run["results"]]
    tokens = sum(run["queried_tokens"] for run in runs)
    shares = {k: sum(run["share"][k] * run["queried_tokens"] for run in runs) / tokens for k in runs[0]["share"]}
    return dict(
        name=f"{name}, {len(runs)} rounds",
        **conversations.summarise(results, sum(run["seconds"] for run in runs), users),
        hit_rate=round(sum(run["hit_rate"] * run["queried_tokens"] for run in runs) / tokens, 4),
        queried_tokens=tokens,
        share={k: round(v, 3) for k, v in shares.items()},
    )


def row(result, reference=None):
    ratio = f"{result['hit_rate'] / reference:.2f}" if reference and result["hit_rate"] is not None else ""
    shares = ", ".join(f"{k.split('/')[0][-1]}/{k.split('/')[1]} {v}" for k, v in result["share"].items() if v)
    return (
        f"| {result['name']} | {result['requests']} | {result['failed'] + result['cut']} | {result['hit_rate']} "
        f"| {ratio} | {shares} "
        f"| {result['ttft_ms']['p50']} | {result['ttft_ms']['p99']} | {result['ttft_ms_later_turns']['p50']} "
        f"| {result['ttft_ms_later_turns']['p99']} |"
    )


class Router:
    """vllm-router (the executable given) on loopback over the instances, for as long as the `with` lasts."""

    def __init__(self, executable, workers, port=30080, ready_seconds=60):
        self.url = f"http://127.0.0.1:{port}"
        self.log = (CACHE / "logs" / "vllm-router.log").open("w")
        command = [executable, "--host", "127.0.0.1", "--port", str(port), "--policy", "cache_aware"]
        self.proc = subprocess.Popen([*command, "--worker-urls", *workers], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + ready_seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"vllm-router ended ({self.proc.returncode}); its output: {self.log.name}")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(1)
        self.close()
        sys.exit(f"vllm-router did not answer on {self.url} within {ready_seconds} s; its output: {self.log.name}")

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--applications", type=int, default=2)
    parser.add_argument("--conversations", type=int, default=6, help="per application")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--system-words", type=int, default=300)
    parser.add_argument("--question-words", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-seconds", type=float, default=600, help="for each way in each round")
    parser.add_argument("--repeats", type=int, default=3, help="rounds, 1 to 10")
    parser.add_argument("--vllm-router", help="the vllm-router executable: adds its cache_aware policy as a way")
    parser.add_argument(
        "--prefix-bytes", type=int, help="vllm_gateway_prefix_bytes for the prefix balance (default: the role's)"
    )
    parser.add_argument("--load-factor", type=int, help="vllm_gateway_prefix_load_factor for it (default: the role's)")
    parser.add_argument("--tenant", default="lab-team-a")
    parser.add_argument(
        "--seed", type=int, default=None, help="default: a new one, so that no earlier run's cache helps"
    )
    args = parser.parse_args()
    if not 1 <= args.repeats <= 10:
        parser.error("--repeats must be from 1 to 10")
    _, address, bridge = pair_facts()
    gateway = "vllm_gateways"  # every gateway gets the balance; requests go to the address they share
    check_route(bridge, address)
    lab = instances()
    urls = {name: f"{url}/metrics" for name, url in lab.items()}
    key = (CACHE / "lab" / "api-keys" / args.tenant).read_text().strip()
    context = ssl.create_default_context(cafile=str(CACHE / "lab" / "pki" / "ca.crt"))
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    first = next(iter(lab.values()))
    settings = {
        name: value
        for name, value in (
            ("vllm_gateway_prefix_bytes", args.prefix_bytes),
            ("vllm_gateway_prefix_load_factor", args.load_factor),
        )
        if value is not None
    }
    runs = {}  # way: [one result a round]
    router = Router(args.vllm_router, list(lab.values())) if args.vllm_router else None
    balance = None
    try:
        for round_ in range(args.repeats):
            base = seed + 10 * round_
            runs.setdefault("one instance", []).append(measure("one instance", first, "", None, urls, args, base))
            order = ("leastconn", "prefix") if round_ % 2 == 0 else ("prefix", "leastconn")
            for offset, way in enumerate(order, start=1):
                if way != balance:
                    set_balance(gateway, way, settings)
                    balance = way
                name = f"gateway, {way}"
                runs.setdefault(name, []).append(
                    measure(name, f"https://{address}", key, context, urls, args, base + offset)
                )
            if router:
                name = "vllm-router, cache_aware"
                runs.setdefault(name, []).append(measure(name, router.url, "", None, urls, args, base + 3))
    finally:
        if router:
            router.close()
        if balance:
            set_balance(gateway)
    print(
        f"{args.repeats} rounds of {args.applications} applications x {args.conversations} conversations x "
        f"{args.turns} turns ({args.system_words}-word system prompts, {args.question_words}-word questions, "
        f"{args.max_tokens} tokens an answer), {args.users} users, seed {seed}"
        + (f"; prefix balance with {settings}" if settings else "")
    )
    print(
        "| routing | requests | failed | prefix cache hit rate | of one instance's | prompt tokens by instance "
        "| TTFT p50 ms | TTFT p99 ms | later turns p50 | later turns p99 |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for round_ in range(args.repeats):
        reference = runs["one instance"][round_]["hit_rate"]
        for name, results in runs.items():
            result = dict(results[round_], name=f"{name}, round {round_ + 1}")
            print(row(result, None if name == "one instance" else reference))
    together = {name: pooled(name, results, args.users) for name, results in runs.items()}
    reference = together["one instance"]["hit_rate"]
    for name, result in together.items():
        print(row(result, None if name == "one instance" else reference))
    for results in runs.values():
        for result in results:
            result.pop("results")
    print(json.dumps({"rounds": runs, "together": together}, indent=1), file=sys.stderr)


if __name__ == "__main__":
    main()
