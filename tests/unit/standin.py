"""The threaded local HTTP server behind the unit tests' stand-ins of a vLLM server."""

from __future__ import annotations

import http.server
import threading


class LocalServer:
    """Serves `handler` on 127.0.0.1 (a free port) in a daemon thread, for the length of a `with`."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]):
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
