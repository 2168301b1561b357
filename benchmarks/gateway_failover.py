#!/usr/bin/env python3
"""The gateways' shared address moving under load: how long clients go unanswered, and what they lose.

    benchmarks/gateway_failover.py [--ways haproxy,stop,kill] [--repeats 3] [--concurrency 2]
    benchmarks/gateway_failover.py --gateways fleet-gw,fleet-gw2 --vip 10.89.77.29 \
        --model tiny-qwen2 --model tiny-qwen2-b          # the fleet scenario's pair and its two models

On the lab (lab/scripts/lab.sh up: lab-gw and lab-gw2 sharing 10.89.77.9 through keepalived's VRRP), a bounded loop
of streamed chat completions (labtools.streamload, connections retried as the openai SDK retries them) runs through
the shared address while the gateway holding it loses, in turn: its HAProxy (`systemctl stop haproxy`), its host
shut down cleanly (`podman stop`, systemd's shutdown) and its host gone at once (`podman kill`, as a power loss).
A watch asks the address's /health every 50 ms (labtools.failover). Each trial prints the time from the first
unanswered ask to the next answer, the requests lost (failed or cut) and how many of them began after the address
answered again (none may), and the seconds from the act to the next answer. With --limited-tenant, that tenant is
brought to its request-rate limit (429) before each act and asked once more after the address moved: the status it
gets says whether its count moved with the address (HAProxy's peers). Then the gateway is brought back and both are
seen serving before the next trial. Every
loop is bounded in requests and seconds; nothing is sent before this machine is seen to have a route to the lab
network (its bridge holds the lab's gateway address).
"""

import argparse
import os
import ssl
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from gateway_rollout import check_route  # noqa: E402

from labtools import failover, streamload  # noqa: E402

INVENTORY = ROOT / "lab" / "inventory"
CACHE = Path(os.environ.get("CACHE_DIR", ROOT / ".cache"))
WAYS = {
    "haproxy": "its HAProxy stopped",
    "stop": "its host shut down (podman stop)",
    "kill": "its host gone at once (podman kill)",
}


def pair_facts():
    """The lab's gateways, the address they share and the lab network's bridge address (lab/inventory)."""
    hosts = yaml.safe_load((INVENTORY / "hosts.yml").read_text())["all"]["children"]["vllm_gateways"]
    network = yaml.safe_load((INVENTORY / "group_vars" / "all.yml").read_text())
    return list(hosts["hosts"]), hosts["vars"]["vllm_gateway_vip"].split("/")[0], network["lab_gateway"]


def inside(host, *cmd, check=False):
    return subprocess.run(["podman", "exec", host, *cmd], capture_output=True, text=True, check=check)


def holders(gateways, vip):
    return [g for g in gateways if vip in inside(g, "ip", "-o", "addr", "show", "to", vip).stdout]


