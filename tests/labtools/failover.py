"""How long a shared address goes unanswered while it moves between gateways, as a client sees it.

``Watch`` asks an address's ``/health`` (HAProxy's monitor: no key) every 50 ms, each ask bounded by 0.5 s, from
the machine it runs on, and records each ask's time and whether it was answered 200; ``outage`` reads the window
after a moment (the gateway's stop) in which none was. Bounded in time; point it only at your own hosts.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from typing import Any


class Watch:
    """Asks ``https://{address}:{port}/health`` every ``interval`` s for at most ``seconds`` s, in a thread of its
    own; use as a context manager. ``answers``: [(seconds since it began, answered 200)]."""

    def __init__(
        self,
        address: str,
        context: ssl.SSLContext,
        port: int = 443,
        seconds: float = 120,
        interval: float = 0.05,
        timeout: float = 0.5,
    ) -> None:
        if not (0 < seconds <= 3600 and 0.01 <= interval <= 10 and 0 < timeout <= 10):
            raise ValueError("bounds: seconds up to 3600, interval 0.01-10, timeout up to 10")
        self.address, self.context, self.port = address, context, port
        self.seconds, self.interval, self.timeout = seconds, interval, timeout
        self.answers: list[tuple[float, bool]] = []
        self.began = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _ask(self) -> bool:
        conn = http.client.HTTPSConnection(self.address, self.port, timeout=self.timeout, context=self.context)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            conn.close()

    def _run(self) -> None:
        while not self._stop.is_set() and self.now() < self.seconds:
            at = self.now()
            self.answers.append((round(at, 3), self._ask()))
            self._stop.wait(self.interval)

    def now(self) -> float:
        return time.monotonic() - self.began

    def __enter__(self) -> Watch:
        self.began = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.timeout + 5)

    def answering(self, for_seconds: float = 1.0) -> bool:
        """Whether every ask of the last `for_seconds` s was answered (and there was one)."""
        recent = [ok for at, ok in self.answers if at > self.now() - for_seconds]
        return bool(recent) and all(recent)

    def wait_answering(self, since: float, settle: float = 3.0, bound: float = 60.0) -> None:
        """Wait until `settle` s have passed since `since` and the address has answered for the last second, at
        most `bound` s."""
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            if self.now() > since + settle and self.answering():
                return
            time.sleep(0.1)


def outage(answers: list[tuple[float, bool]], since: float) -> dict[str, Any]:
    """The window after `since` with no answer: ``{"first_failed", "back", "seconds"}`` (seconds on the watch's
    clock); all None when every ask after `since` was answered, ``back`` and ``seconds`` None when none was again."""
    after = [(at, ok) for at, ok in answers if at >= since]
    first_failed = next((at for at, ok in after if not ok), None)
    back = None if first_failed is None else next((at for at, ok in after if ok and at > first_failed), None)
    return {
        "first_failed": first_failed,
        "back": back,
        "seconds": None if first_failed is None or back is None else round(back - first_failed, 3),
    }
