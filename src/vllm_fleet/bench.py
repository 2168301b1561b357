#!/usr/bin/env python3
"""A bounded load against one vLLM server, measured from the host itself (playbooks/benchmark.yml).

Standard library only, Python 3.9+: the playbook copies this file to the host and runs it with the
host's own python3 (ansible.builtin.script), so nothing is installed there and the traffic never
leaves the host. Two phases, each bounded in requests and in time:

1. single stream: a few requests one after the other; their decode rate (1 / mean inter-token
   latency) against the planner's decode ceiling (bandwidth / weight bytes) is the efficiency;
2. the load: ``--requests`` requests, ``--concurrency`` at a time, stopped after ``--duration-s``
   (requests not yet sent are not sent; requests in flight get ``--request-timeout-s``).

Prompts are random token ids (``/v1/completions`` takes a list of ids), so their length is exact
without a tokenizer; answers run to ``max_tokens`` (``ignore_eos``, a vLLM sampling extension).
Latencies come from the streamed chunks, as ``vllm bench serve`` measures them: TTFT is the time to
the first chunk with text, inter-token latency the gaps between chunks. Preemptions and the server's
own token counters come from ``/metrics`` before and after.

    python3 bench.py --url http://127.0.0.1:8000 --model NAME [--requests 64 --concurrency 8 ...]

prints one JSON object (see :func:`run`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import random
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from typing import Any

# Upper bounds a run may not exceed, whatever it is asked: the load must stay a benchmark.
MAX_REQUESTS = 10000
MAX_CONCURRENCY = 1024
MAX_DURATION_S = 3600
_COUNTERS = ("vllm:num_preemptions", "vllm:generation_tokens", "vllm:prompt_tokens", "vllm:request_success")
# The host-side reader of /metrics: a few counters and an info metric's labels, with the standard library,
# because this file runs on hosts with nothing installed. The controller reads /metrics with prometheus_client's
# parser (vllm_fleet.metrics), and tests/unit/vllm_fleet/test_bench.py holds both readers to the same answers.
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class BenchError(ValueError):
    """Bad bounds or an unusable server answer."""


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation, as numpy's default; None when empty."""
    data = sorted(values)
    return _interpolate(data, q) if data else None


def _interpolate(data: list[float], q: float) -> float:
    """The q-th percentile (0-100) of sorted, non-empty data, with linear interpolation."""
    if len(data) == 1:
        return data[0]
    pos = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def _stats(values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    """mean, p50, p90, p99, p99.9 and max of seconds, in milliseconds (scale)."""
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "p999": None, "max": None}
    data = sorted(values)
    return {
        "mean": round(sum(values) / len(values) * scale, 3),
        "p50": round(_interpolate(data, 50) * scale, 3),
        "p90": round(_interpolate(data, 90) * scale, 3),
        "p99": round(_interpolate(data, 99) * scale, 3),
        "p999": round(_interpolate(data, 99.9) * scale, 3),
        "max": round(max(values) * scale, 3),
    }


STALL_FACTOR = 3.0


def _gap_stats(gaps: list[float]) -> dict[str, float | None]:
    """_stats of the inter-token gaps, plus the share of gaps longer than STALL_FACTOR x the median: the
    decode steps a prefill stalled. p99 alone jumps between plateaus when that share is near 1 % (seen on
    the H200: the same L40 profile gave a p99 ITL of 202 ms in one run and 79 ms in the next)."""
    out = _stats(gaps)
    if gaps:
        limit = _interpolate(sorted(gaps), 50) * STALL_FACTOR
        out["stalled_pct"] = round(100.0 * sum(1 for g in gaps if g > limit) / len(gaps), 3)
    else:
        out["stalled_pct"] = None
    return out


# Not vllm_fleet.metrics.parse: this file runs on the hosts with the standard library only, and that parser
# is prometheus_client's; the few counters here need no more than one line at a time.
def counters(text: str, names: tuple[str, ...] = _COUNTERS) -> dict[str, float]:
    """The few counters the benchmark reads (or `names`), summed over their series (names without _total)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or not match.group(1).endswith("_total"):
            continue
        name = match.group(1)[: -len("_total")]
        if name in names:
            try:
                out[name] = out.get(name, 0.0) + float(match.group(3))
            except ValueError:
                continue
    return out


def info_labels(text: str, family: str) -> dict[str, str]:
    """The labels of an info metric's first series (vllm:cache_config_info), as raw strings; {} when absent."""
    prefix = family + "{"
    for line in text.splitlines():
        if line.startswith(prefix):
            return dict(_LABEL.findall(line[: line.rindex("}") + 1]))
    return {}


