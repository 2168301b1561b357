"""A bounded request loop against vLLM hosts during a rollout: failed requests and unhealthy seconds.

    python -m labtools.probe --target lab-1=http://10.89.77.11:8000 --target lab-2=http://... \\
        --stop-file /tmp/stop --max-seconds 900 --max-requests 20000 --run-dir reports/<run>

One thread per host sends a short real completion (and reads ``/health``) every ``--interval`` seconds
until the stop file appears, ``--max-seconds`` pass or ``--max-requests`` requests were sent in all.
A host is unhealthy from its first failed request (or non-200 ``/health``) to its next good one; the
windows are kept with their times relative to the loop's start. The result is printed as JSON and,
with ``--run-dir``, written as one ``rollout`` fragment per host into ``<run-dir>/hosts/`` for
``python -m vllm_fleet.report --merge``. Point it only at your own hosts: loopback or the lab's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from vllm_fleet import fragments


class HostProbe:
    """The loop's view of one host."""

    def __init__(self, name: str, url: str, model: str | None, api_key: str | None) -> None:
        self.name, self.url, self.model, self.api_key = name, url.rstrip("/"), model, api_key
        self.total = 0
        self.failed = 0
        self.windows: list[list[float]] = []  # [start, end] seconds since the loop began
        self.errors: dict[str, int] = {}
        self._down_since: float | None = None

    def _request(self, path: str, body: dict[str, Any] | None, timeout: float) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method="POST" if data else "GET")
        req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw[:1] in (b"{", b"[") else raw)

    def discover_model(self) -> None:
        if self.model:
            return
        try:
            _, body = self._request("/v1/models", None, 5)
            self.model = body["data"][0]["id"]
        except (urllib.error.URLError, OSError, KeyError, IndexError, ValueError):
            self.model = None

    def once(self, now: float, timeout: float) -> bool:
        """One health read and one completion; True when both worked."""
        self.total += 1
        error = None
        try:
            status, _ = self._request("/health", None, timeout)
            if status != 200:
                error = f"health {status}"
            else:
                self.discover_model()
                status, body = self._request(
                    "/v1/completions", {"model": self.model, "prompt": "Hello", "max_tokens": 2}, timeout
                )
                if status != 200 or not body.get("choices"):
                    error = f"completion {status}"
        except urllib.error.HTTPError as exc:
            error = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            error = type(getattr(exc, "reason", exc)).__name__
        if error:
            self.failed += 1
            self.errors[error] = self.errors.get(error, 0) + 1
            if self._down_since is None:
                self._down_since = now
            return False
        if self._down_since is not None:
            self.windows.append([round(self._down_since, 2), round(now, 2)])
            self._down_since = None
        return True

    def close(self, now: float) -> None:
        if self._down_since is not None:
            self.windows.append([round(self._down_since, 2), round(now, 2)])
            self._down_since = None

    def result(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "total_requests": self.total,
            "failed_requests": self.failed,
            "unhealthy_seconds": round(sum(end - start for start, end in self.windows), 2),
            "unhealthy_windows": self.windows,
            "errors": self.errors,
        }


def run(
    probes: list[HostProbe],
    interval: float,
    max_seconds: float,
    max_requests: int,
    stop_file: Path | None,
    timeout: float,
) -> dict[str, Any]:
    start = time.monotonic()
    lock = threading.Lock()
    sent = [0]
    stop = threading.Event()

    def loop(probe: HostProbe) -> None:
        while not stop.is_set():
            now = time.monotonic() - start
            with lock:
                if sent[0] >= max_requests:
                    stop.set()
                    break
                sent[0] += 1
            probe.once(now, timeout)
            stop.wait(interval)
        probe.close(time.monotonic() - start)

    threads = [threading.Thread(target=loop, args=(p,), daemon=True) for p in probes]
    for t in threads:
        t.start()
    while not stop.is_set():
        elapsed = time.monotonic() - start
        if elapsed >= max_seconds or (stop_file is not None and stop_file.exists()):
            stop.set()
            break
        time.sleep(0.2)
    for t in threads:
        t.join(timeout + interval + 5)
    return {
        "seconds": round(time.monotonic() - start, 2),
        "hosts": {p.name: p.result() for p in probes},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labtools.probe", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--target",
        action="append",
        required=True,
        metavar="NAME=URL",
        help="a host and its base URL, e.g. lab-1=http://10.89.77.11:8000 (repeat)",
    )
    parser.add_argument("--model", help="served model name (default: read from /v1/models)")
    parser.add_argument("--api-key", help="bearer token for /v1 (prefer the VLLM_API_KEY environment variable)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between a host's requests")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds before a request counts as failed")
    parser.add_argument("--max-seconds", type=float, default=900.0, help="hard bound on the loop's duration")
    parser.add_argument("--max-requests", type=int, default=20000, help="hard bound on requests, all hosts")
    parser.add_argument("--stop-file", type=Path, help="stop as soon as this file exists")
    parser.add_argument("--run-dir", type=Path, help="write one rollout fragment per host into RUN_DIR/hosts/")
    args = parser.parse_args(argv)
    api_key = args.api_key or os.environ.get("VLLM_API_KEY")
    probes = []
    for target in args.target:
        name, sep, url = target.partition("=")
        if not sep or not url.startswith(("http://", "https://")):
            parser.error(f"--target {target!r}: want NAME=http://HOST:PORT")
        probes.append(HostProbe(name, url, args.model, api_key))
    result = run(probes, args.interval, args.max_seconds, args.max_requests, args.stop_file, args.timeout)
    if args.run_dir:
        hosts_dir = args.run_dir / "hosts"
        hosts_dir.mkdir(parents=True, exist_ok=True)
        for name, data in result["hosts"].items():
            frag = fragments.fragment(name, "rollout", dict(data, loop_seconds=result["seconds"]))
            (hosts_dir / fragments.fragment_name(frag)).write_text(json.dumps(frag, indent=2, sort_keys=True) + "\n")
    json.dump(result, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
