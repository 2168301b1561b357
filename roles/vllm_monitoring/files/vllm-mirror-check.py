#!/usr/bin/python3
# The mirror's check against the signed bundle (the vllm_monitoring role; docs/air-gap.md): on the monitoring host,
# read what the site's mirror serves over HTTP, file by file, and compare it with the manifest the site signed.
#
#   vllm-mirror-check.py check --config /etc/vllm-mirror-check/config.json   # once (vllm-mirror-check.timer, daily)
#   vllm-mirror-check.py serve --config /etc/vllm-mirror-check/config.json   # its last result, for Prometheus
#
# The manifest it compares with was read on the controller by the role's run and its signature checked there with
# the site's public key (the vllm_signed_manifest action): this program trusts that copy
# (/etc/vllm-mirror-check/expected.sha256), and the mirror for nothing. Each file the manifest lists is fetched and
# hashed as it streams; one that differs, is missing or cannot be read is named in the journal with both digests, and
# counted in the metrics the serve mode answers (Prometheus' job vllm_mirror; VllmMirrorDiffers fires on them).
# The mirror's own BUNDLE.sha256 is compared byte for byte too (another bundle served since the fleet's last run).
# Files the mirror serves beyond the manifest are not seen: HTTP lists nothing, and no host takes a file the signed
# manifest does not vouch for (bundle.yml -e vllm_bundle_verify=true on the mirror host names those).
#
# Standard library only: it runs with the host's python3.
from __future__ import annotations

import argparse
import hashlib
import http.server
import json
import os
import socket
import socketserver
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

CHUNK = 1024 * 1024
MAX_MANIFEST = 64 * 1024 * 1024
NAMED = 20  # files named in the journal per kind; the metrics count them all
PREFIX = "vllm_mirror_check"
WORDS = {"signed": "the signed one", "other": "not the signed one", "unreadable": "unreadable"}