def check_bounds(
    requests: int, concurrency: int, duration_s: float, prompt_tokens: int, max_tokens: int, single_requests: int
) -> None:
    problems = []
    if not 1 <= requests <= MAX_REQUESTS:
        problems.append(f"requests={requests} must be 1-{MAX_REQUESTS}")
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        problems.append(f"concurrency={concurrency} must be 1-{MAX_CONCURRENCY}")
    if not 0 < duration_s <= MAX_DURATION_S:
        problems.append(f"duration_s={duration_s} must be above 0 and at most {MAX_DURATION_S}")
    if prompt_tokens < 1 or max_tokens < 1:
        problems.append(f"prompt_tokens={prompt_tokens} and max_tokens={max_tokens} must be positive")
    if not 0 <= single_requests <= 100:
        problems.append(f"single_requests={single_requests} must be 0-100")
    if problems:
        raise BenchError("; ".join(problems))


class Events:
    """The events of a streamed OpenAI-style answer (server-sent events): each ``data:`` line's JSON, in order, until
    ``data: [DONE]``; ``done`` says whether the stream reached it (a stream cut before it did not)."""

    def __init__(self, lines: Iterable[bytes]):
        self.lines, self.done = lines, False

    def __iter__(self) -> Iterator[Any]:
        for raw in self.lines:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                self.done = True
                return
            yield json.loads(data)


