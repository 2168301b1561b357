"""labtools.streamload, the lab's loop of streamed chat completions, against a local stand-in of vLLM's streaming
chat endpoint: finished, cut and failed streams, its bounds, its users' pauses and models, its connection retries."""

import http.server
import itertools
import json
import socket
import threading
import time
import typing

import pytest

from conftest import LocalServer
from labtools import streamload


class Streaming(http.server.BaseHTTPRequestHandler):
    """Streams chat chunks like vLLM; a prompt of 'cut' ends the stream early, 'refuse' (or the model 'unknown')
    answers 401. ``models``: the model of every request received."""

    protocol_version = "HTTP/1.1"
    models: typing.ClassVar[list[str]] = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][0]["content"]
        Streaming.models.append(body["model"])
        if prompt == "refuse" or self.headers.get("Authorization") != "Bearer k" or body["model"] == "unknown":
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for i in range(3):
            chunk = {"choices": [{"index": 0, "delta": {"content": str(i)}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            if prompt == "cut":
                return
        end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        self.wfile.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())


@pytest.mark.parametrize("prompt, key, outcome", [("go", "k", "ok"), ("cut", "k", "cut"), ("go", "bad", "failed")])
def test_streamload_tells_finished_cut_and_failed_streams(prompt, key, outcome):
    with LocalServer(Streaming) as server:
        stream = streamload.Stream(server.url, key, "m", 3, None, timeout=10)
        result = stream.send(prompt)
    assert result["outcome"] == outcome, result
    if outcome != "failed":
        assert result["ttft"] is not None and result["tokens"] >= 1


def test_streamload_is_bounded_and_counts():
    with LocalServer(Streaming) as server:
        stream = streamload.Stream(server.url, "k", "m", 3, None, timeout=10)
        result = streamload.run(stream, concurrency=2, max_seconds=30, max_requests=7, stop_file=None)
    assert (result["requests"], result["ok"], result["failed"], result["cut"]) == (7, 7, 0, 0)
    assert result["ttft_ms"]["p50"] is not None
    with pytest.raises(ValueError):
        streamload.run(stream, concurrency=0, max_seconds=30, max_requests=7, stop_file=None)


def test_streamload_users_pause_between_answers():
    with LocalServer(Streaming) as server:
        stream = streamload.Stream(server.url, "k", "m", 3, None, timeout=10)
        result = streamload.run(
            stream, concurrency=1, max_seconds=30, max_requests=3, stop_file=None, think_seconds=0.2
        )
    starts = [r["start"] for r in result["log"]]
    assert result["ok"] == 3 and all(b - a >= 0.2 for a, b in itertools.pairwise(starts)), starts


def test_streamload_users_take_the_models_in_turn_and_each_models_outcomes_are_counted():
    """Two models, four users: users 0 and 2 stream the first, 1 and 3 the second; the summary counts each model's
    outcomes (here the second model's requests are refused). Bounded by time, not by a count that the first users
    could use up before the others start (CI's unit phase once saw all 12 of a count go to the first model)."""
    Streaming.models.clear()
    with LocalServer(Streaming) as server:
        streams = [streamload.Stream(server.url, "k", model, 3, None, timeout=10) for model in ("m", "unknown")]
        result = streamload.run(
            streams, concurrency=4, max_seconds=2, max_requests=2000, stop_file=None, think_seconds=0.05
        )
    assert sorted(set(Streaming.models)) == ["m", "unknown"], Streaming.models
    assert len(Streaming.models) == result["requests"], (len(Streaming.models), result["requests"])
    assert result["models"]["m"]["ok"] == Streaming.models.count("m") > 0, result["models"]
    assert result["models"]["unknown"] == {"ok": 0, "failed": Streaming.models.count("unknown"), "cut": 0}
    assert {r["model"] for r in result["log"]} == {"m", "unknown"}
    with pytest.raises(ValueError, match="no stream"):
        streamload.run([], concurrency=1, max_seconds=30, max_requests=1, stop_file=None)


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_streamload_retries_a_request_that_could_not_connect_and_nothing_else():
    """A client retrying its connection (as while a shared address moves between gateways) is served once the
    server answers, the retries counted; without retries the same request fails at once, refused."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    refused = streamload.Stream(url, "k", "m", 3, None, timeout=10).send("go")
    assert refused["outcome"] == "failed" and "ConnectionRefusedError" in refused["error"], refused
    stream = streamload.Stream(url, "k", "m", 3, None, timeout=10, connect_retries=12, connect_timeout=1)
    results = []
    sender = threading.Thread(target=lambda: results.append(stream.send("go")))
    sender.start()
    time.sleep(0.6)  # two or three refused tries, a quarter second apart
    with LocalServer(Streaming, ("127.0.0.1", port)):
        sender.join(10)
    (result,) = results
    assert result["outcome"] == "ok" and result["connect_retries"] >= 2, result
    # A stream cut after it began is never sent again: the answer was under way.
    with LocalServer(Streaming) as server:
        cut = streamload.Stream(server.url, "k", "m", 3, None, timeout=10, connect_retries=12).send("cut")
    assert cut["outcome"] == "cut" and "connect_retries" not in cut, cut
    with pytest.raises(ValueError):
        streamload.Stream(url, "k", "m", 3, None, timeout=10, connect_retries=21)
