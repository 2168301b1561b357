"""A bounded multi-turn workload with shared prefixes, and what vLLM's prefix cache made of it.

Several applications, each with its own long system prompt; several conversations of each, of several turns: a turn
sends the conversation so far (the system prompt, every earlier question and answer) and a new question, so that a
turn's prompt starts with the whole of the turn before it. ``users`` clients each take the next conversation and play
its turns in order, as one person does. The prefix cache's hit rate is read from the instances' own counters
(``vllm:prefix_cache_hits_total`` over ``vllm:prefix_cache_queries_total``, both in prompt tokens), before and after,
with the Prometheus parser (:func:`vllm_fleet.metrics.parse`): it is the share of prompt tokens some instance had
computed before, which routing decides when there are several.

Bounded: at most ``applications * conversations * turns`` requests, and ``max_seconds``. The text is made from a seed
(no data set, no model download): a run's seed keeps its prompts apart from an earlier run's, whose cached blocks
would count as hits.
"""

from __future__ import annotations

import random
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from labtools import streamload
from vllm_fleet import metrics

# The words the prompts are made of (text from a seed, no data set).
WORDS = (  # noqa: SIM905 (one word list, read as text)
    "account answer archive batch budget cache capacity card cluster config context cost data deploy disk drain "
    "driver engine error fleet gateway health host index instance key latency limit load log memory metric "
    "mirror model network node offline order plan policy port profile prompt queue quota rate release report "
    "request restart rollout route schedule server service shard site stream system tenant token traffic unit "
    "update version volume window worker"
).split()
# The bounds of one run: enough for a benchmark, never a flood.
LIMITS = {"applications": (1, 16), "conversations": (1, 64), "turns": (1, 16), "users": (1, 32)}


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def workload(
    applications: int, conversations: int, turns: int, seed: int, system_words: int = 300, question_words: int = 12
) -> list[dict[str, Any]]:
    """The conversations to play: each with its application's system prompt and its own questions, one a turn."""
    for name, value in (("applications", applications), ("conversations", conversations), ("turns", turns)):
        low, high = LIMITS[name]
        if not low <= value <= high:
            raise ValueError(f"{name}={value} must be from {low} to {high}")
    rng = random.Random(seed)
    systems = [
        f"You are assistant {seed}-{a} of the operations team. " + _text(rng, system_words) for a in range(applications)
    ]
    return [
        {
            "application": a,
            "system": systems[a],
            "questions": [f"Question {t + 1}: " + _text(rng, question_words) for t in range(turns)],
        }
        for a in range(applications)
        for _ in range(conversations)
    ]


def play(
    send: Callable[[list[dict[str, str]]], dict[str, Any]],
    conversations: list[dict[str, Any]],
    users: int,
    max_seconds: float,
) -> list[dict[str, Any]]:
    """Play the conversations with `users` clients (`send`: one streamed completion of the messages, with its
    answer's text); each request's outcome, TTFT, conversation and turn. A conversation whose turn failed stops."""
    low, high = LIMITS["users"]
    if not low <= users <= high or not 0 < max_seconds <= 7200:
        raise ValueError(f"users must be from {low} to {high} and max_seconds up to 7200")
    began = time.monotonic()
    lock = threading.Lock()
    queue = list(enumerate(conversations))
    results: list[dict[str, Any]] = []

    def user() -> None:
        while time.monotonic() - began < max_seconds:
            with lock:
                if not queue:
                    return
                index, conversation = queue.pop(0)
            messages = [{"role": "system", "content": conversation["system"]}]
            for turn, question in enumerate(conversation["questions"]):
                if time.monotonic() - began >= max_seconds:
                    return
                messages.append({"role": "user", "content": question})
                start = time.monotonic() - began
                result = send(list(messages))
                answer = result.pop("text", "") or ""
                result.update(conversation=index, turn=turn, start=round(start, 3))
                with lock:
                    results.append(result)
                if result["outcome"] != "ok":
                    break
                messages.append({"role": "assistant", "content": answer})

    threads = [threading.Thread(target=user, daemon=True) for _ in range(users)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max_seconds + 300)
    return results


def prefix_counters(texts: Mapping[str, str]) -> dict[str, tuple[float, float]]:
    """{instance: (prefix cache hits, queries)} from each instance's /metrics text, in prompt tokens."""
    out = {}
    for name, text in texts.items():
        counters = metrics.parse(text).counters
        out[name] = (counters.get("vllm:prefix_cache_hits", 0.0), counters.get("vllm:prefix_cache_queries", 0.0))
    return out


def hit_rate(before: Mapping[str, tuple[float, float]], after: Mapping[str, tuple[float, float]]) -> dict[str, Any]:
    """The window's prefix cache hit rate over every instance, and each instance's share of the queried tokens."""
    hits = {name: after[name][0] - before.get(name, (0.0, 0.0))[0] for name in after}
    queries = {name: after[name][1] - before.get(name, (0.0, 0.0))[1] for name in after}
    total = sum(queries.values())
    return {
        "hit_rate": round(sum(hits.values()) / total, 4) if total > 0 else None,
        "queried_tokens": int(total),
        "share": {name: round(queries[name] / total, 3) if total > 0 else None for name in sorted(queries)},
    }


def summarise(results: list[dict[str, Any]], wall: float, users: int) -> dict[str, Any]:
    """The stream loop's summary (:func:`labtools.streamload.summarise`: requests, failed, cut, TTFT p50 and p99),
    with the TTFT of the later turns (after the first) beside it."""
    summary = streamload.summarise(results, wall, users)
    later = streamload.summarise([r for r in results if r["turn"] > 0], wall, users)
    summary.pop("log")
    summary["ttft_ms_later_turns"] = later["ttft_ms"]
    return summary


def scrape(urls: Mapping[str, str], timeout: float = 10.0) -> dict[str, str]:
    """Each instance's /metrics text ({name: url}); only the caller's own hosts."""
    texts = {}
    for name, url in urls.items():
        with urllib.request.urlopen(url, timeout=timeout) as response:
            texts[name] = response.read().decode()
    return texts
