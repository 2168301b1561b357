"""A handler served in a daemon thread for the length of a `with`: the unit tests' stand-in servers (on loopback,
a free port) and the fleet scenario's alert receiver (on the lab network's address of this machine)."""
from __future__ import annotations

import http.server
import threading


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