class Client:
    """One HTTP(S) connection per call; the server is the host's own vLLM."""

    def __init__(self, url: str, api_key: str = "", timeout: float = 600.0, insecure: bool = False):
        parsed = urllib.parse.urlsplit(url.rstrip("/"))
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise BenchError(f"url={url!r} is not an http(s) URL")
        self.scheme, self.host, self.port = parsed.scheme, parsed.hostname, parsed.port
        self.base = parsed.path
        self.api_key, self.timeout, self.insecure = api_key, timeout, insecure

    def _connection(self) -> http.client.HTTPConnection:
        if self.scheme == "https":
            import ssl

            context = ssl._create_unverified_context() if self.insecure else ssl.create_default_context()
            return http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=context)
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def get(self, path: str) -> str:
        conn = self._connection()
        try:
            conn.request("GET", self.base + path)
            resp = conn.getresponse()
            body = resp.read().decode("utf-8", "replace")
            if resp.status != 200:
                raise BenchError(f"GET {path}: HTTP {resp.status}")
            return body
        finally:
            conn.close()

    def stream_completion(self, body: dict[str, Any], clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
        """POST /v1/completions with stream=true; times of the chunks that carry text."""
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        conn = self._connection()
        start = clock()
        out: dict[str, Any] = {"ok": False, "ttft": None, "itl": [], "latency": None, "output_tokens": 0, "error": None}
        try:
            conn.request("POST", self.base + "/v1/completions", body=json.dumps(body), headers=headers)
            resp = conn.getresponse()
            if resp.status != 200:
                out["error"] = f"HTTP {resp.status}: {resp.read()[:200].decode('utf-8', 'replace')}"
                return out
            last = None
            chunks = 0
            for event in Events(resp):
                now = clock()
                if event.get("usage"):
                    out["output_tokens"] = int(event["usage"].get("completion_tokens") or 0)
                choices = event.get("choices") or []
                # A chunk with a choice is a decode step, even when its text is empty: vLLM streams ''
                # for tokens that detokenize to nothing yet (a partial UTF-8 sequence, a special token).
                if choices:
                    chunks += 1
                    if last is None:
                        out["ttft"] = now - start
                    else:
                        out["itl"].append(now - last)
                    last = now
            out["latency"] = clock() - start
            out["output_tokens"] = out["output_tokens"] or chunks
            out["ok"] = out["ttft"] is not None
            if not out["ok"]:
                out["error"] = "the stream carried no tokens"
        except (OSError, http.client.HTTPException, ValueError) as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            conn.close()
        return out


def _prompt(rng: random.Random, tokens: int, low: int, high: int) -> list[int]:
    return [rng.randrange(low, high) for _ in range(tokens)]


def run_phase(
    client: Client,
    model: str,
    requests: int,
    concurrency: int,
    duration_s: float,
    prompt_tokens: int,
    max_tokens: int,
    seed: int = 0,
    token_ids: tuple[int, int] = (10, 1000),
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """Send up to `requests` requests, `concurrency` at a time, none started after `duration_s`."""
    rng = random.Random(seed)
    prompts = [_prompt(rng, prompt_tokens, *token_ids) for _ in range(requests)]
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    next_index = [0]
    start = clock()

    def worker() -> None:
        while True:
            with lock:
                index = next_index[0]
                if index >= requests or clock() - start >= duration_s:
                    return
                next_index[0] += 1
            body = {
                "model": model,
                "prompt": prompts[index],
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
                "ignore_eos": True,
                "stream_options": {"include_usage": True},
            }
            result = client.stream_completion(body, clock)
            with lock:
                results.append(result)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(concurrency, requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = clock() - start
    return summarise(results, wall, requests, concurrency, prompt_tokens, max_tokens)


def summarise(
    results: list[dict[str, Any]], wall: float, requests: int, concurrency: int, prompt_tokens: int, max_tokens: int
) -> dict[str, Any]:
    ok = [r for r in results if r["ok"]]
    itl = [g for r in ok for g in r["itl"]]
    output_tokens = sum(r["output_tokens"] for r in ok)
    errors = [r["error"] for r in results if not r["ok"]]
    return {
        "requests_asked": requests,
        "requests_sent": len(results),
        "completed": len(ok),
        "failed": len(errors),
        "errors": sorted({e for e in errors if e})[:5],
        "concurrency": concurrency,
        "prompt_tokens": prompt_tokens,
        "max_tokens": max_tokens,
        "wall_s": round(wall, 3),
        "output_tokens": output_tokens,
        "output_tokens_per_s": round(output_tokens / wall, 2) if wall > 0 else None,
        "requests_per_s": round(len(ok) / wall, 3) if wall > 0 else None,
        "ttft_ms": _stats([r["ttft"] for r in ok]),
        "itl_ms": _gap_stats(itl),
        "e2e_ms": _stats([r["latency"] for r in ok]),
    }


def run(
    url: str,
    model: str,
    requests: int = 64,
    concurrency: int = 8,
    duration_s: float = 120,
    prompt_tokens: int = 512,
    max_tokens: int = 256,
    single_requests: int = 3,
    decode_ceiling: float | None = None,
    api_key: str = "",
    request_timeout_s: float = 600,
    insecure: bool = False,
    seed: int = 0,
    token_ids: tuple[int, int] = (10, 1000),
) -> dict[str, Any]:
    """Both phases and the server's counters; the JSON the playbook records:
    ``{"single": phase, "load": phase, "server": {...}, "efficiency": {...}, "bounds": {...}}``."""
    check_bounds(requests, concurrency, duration_s, prompt_tokens, max_tokens, single_requests)
    client = Client(url, api_key, request_timeout_s, insecure)
    before = counters(client.get("/metrics"))
    single = None
    if single_requests:
        single = run_phase(
            client, model, single_requests, 1, duration_s, prompt_tokens, max_tokens, seed + 1, token_ids
        )
    between = counters(client.get("/metrics"))
    load = run_phase(client, model, requests, concurrency, duration_s, prompt_tokens, max_tokens, seed, token_ids)
    after = counters(client.get("/metrics"))

    def delta(a: dict[str, float], b: dict[str, float], name: str) -> float | None:
        if name not in b:
            return None
        return b[name] - a.get(name, 0.0) if b[name] >= a.get(name, 0.0) else b[name]

    server = {name.split(":", 1)[1]: delta(between, after, name) for name in _COUNTERS}
    server["preemptions_single"] = delta(before, between, "vllm:num_preemptions")
    efficiency: dict[str, Any] = {"decode_ceiling_tokens_per_s": decode_ceiling}
    mean_itl = (single or {}).get("itl_ms", {}).get("mean")
    if mean_itl:
        efficiency["single_stream_tokens_per_s"] = round(1000.0 / mean_itl, 2)
        if decode_ceiling:
            efficiency["single_stream_vs_ceiling_pct"] = round(100.0 * 1000.0 / mean_itl / decode_ceiling, 1)
    if decode_ceiling and load.get("output_tokens_per_s"):
        efficiency["load_output_vs_ceiling_pct"] = round(100.0 * load["output_tokens_per_s"] / decode_ceiling, 1)
    return {
        "url": url,
        "model": model,
        "single": single,
        "load": load,
        "server": server,
        "efficiency": efficiency,
        "bounds": {
            "requests": requests,
            "concurrency": concurrency,
            "duration_s": duration_s,
            "request_timeout_s": request_timeout_s,
            "single_requests": single_requests,
        },
    }


def guide_verdict(load: dict[str, Any], target: dict[str, Any] | None) -> dict[str, Any] | None:
    """The tuning reference's service level for the host's card (the plan's service_levels.target) against this load:
    the median TTFT under the target's, and the decode rate per user (1000 / mean inter-token gap) at least the
    target's lower bound. Judged at this benchmark's load, which is named beside the target's own."""
    if not target:
        return None
    ttft = (load.get("ttft_ms") or {}).get("p50")
    itl = (load.get("itl_ms") or {}).get("mean")
    per_user = round(1000.0 / itl, 1) if itl else None
    return {
        "card": target.get("card"),
        "ttft_target_ms": target["ttft_ms"],
        "ttft_p50_ms": ttft,
        "meets_ttft": ttft is not None and ttft < target["ttft_ms"],
        "decode_target_tokens_per_s": [target["min_tokens_per_s"], target["max_tokens_per_s"]],
        "decode_tokens_per_s_per_user": per_user,
        "meets_decode": per_user is not None and per_user >= target["min_tokens_per_s"],
        "target_load": {"users": target["users"], "prompt_tokens": target["prompt_tokens"]},
        "load": {"users": load.get("concurrency"), "prompt_tokens": load.get("prompt_tokens")},
    }


def _guide_cell(verdict: dict[str, Any] | None) -> str:
    if not verdict:
        return "-"
    if "error" in verdict:
        error: str = verdict["error"]
        return "error: " + error
    low, high = verdict["decode_target_tokens_per_s"]
    return (
        f"{verdict['card']}: TTFT {'meets' if verdict['meets_ttft'] else 'misses'} {verdict['ttft_target_ms']} ms, "
        f"decode {'meets' if verdict['meets_decode'] else 'misses'} {low}-{high} tok/s per user "
        f"(target's load {verdict['target_load']['users']} users, {verdict['target_load']['prompt_tokens']}-token "
        f"prompts)"
    )


def markdown_row(host: str, result: dict[str, Any]) -> str:
    """One row of the benchmark table (header: MARKDOWN_HEADER)."""
    load, eff, server = result.get("load") or {}, result.get("efficiency") or {}, result.get("server") or {}

    def num(value: Any, digits: int = 1) -> str:
        return "-" if value is None else (f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}")

    ttft, itl = load.get("ttft_ms") or {}, load.get("itl_ms") or {}
    cells = [
        host,
        f"{load.get('completed', 0)}/{load.get('requests_asked', 0)}",
        str(load.get("concurrency", "-")),
        num(load.get("output_tokens_per_s")),
        num(ttft.get("p50")),
        num(ttft.get("p99")),
        num(itl.get("mean"), 2),
        num(itl.get("p99"), 2),
        num(server.get("num_preemptions"), 0),
        num(eff.get("single_stream_tokens_per_s")),
        num(eff.get("decode_ceiling_tokens_per_s"), 0),
        "-" if eff.get("single_stream_vs_ceiling_pct") is None else f"{eff['single_stream_vs_ceiling_pct']}%",
        _guide_cell(result.get("guide")),
    ]
    return "| " + " | ".join(cells) + " |"


MARKDOWN_HEADER = (
    "| instance | completed | concurrency | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL mean ms | ITL p99 ms "
    "| preemptions | single-stream tok/s | planner ceiling tok/s | efficiency | reference target |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A bounded load against one vLLM server; prints JSON.")
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--duration-s", type=float, default=120)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--single-requests", type=int, default=3)
    parser.add_argument("--decode-ceiling", type=float, default=None)
    parser.add_argument("--request-timeout-s", type=float, default=600)
    parser.add_argument("--token-id-range", default="10:1000", help="LOW:HIGH of the random prompt token ids")
    parser.add_argument("--insecure", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--host-name", default="", help="the table's first column (host/instance)")
    parser.add_argument(
        "--guide-target",
        default="",
        help="the plan's service_levels.target (JSON): the tuning reference's "
        "TTFT and per-user decode targets for the card, judged on this load",
    )
    args = parser.parse_args(argv)
    import os

    try:
        low, high = (int(v) for v in args.token_id_range.split(":"))
        if not 0 <= low < high:
            raise ValueError
    except ValueError:
        print(json.dumps({"error": f"--token-id-range={args.token_id_range!r} is not LOW:HIGH"}))
        return 2
    try:
        result = run(
            args.url,
            args.model,
            args.requests,
            args.concurrency,
            args.duration_s,
            args.prompt_tokens,
            args.max_tokens,
            args.single_requests,
            args.decode_ceiling,
            os.environ.get("VLLM_BENCH_API_KEY", ""),
            args.request_timeout_s,
            args.insecure,
            args.seed,
            (low, high),
        )
    except (BenchError, OSError, http.client.HTTPException) as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 2
    try:
        target = json.loads(args.guide_target) if args.guide_target else None
        result["guide"] = guide_verdict(result["load"], target)
    except (ValueError, KeyError, TypeError) as exc:
        result["guide"] = {"error": f"--guide-target is not the plan's service_levels.target: {exc}"}
    result["markdown_row"] = markdown_row(args.host_name or args.url, result)
    result["markdown_header"] = MARKDOWN_HEADER
    print(json.dumps(result, sort_keys=True))
    return 0 if result["load"]["completed"] else 1


if __name__ == "__main__":
    sys.exit(main())