def load(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    for key in ("manifest_url", "manifest_sha256", "expected", "result"):
        if not isinstance(config.get(key), str) or not config[key]:
            raise ValueError(f"{path}: {key} is not set")
    return config


def expected(path: str) -> dict[str, str]:
    """{path: SHA-256} of the signed manifest's copy ("<sha256>  <path>" lines)."""
    digests = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            digest, _, name = line.rstrip("\n").partition("  ")
            if len(digest) == 64 and name:
                digests[name] = digest
    if not digests:
        raise ValueError(f"{path} lists no file")
    return digests


def fetch(url: str, timeout: float, limit: int | None = None) -> tuple[str, int, bytes]:
    """(SHA-256, size, the body when `limit` is given) of what `url` serves, read as it streams."""
    sha, size, kept = hashlib.sha256(), 0, bytearray()
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        while chunk := answer.read(CHUNK):
            sha.update(chunk)
            size += len(chunk)
            if limit is not None:
                if size > limit:
                    raise ValueError(f"larger than {limit} bytes")
                kept += chunk
    return sha.hexdigest(), size, bytes(kept)


def reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    return " ".join(str(getattr(exc, "reason", None) or exc).split())[:200]


def check(config: dict) -> dict:
    """Every file of the signed manifest fetched from the mirror and hashed; what differs, by kind."""
    started, timeout = time.time(), float(config.get("timeout", 60))
    url = config["manifest_url"]
    base = url.rsplit("/", 1)[0]
    result: dict = {"altered": [], "missing": [], "unreadable": [], "bytes": 0, "manifest": "unreadable"}
    try:
        served, _, _ = fetch(url, timeout, MAX_MANIFEST)
        result["manifest"] = "signed" if served == config["manifest_sha256"] else "other"
        if served != config["manifest_sha256"]:
            print(
                f"{url}: SHA-256 {served}, not the manifest the site signed ({config['manifest_sha256']}): the mirror "
                "serves another bundle than the fleet's last run read; its files are checked against the signed one"
            )
    except (OSError, ValueError, urllib.error.URLError) as exc:
        print(f"{url}: could not be read ({reason(exc)})")
    digests = expected(config["expected"])
    for name, digest in sorted(digests.items()):
        location = f"{base}/{urllib.parse.quote(name)}"
        try:
            found, size, _ = fetch(location, timeout)
        except urllib.error.HTTPError as exc:
            result["missing" if exc.code == 404 else "unreadable"].append((name, reason(exc)))
            continue
        except (OSError, ValueError, urllib.error.URLError) as exc:
            result["unreadable"].append((name, reason(exc)))
            continue
        result["bytes"] += size
        if found != digest:
            result["altered"].append((name, f"SHA-256 {found}, the signed manifest gives {digest}"))
    result.update(listed=len(digests), duration=time.time() - started, finished=time.time())
    for kind in ("altered", "missing", "unreadable"):
        for name, said in result[kind][:NAMED]:
            print(f"{kind}: {base}/{name}: {said}")
        if len(result[kind]) > NAMED:
            print(f"{kind}: {len(result[kind]) - NAMED} more")
    return result


def exposition(result: dict, bundle: str, stale_after: int) -> str:
    """The result in Prometheus' text format."""
    ok = result["manifest"] == "signed" and not any(result[k] for k in ("altered", "missing", "unreadable"))
    lines = [
        f"# HELP {PREFIX}_ok 1 when every file of the signed manifest is served as signed, and the manifest with it.",
        f"# TYPE {PREFIX}_ok gauge",
        f"{PREFIX}_ok {int(ok)}",
        f"# HELP {PREFIX}_files Files of the signed manifest by what the last check found.",
        f"# TYPE {PREFIX}_files gauge",
    ]
    counts = {"listed": result["listed"], **{k: len(result[k]) for k in ("altered", "missing", "unreadable")}}
    lines += [f'{PREFIX}_files{{state="{state}"}} {count}' for state, count in counts.items()]
    lines += [
        f"# HELP {PREFIX}_manifest_signed 1 when the mirror's BUNDLE.sha256 is the manifest the site signed.",
        f"# TYPE {PREFIX}_manifest_signed gauge",
        f"{PREFIX}_manifest_signed {int(result['manifest'] == 'signed')}",
        f"# HELP {PREFIX}_bytes Bytes read from the mirror by the last check.",
        f"# TYPE {PREFIX}_bytes gauge",
        f"{PREFIX}_bytes {result['bytes']}",
        f"# HELP {PREFIX}_duration_seconds How long the last check took.",
        f"# TYPE {PREFIX}_duration_seconds gauge",
        f"{PREFIX}_duration_seconds {result['duration']:.3f}",
        f"# HELP {PREFIX}_last_run_timestamp_seconds When the last check ended.",
        f"# TYPE {PREFIX}_last_run_timestamp_seconds gauge",
        f"{PREFIX}_last_run_timestamp_seconds {result['finished']:.3f}",
        f"# HELP {PREFIX}_stale_after_seconds How old the last result may grow before it is late (its interval).",
        f"# TYPE {PREFIX}_stale_after_seconds gauge",
        f"{PREFIX}_stale_after_seconds {stale_after}",
        f"# HELP {PREFIX}_info The signed bundle the mirror is checked against (its trusted comment).",
        f"# TYPE {PREFIX}_info gauge",
        f'{PREFIX}_info{{bundle="{escape(bundle)}"}} 1',
    ]
    return "\n".join(lines) + "\n"


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def write(path: str, text: str) -> None:
    """Replaced whole (a reader never sees half of it)."""
    temporary = f"{path}.{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, path)


def run_check(config: dict) -> int:
    result = check(config)
    write(config["result"], exposition(result, str(config.get("bundle", "")), int(config.get("stale_after", 93600))))
    differs = sum(len(result[k]) for k in ("altered", "missing", "unreadable"))
    print(
        f"checked {result['listed']} files ({result['bytes']} bytes) in {result['duration']:.1f} s: "
        f"{len(result['altered'])} altered, {len(result['missing'])} missing, {len(result['unreadable'])} unreadable;"
        f" the mirror's BUNDLE.sha256 is {WORDS[result['manifest']]}"
    )
    return 0 if differs == 0 and result["manifest"] == "signed" else 1


def serve(config: dict) -> int:
    """Answer GET /metrics with the last check's result, on the socket systemd hands over (Accept=no)."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()) or os.environ.get("LISTEN_FDS") != "1":
        print("serve: expects one listening socket from systemd (vllm-mirror-check-metrics.socket)", file=sys.stderr)
        return 2
    result = config["result"]

    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = 5

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404)
                return
            try:
                with open(result, "rb") as handle:
                    body = handle.read()
            except FileNotFoundError:
                body = b""  # no check has run yet: the metrics are absent, and VllmMirrorCheckStale says so
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per scrape would fill the journal

    class Server(http.server.ThreadingHTTPServer):
        """Serves on the socket systemd listens on: it makes no socket of its own (the unit allows none but AF_UNIX,
        and TCPServer's constructor would make one)."""

        def __init__(self, listener: socket.socket) -> None:
            socketserver.BaseServer.__init__(self, listener.getsockname()[:2], Handler)
            self.socket = listener
            self.server_name, self.server_port = "localhost", listener.getsockname()[1]

    Server(socket.socket(fileno=3)).serve_forever()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=("check", "serve"))
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    try:
        config = load(args.config)
    except (OSError, ValueError) as exc:
        print(f"vllm-mirror-check: {exc}", file=sys.stderr)
        return 2
    try:
        return run_check(config) if args.mode == "check" else serve(config)
    except (OSError, ValueError) as exc:  # the manifest's copy or the result's folder
        print(f"vllm-mirror-check: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
