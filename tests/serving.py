"""A handler served in a daemon thread for the length of a `with`: the unit tests' stand-in servers (on loopback,
a free port) and the fleet scenario's alert receiver (on the lab network's address of this machine); and the
unit tests' stand-in vLLM (the role's verification and the health-wait module run against it)."""

from __future__ import annotations

import http.server
import json
import re
import threading
import time


class LocalServer:
    """Serves `handler` on `address` (default: 127.0.0.1, a free port) in a daemon thread, for a `with`."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler], address: tuple[str, int] = ("127.0.0.1", 0)):
        self.server = http.server.ThreadingHTTPServer(address, handler)
        self.port = self.server.server_address[1]
        self.url = f"http://{address[0]}:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


class StandInVllm(LocalServer):
    """vLLM's API as a test needs it: /health (503 for `healthy_after` seconds from the first probe, then 200),
    /version, /v1/models and /v1/chat/completions (the bodies given, a test's recorded answers; the chat refuses
    any model but `served`), /metrics (the texts given, one per scrape, the last repeated) and an API key."""

    def __init__(
        self, *, version="0.32.0", metrics=("",), models="{}", chat="{}", served="tiny", api_key=None, healthy_after=0.0
    ):
        self.version = version
        self.metrics = list(metrics)
        self.models, self.chat, self.served = models, chat, served
        self.api_key = api_key
        # The "process" starts at the first /health probe, so the role sees it loading for healthy_after s
        # however long ansible-playbook takes to get there.
        self.healthy_after = healthy_after
        self.healthy_at = None
        self.started = None
        self.scrapes = 0
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def _send(self, status, body="", ctype="application/json"):
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self):
                if fake.api_key and self.headers.get("Authorization") != "Bearer " + fake.api_key:
                    self._send(401, json.dumps({"error": "Unauthorized"}))
                    return False
                return True

            def do_GET(self):
                if self.path == "/health":
                    if fake.healthy_at is None:
                        fake.healthy_at = time.monotonic() + fake.healthy_after
                        fake.started = time.time()
                    self._send(200 if time.monotonic() >= fake.healthy_at else 503)
                elif self.path == "/version":
                    self._send(200, json.dumps({"version": fake.version}))
                elif self.path == "/v1/models":
                    if self._authorized():
                        self._send(200, fake.models)
                elif self.path == "/metrics":
                    text = fake.metrics[min(fake.scrapes, len(fake.metrics) - 1)]
                    # The recorded process start, moved to this stand-in's own start.
                    text = re.sub(
                        r"(?m)^process_start_time_seconds .*$", "process_start_time_seconds %r" % fake.started, text
                    )
                    fake.scrapes += 1
                    self._send(200, text, "text/plain; version=0.0.4; charset=utf-8")
                else:
                    self._send(404, json.dumps({"detail": "Not Found"}))

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path != "/v1/chat/completions":
                    self._send(404, json.dumps({"detail": "Not Found"}))
                elif self._authorized():
                    if body.get("model") != fake.served:
                        self._send(404, json.dumps({"error": "model %s does not exist" % body.get("model")}))
                    else:
                        self._send(200, fake.chat)

        super().__init__(Handler)
