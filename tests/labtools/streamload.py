"""A bounded loop of streamed chat completions through the gateway: failed requests, cut streams, TTFT.

    python -m labtools.streamload --url https://10.89.77.10 --key-file .cache/lab/api-keys/lab-team-a \\
        --cafile .cache/lab/pki/ca.crt --model tiny-qwen2 --concurrency 4 --max-tokens 48 \\
        --max-seconds 900 --max-requests 5000 --stop-file /tmp/stop

``--concurrency`` workers each send one streamed chat completion after another (``--think-seconds`` apart, as a
user reads an answer before asking again) until the stop file appears,
``--max-seconds`` pass or ``--max-requests`` were sent in all. A request *failed* when it got no answer or no
token (refused, an HTTP error, a stream with no token); a stream is *cut* when it began but ended without its
finish reason and ``[DONE]``. The result, printed as JSON: totals, the errors by kind, TTFT percentiles, and
each request's start, end and outcome (seconds since the loop began). Standard library only; point it only at
your own hosts (loopback or the lab's).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

# The benchmark's percentile (nearest rank) and its reader of a streamed answer's events.
from vllm_fleet.bench import Events, percentile


class Stream:
    """One streamed chat completion: its outcome and timings."""

    def __init__(
        self,
        url: str,
        key: str,
        model: str,
        max_tokens: int,
        context: ssl.SSLContext | None,
        timeout: float,
        connect_retries: int = 0,
        connect_timeout: float | None = None,
    ) -> None:
        parts = urllib.parse.urlsplit(url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--url {url!r} is not an http(s) URL")
        if not 0 <= connect_retries <= 20:
            raise ValueError("bounds: connect retries 0-20")
        self.parts, self.key, self.model, self.max_tokens = parts, key, model, max_tokens
        self.hostname: str = parts.hostname
        self.context, self.timeout = context, timeout
        # A client that could not connect (nothing was sent) tries again, as the openai SDK does (2 retries by
        # default): what a shared address moving between gateways must be measured against.
        self.connect_retries = connect_retries
        self.connect_timeout = timeout if connect_timeout is None else connect_timeout

    def _connection(self) -> http.client.HTTPConnection:
        if self.parts.scheme == "https":
            return http.client.HTTPSConnection(
                self.hostname, self.parts.port, timeout=self.connect_timeout, context=self.context
            )
        return http.client.HTTPConnection(self.hostname, self.parts.port, timeout=self.connect_timeout)

    def _connected(self, result: dict[str, Any]) -> http.client.HTTPConnection:
        """A connection made (TLS included), after at most ``connect_retries`` retries a quarter second apart; the
        retries it took are counted in ``result``. OSError when the last try fails too."""
        attempt = 0
        while True:
            conn = self._connection()
            try:
                conn.connect()
            except OSError:
                conn.close()
                if attempt >= self.connect_retries:
                    raise
                attempt += 1
                result["connect_retries"] = attempt
                time.sleep(0.25)
                continue
            if conn.sock is not None:
                conn.sock.settimeout(self.timeout)
            return conn

    def send(
        self, prompt: str | list[dict[str, str]], clock: Callable[[], float] = time.monotonic, keep_text: bool = False
    ) -> dict[str, Any]:
        """One streamed completion of `prompt` (a user's message, or a conversation's messages so far); with
        `keep_text`, the answer's text too (``text``), for the conversation's next turn."""
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        body = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = "Bearer " + self.key
        result: dict[str, Any] = {"outcome": "failed", "ttft": None, "tokens": 0, "error": None}
        text: list[str] = []
        start = clock()
        conn: http.client.HTTPConnection | None = None
        try:
            conn = self._connected(result)
            conn.request("POST", self.parts.path + "/v1/chat/completions", body=json.dumps(body), headers=headers)
            response = conn.getresponse()
            if response.status != 200:
                result["error"] = f"HTTP {response.status}"
                response.read()
                return result
            finished = False
            events = Events(response)
            for event in events:
                for choice in event.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if keep_text and content:
                        text.append(content)
                    if content is not None or choice.get("finish_reason"):
                        if result["ttft"] is None:
                            result["ttft"] = clock() - start
                        result["tokens"] += 1
                    if choice.get("finish_reason"):
                        finished = True
            if result["ttft"] is None:
                result["error"] = "the stream carried no token"
            elif finished and events.done:
                result["outcome"] = "ok"
            else:
                result["outcome"], result["error"] = "cut", "the stream ended before its finish reason and [DONE]"
        except (OSError, http.client.HTTPException, ValueError) as exc:
            if result["ttft"] is not None:
                result["outcome"] = "cut"
            result["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            if conn is not None:
                conn.close()
        if keep_text:
            result["text"] = "".join(text)
        return result


def run(
    stream: Stream | Sequence[Stream],
    concurrency: int,
    max_seconds: float,
    max_requests: int,
    stop_file: str | None,
    prompt: str = "Count slowly from one to one hundred, one number per line.",
    think_seconds: float = 0.0,
) -> dict[str, Any]:
    if not (
        1 <= concurrency <= 64 and 0 < max_seconds <= 7200 and 1 <= max_requests <= 100000 and 0 <= think_seconds <= 60
    ):
        raise ValueError(
            "bounds: concurrency 1-64, max-seconds up to 7200, max-requests up to 100000, think-seconds up to 60"
        )
    # Several streams (one per model): the users take them in turn, user i the stream i modulo their number.
    streams = [stream] if isinstance(stream, Stream) else list(stream)
    if not streams:
        raise ValueError("no stream to send: give at least one model")
    began, began_at = time.monotonic(), time.time()
    lock = threading.Lock()
    requests: list[dict[str, Any]] = []
    sent = [0]

    def more() -> bool:
        if stop_file and os.path.exists(stop_file):
            return False
        if time.monotonic() - began >= max_seconds:
            return False
        with lock:
            if sent[0] >= max_requests:
                return False
            sent[0] += 1
        return True

    def worker(own: Stream) -> None:
        while more():
            start = time.monotonic() - began
            result = own.send(prompt)
            result.update(model=own.model, start=round(start, 3), end=round(time.monotonic() - began, 3))
            with lock:
                requests.append(result)
            if think_seconds:
                time.sleep(think_seconds)

    threads = [
        threading.Thread(target=worker, args=(streams[i % len(streams)],), daemon=True) for i in range(concurrency)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max_seconds + max(s.timeout for s in streams) + 5)
    # When the loop began (unix time): each request's start and end are seconds after it.
    return dict(summarise(requests, time.monotonic() - began, concurrency), began_at=round(began_at, 3))


def summarise(requests: list[dict[str, Any]], wall: float, concurrency: int) -> dict[str, Any]:
    outcomes = {"ok": 0, "failed": 0, "cut": 0}
    errors: dict[str, int] = {}
    by_model: dict[str, dict[str, int]] = {}
    for request in requests:
        outcomes[request["outcome"]] += 1
        if "model" in request:
            counts = by_model.setdefault(request["model"], {"ok": 0, "failed": 0, "cut": 0})
            counts[request["outcome"]] += 1
        if request["error"]:
            errors[request["error"]] = errors.get(request["error"], 0) + 1
    ttfts = [r["ttft"] * 1000 for r in requests if r["ttft"] is not None]
    return {
        "requests": len(requests),
        "ok": outcomes["ok"],
        "failed": outcomes["failed"],
        "cut": outcomes["cut"],
        "errors": errors,
        "models": by_model,
        "concurrency": concurrency,
        "seconds": round(wall, 1),
        "ttft_ms": {"p50": _round(percentile(ttfts, 50)), "p99": _round(percentile(ttfts, 99))},
        "log": sorted(requests, key=lambda r: r["start"]),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True, help="the gateway, e.g. https://10.89.77.10")
    parser.add_argument("--key-file", help="a file holding the tenant's API key (never given on the command line)")
    parser.add_argument("--cafile", help="the CA that signed the gateway's certificate")
    parser.add_argument(
        "--model", required=True, action="append", help="a served name; repeated, the users take the models in turn"
    )
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-seconds", type=float, default=300)
    parser.add_argument("--max-requests", type=int, default=2000)
    parser.add_argument("--timeout", type=float, default=120, help="seconds one request may take")
    parser.add_argument("--stop-file", help="stop when this file appears")
    parser.add_argument("--think-seconds", type=float, default=0.0, help="each worker's pause between requests")
    parser.add_argument(
        "--connect-retries", type=int, default=0, help="tries again a request that could not connect, up to this many"
    )
    parser.add_argument("--connect-timeout", type=float, help="seconds a connection may take (default: --timeout)")
    args = parser.parse_args(argv)
    key = ""
    if args.key_file:
        with open(args.key_file) as handle:
            key = handle.read().strip()
    context = ssl.create_default_context(cafile=args.cafile) if args.cafile else ssl.create_default_context()
    streams = [
        Stream(args.url, key, model, args.max_tokens, context, args.timeout, args.connect_retries, args.connect_timeout)
        for model in args.model
    ]
    json.dump(
        run(
            streams,
            args.concurrency,
            args.max_seconds,
            args.max_requests,
            args.stop_file,
            think_seconds=args.think_seconds,
        ),
        sys.stdout,
    )
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