def serving(gateways, vip, bound=120):
    """Wait until every gateway runs HAProxy and keepalived and exactly one holds the address (at most `bound` s)."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        up = all(inside(g, "systemctl", "is-active", "haproxy", "keepalived").returncode == 0 for g in gateways)
        if up and len(holders(gateways, vip)) == 1:
            return
        time.sleep(1)
    sys.exit(f"the gateways {gateways} did not all come back serving within {bound} s")


def act(way, host):
    if way == "haproxy":
        inside(host, "systemctl", "stop", "haproxy.service", check=True)
    else:
        subprocess.run(["podman", way, host], check=True, capture_output=True)


def restore(way, host):
    if way == "haproxy":
        inside(host, "systemctl", "start", "haproxy.service", check=True)
    else:
        subprocess.run(["podman", "start", host], check=True, capture_output=True)


def status(vip, key, context):
    """The HTTP status of one GET /v1/models through the shared address with the tenant's key."""
    request = urllib.request.Request(f"https://{vip}/v1/models", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:
        return refused.code
    except OSError:
        return None


def at_limit(vip, key, context, most=400):
    """Ask until the tenant is refused for its rate (429), at most `most` times; whether it was."""
    return any(status(vip, key, context) == 429 for _ in range(most))


def trial(way, gateways, vip, stream, context, concurrency, limited_key=None):
    serving(gateways, vip)
    (holder,) = holders(gateways, vip)
    stop = Path(f"/tmp/gateway-failover-{os.getpid()}.stop")
    stop.unlink(missing_ok=True)
    result = {}
    loop = threading.Thread(
        target=lambda: result.update(streamload.run(stream, concurrency, 120, max_requests=5000, stop_file=str(stop)))
    )
    loop.start()
    with failover.Watch(vip, context, seconds=90) as watch:
        time.sleep(3)
        limited = at_limit(vip, limited_key, context) if limited_key else None
        acted_at, acted_unix = watch.now(), time.time()
        act(way, holder)
        acted_took = watch.now() - acted_at  # the old holder is gone when its stop returns
        watch.wait_answering(since=watch.now())
        limited_after = status(vip, limited_key, context) if limited_key else None
        time.sleep(3)
    stop.touch()
    loop.join(180)
    stop.unlink(missing_ok=True)
    window = failover.outage(watch.answers, acted_at)
    # From when the address answered again, and the old holder was gone (its stop returned), every request must
    # succeed; one lost before began while it was still the holder's.
    served_again = acted_took if window["first_failed"] is None else max((window["back"] or 1e9) - acted_at, acted_took)
    back = acted_unix + served_again - result["began_at"]
    lost = [r for r in result["log"] if r["outcome"] != "ok"]
    after = [r for r in result["log"] if r["start"] >= back]
    retried = sum(1 for r in result["log"] if r.get("connect_retries"))
    restore(way, holder)
    return {
        "way": way,
        "holder": holder,
        "taken_by": holders(gateways, vip),
        "outage_s": window["seconds"] if window["first_failed"] is not None else 0.0,
        # From the act to the first answer after the first unanswered ask (0 when no ask went unanswered).
        "answered_again_s": round(window["back"] - acted_at, 3) if window["back"] is not None else 0.0,
        "tenant_at_limit_before": limited,
        "tenant_status_after": limited_after,
        "requests": result["requests"],
        "lost": len(lost),
        "lost_after_back": sum(1 for r in lost if r["start"] >= back),
        "after_back": len(after),
        "retried_connections": retried,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ways", default="haproxy,stop,kill")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--tenant", default="lab-team-a")
    parser.add_argument("--gateways", help="the pair's container names (default: the lab inventory's gateways)")
    parser.add_argument("--vip", help="the shared address (default: the lab inventory's vllm_gateway_vip)")
    parser.add_argument("--model", action="append", help="a served name (repeated: the users take them in turn)")
    parser.add_argument("--limited-tenant", help="a tenant with a request-rate limit, brought to it before each act")
    args = parser.parse_args()
    ways = args.ways.split(",")
    if not (set(ways) <= set(WAYS) and 1 <= args.repeats <= 10 and 1 <= args.concurrency <= 16):
        sys.exit(f"--ways of {', '.join(WAYS)}; --repeats 1-10; --concurrency 1-16")
    gateways, vip, bridge = pair_facts()
    gateways = args.gateways.split(",") if args.gateways else gateways
    vip = args.vip or vip
    check_route(bridge, vip)
    key = (CACHE / "lab" / "api-keys" / args.tenant).read_text().strip()
    context = ssl.create_default_context(cafile=str(CACHE / "lab" / "pki" / "ca.crt"))
    streams = [
        streamload.Stream(
            f"https://{vip}", key, model, args.max_tokens, context, timeout=120, connect_retries=20, connect_timeout=1
        )
        for model in args.model or ["tiny-qwen2"]
    ]
    limited_key = (
        (CACHE / "lab" / "api-keys" / args.limited_tenant).read_text().strip() if args.limited_tenant else None
    )
    rows = []
    print(
        "| the holder lost | moved | outage s | answered again after the act, s | requests | lost | lost after "
        "back | after back | retried connections | tenant at its limit before, status after |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for way in ways:
        for _ in range(args.repeats):
            rows.append(trial(way, gateways, vip, streams, context, args.concurrency, limited_key))
            r = rows[-1]
            print(
                f"| {WAYS[way]} | {r['holder']} -> {','.join(r['taken_by'])} | {r['outage_s']} "
                f"| {r['answered_again_s']} | {r['requests']} | {r['lost']} | {r['lost_after_back']} "
                f"| {r['after_back']} | {r['retried_connections']} "
                f"| {r['tenant_at_limit_before']}, {r['tenant_status_after']} |",
                flush=True,
            )
    serving(gateways, vip)
    print(f"\n{args.concurrency} streamed chat completions of {args.max_tokens} tokens at a time through {vip}")
    print(
        "| the holder lost | trials | outage s, median | outage s, max | answered again after the act s, max | lost "
        "| lost after the address answered |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for way in ways:
        mine = [r for r in rows if r["way"] == way]
        outages = [r["outage_s"] for r in mine if r["outage_s"] is not None]
        print(
            f"| {WAYS[way]} | {len(mine)} | {statistics.median(outages) if outages else '-'} "
            f"| {max(outages) if outages else '-'} | {max(r['answered_again_s'] for r in mine)} "
            f"| {sum(r['lost'] for r in mine)} | {sum(r['lost_after_back'] for r in mine)} |"
        )


if __name__ == "__main__":
    main()
