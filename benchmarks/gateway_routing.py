#!/usr/bin/env python3
"""What routing by model costs at the gateway: latency against the single backend it replaced, and memory per
request against the body limit.

    benchmarks/gateway_routing.py [--rounds 5] [--requests 400] [--before 8f4c173]

Both run the production example's gateway as the vllm_gateway role renders it, with Debian 12's own HAProxy 2.6 on
this machine's loopback in front of stand-ins of vLLM that answer at once (benchmarks/gateway_loopback.py), so that
what is measured is the gateway alone:

1. Latency, side by side in one run: the configuration of the revision `--before` (one backend for every instance,
   the body not read) and this checkout's (the body read whole, the model looked up, one backend per model), each its
   own HAProxy, one keep-alive TLS client each, their rounds interleaved (A B, B A...). Two bodies: a typical chat
   request (about 2 KB) and one whose model comes after 1,000,000 bytes of messages (this checkout routes it by its
   model; the single backend sends it anywhere). Prints p50 and p99 in milliseconds per configuration and body.
2. Memory: this checkout's configuration with vllm_gateway_max_body_bytes 64 KiB, 1 MiB and 4 MiB, 200 requests of
   60 KB held in flight at once by the stand-ins, then 40 of 900 KB: the HAProxy process's resident memory before
   and at its peak, per request.

Every loop is bounded (requests per round, rounds, seconds per request); traffic stays on loopback.
"""

import argparse
import http.client
import json
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from gateway_loopback import (  # noqa: E402
    BACKENDS,
    GATEWAYS,
    KEYS,
    LARGE,
    SMALL,
    Backend,
    free_port,
    haproxy,
    render,
    rss_kib,
    start,
)

CONTEXT = ssl.create_default_context()
CONTEXT.check_hostname = False
CONTEXT.verify_mode = ssl.CERT_NONE  # the run's own self-signed certificate, on loopback


def wait_ready(address, port, seconds=20):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if post(client(address, port), {"model": SMALL, "prompt": "hi"})[0] == 200:
                time.sleep(1.5)  # two health checks of 0.5 s take every stand-in in
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the gateway at {address}:{port} did not serve within {seconds} s")


def client(address, port):
    return http.client.HTTPSConnection(address, port, context=CONTEXT, timeout=30)


def post(conn, body, raw=None):
    data = raw if raw is not None else json.dumps(body).encode()
    conn.request(
        "POST",
        "/v1/chat/completions",
        data,
        {"Authorization": f"Bearer {KEYS['chat-frontend']}", "Content-Type": "application/json"},
    )
    answer = conn.getresponse()
    answer.read()
    return answer.status, None


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def latency(args, command, tmp):
    before = tmp / "before.cfg.j2"
    before.write_text(
        subprocess.run(
            ["git", "show", f"{args.before}:roles/vllm_gateway/templates/haproxy.cfg.j2"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    address = next(iter(GATEWAYS.values()))
    setups = {}
    for name, template in (("single backend (" + args.before + ")", before), ("by model (this checkout)", None)):
        ports = {"front": free_port(), "metrics": free_port(), "peers": free_port()}
        folder = tmp / name.split()[0]
        folder.mkdir()
        etc = render(folder, ports, template)
        config = etc / next(iter(GATEWAYS)) / "haproxy.cfg"
        setups[name] = (ports["front"], start(command, config))
    try:
        for port, _ in setups.values():
            wait_ready(address, port)
        bodies = {
            "2 KB chat": json.dumps(
                {"messages": [{"role": "user", "content": "hello " * 330}], "model": SMALL}
            ).encode(),
            "1 MB, model last": json.dumps(
                {"messages": [{"role": "user", "content": "x" * 1_000_000}], "model": LARGE}
            ).encode(),
        }
        times = {(name, body): [] for name in setups for body in bodies}
        for round_ in range(args.rounds):
            order = list(setups) if round_ % 2 == 0 else list(reversed(setups))
            for name in order:
                port = setups[name][0]
                for body, data in bodies.items():
                    conn = client(address, port)
                    count = args.requests if body.startswith("2 KB") else max(20, args.requests // 10)
                    for _ in range(count):
                        started = time.perf_counter()
                        status, _ = post(conn, None, raw=data)
                        if status != 200:
                            raise RuntimeError(f"{name}: HTTP {status} for the {body} body")
                        times[(name, body)].append((time.perf_counter() - started) * 1000)
                    conn.close()
        print(f"Latency through the gateway, {args.rounds} interleaved rounds (ms; stand-ins answer at once)")
        print(f"{'configuration':<34} {'body':<18} {'requests':>8} {'p50':>8} {'p99':>8} {'mean':>8}")
        for (name, body), values in times.items():
            print(
                f"{name:<34} {body:<18} {len(values):>8} {percentile(values, 50):>8.3f} "
                f"{percentile(values, 99):>8.3f} {statistics.fmean(values):>8.3f}"
            )
    finally:
        for _, proc in setups.values():
            proc.terminate()
            proc.wait(timeout=10)


def held(pid, address, port, count, size):
    """(resident KiB before, at the peak) of the HAProxy process `pid` while `count` requests of `size` bytes of
    messages are sent at once and held 3 s by the stand-ins."""
    idle = rss_kib(pid)
    peak = [idle]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak.append(rss_kib(pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    data = json.dumps({"hold": 3, "messages": [{"role": "user", "content": "x" * size}], "model": SMALL}).encode()

    def one(_):
        conn = client(address, port)
        try:
            return post(conn, None, raw=data)[0]
        finally:
            conn.close()

    try:
        with ThreadPoolExecutor(count) as pool:
            statuses = list(pool.map(one, range(count)))
    finally:
        done.set()
        sampler.join()
    if statuses != [200] * count:
        raise RuntimeError(f"{count} requests of {size} bytes: answers {sorted(set(statuses))}")
    return idle, max(peak)


def memory(command, tmp):
    address = next(iter(GATEWAYS.values()))
    print("\nMemory of the gateway's HAProxy process (resident, KiB) with requests held in flight")
    print(f"{'body limit':>12} {'requests':>8} {'body':>9} {'idle':>8} {'peak':>8} {'per request':>12}")
    for limit in (65536, 1048576, 4194304):
        ports = {"front": free_port(), "metrics": free_port(), "peers": free_port()}
        folder = tmp / f"limit-{limit}"
        folder.mkdir()
        etc = render(folder, ports, None, {"vllm_gateway_max_body_bytes": limit})
        proc = start(command, etc / next(iter(GATEWAYS)) / "haproxy.cfg")
        try:
            wait_ready(address, ports["front"])
            for count, size in ((200, 60_000), (40, 900_000)):
                if size > limit:
                    continue
                idle, peak = held(proc.pid, address, ports["front"], count, size)
                print(f"{limit:>12} {count:>8} {size:>9} {idle:>8} {peak:>8} {(peak - idle) / count:>12.0f}")
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=400, help="2 KB requests per configuration and round")
    parser.add_argument("--before", default="8f4c173", help="the revision whose gateway had one backend")
    args = parser.parse_args()
    if shutil.which("dpkg-deb") is None:
        sys.exit("dpkg-deb is missing (Debian's dpkg): it unpacks the lab mirror's HAProxy package")
    tmp = Path(tempfile.mkdtemp(prefix="gateway-routing-"))
    backends = [Backend(address) for address in BACKENDS.values()]
    try:
        command = haproxy(tmp)
        latency(args, command, tmp)
        memory(command, tmp)
    except RuntimeError as exc:
        sys.exit(str(exc))
    finally:
        for backend in backends:
            backend.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
