#!/usr/bin/env python3
"""Issue 52 on a CUDA host: how far an fp8 KV cache moves the RTX 4090 7B profile's answers from a bf16 cache, without
and with --calculate-kv-scales, measured with the answers gate's own code (src/vllm_fleet/answers.py).

    answers_drift.py plan [--profile NAME] [--host-gpu NAME,MIB,GB_S ...] [--out gpu/bench/answers-drift.json]
        on the controller: the three servers' `vllm serve` arguments, rendered for vLLM 0.26.0 by the project's renderer
        for the emulated card (plan.py's experiment(): the card's budget as gpu_memory_utilization of the host card,
        Ada's kernels), one set per host card given (default: the H100 and the H200 the harness has run on), and the
        product's golden set (roles/vllm_rollout/defaults/main.yml)
    answers_drift.py run [--plan FILE] [--out DIR] [--budget-s S] [--python PY]
        on the CUDA host (`run.sh answers-drift`): install the offline bundle if needed (harness.py's install), start
        the three servers side by side on the one card, measure, stop them; results into $OUT
    answers_drift.py cpu-smoke --url URL [--url-b URL] [--url-c URL] --model NAME [--tokens N]
        the same measurements against servers already running on 127.0.0.1 (a CPU vLLM): the flow and the response
        shapes, not the numbers (with one URL, A, B and C are the same server)

The servers, differing only in the KV cache (the plan checks it with answers.change_kind):

    A  --kv-cache-dtype auto (bf16, the model's dtype), no --calculate-kv-scales    the reference
    B  --kv-cache-dtype fp8, scales at their default 1.0
    C  --kv-cache-dtype fp8 --calculate-kv-scales                                    the profile as shipped

The profile is rtx4090-7b-decode: the shipped 4090 profile of the 7B that runs an fp8 KV cache, with
--calculate-kv-scales (rtx4090-7b-prefill ships a bf16 cache; rtx4090-7b-awq has 4-bit weights in float16, another
question). Its speculative decoding is dropped (no draft: the draft's proposals would also pass through each cache,
and only the KV cache may differ); without it the profile renders as rtx4090-7b-prefill does, plus `--dtype bfloat16`
(the model's own dtype), so what C measures is also the prefill profile with its cache set to fp8.

The measurements (vllm_fleet.answers.measure, the product's golden set, 32 tokens, top-5 logprobs): A's greedy answers
are recorded; A scores its own record (the noise floor: the same server, prefill against the decode that made the
record); B and C score A's record. answers.compare, change_kind and judge (default limits) make each one's top-1
agreement, mean and max KL, the answers' common prefixes and the verdict.

The weights are random (vLLM's --load-format dummy: every weight, norm and bias uniform in +-1e-3 from one seed, so the
three servers hold the same weights): this measures the numerical drift the KV cache's precision causes, not task
accuracy. See CAVEAT for why it overstates the drift of an fp8 cache without scales. The dummy tokenizer (harness.py)
knows no English word, so each golden prompt is sent respelt word by word into its vocabulary (`respell`); otherwise
every word would be <unk> and prompts of as many words the same prompt.

Starts: vLLM profiles memory on the assumption that no other process changes its use of the card meanwhile, so the
servers start staggered: the next one once the one before has sized and allocated its KV cache (its CUDA graph
capture has begun), not once it is healthy; the slow part of a start on Hopper (the driver's JIT of FlashAttention 2's
sm_80 code, about 170 s on a fresh H100 for the bf16 server) then overlaps the other starts. Every wait and request is
bounded, and `--budget-s` bounds the whole run: it measures what started in time and always stops the servers.

Stdlib only on the host (the harness's and the answers gate's modules); `plan` also needs the project's renderer.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "src"))
import harness  # noqa: E402  (gpu/bench/harness.py, stdlib)
from vllm_fleet import answers  # noqa: E402  (stdlib)

PLAN = HERE / "answers-drift.json"
DATE = "2026-12-07"
ISSUE = 52
PROFILE = "rtx4090-7b-decode"
CARD = "RTX 4090"
GOLDEN = REPO / "roles" / "vllm_rollout" / "defaults" / "main.yml"
# The three servers: name, KV cache (a table column), what each is, its keys over the profile (and SPECULATIVE_OFF).
VARIANTS = (
    {
        "name": "A",
        "kv": "auto (bf16)",
        "what": "bf16 KV cache (kv_cache_dtype auto), the reference",
        "keys": {"kv_cache_dtype": "auto", "calculate_kv_scales": None},
    },
    {
        "name": "B",
        "kv": "fp8, scales 1.0",
        "what": "fp8 KV cache, scales at their default 1.0",
        "keys": {"kv_cache_dtype": "fp8", "calculate_kv_scales": None},
    },
    {
        "name": "C",
        "kv": "fp8, calculated scales",
        "what": "fp8 KV cache with --calculate-kv-scales (the profile as shipped, without its draft)",
        "keys": {"kv_cache_dtype": "fp8", "calculate_kv_scales": True},
    },
)
SPECULATIVE_OFF = {"speculative": None}
# What each variant's arguments may differ in from A's (answers.change_kind's changed_args); the plan refuses more.
EXPECTED_CHANGES = {"A": [], "B": ["--kv-cache-dtype"], "C": ["--calculate-kv-scales", "--kv-cache-dtype"]}
HOSTS = (
    {"name": "H100", "memory_mib": 81559, "bandwidth_gb_s": 3350, "count": 1},
    {"name": "H200", "memory_mib": 143771, "bandwidth_gb_s": 4800, "count": 1},
)
# Outside each server's vLLM budget: its CUDA context and what it allocates before vLLM's first memory snapshot
# (plan.py: about 0.5 GiB each); the side-by-side check counts this much per server.
CONTEXT_MIB = 768
# Past memory profiling: the KV cache is sized and allocated (graph capture, or the end of the engine's start).
PROFILED = re.compile(r"Capturing CUDA graphs|Graph capturing finished|init engine .* took")
SCALE_LINES = re.compile(r"calculate.kv.scales|[Ss]caling factor|q_scale|kv_cache_dtype=|fp8")
MEASURE_RESERVE_S = 90  # kept from the budget for the measures and the stops once the servers are up
LOG_TAIL_LINES = 200
FILE_CAP_BYTES = 15 << 20  # files back from the device: 16 MiB each at most
CAVEAT = (
    "Random weights (vLLM's --load-format dummy, the same in A, B and C): this measures the numerical drift the KV "
    "cache's precision causes, not task accuracy. It is likely to overstate the drift of an fp8 cache without scales "
    "(B): such weights (uniform in +-1e-3, norms and biases too) give keys and values of the order of 1e-3, below the "
    "smallest fp8 e4m3 subnormal (2^-9, about 0.002) at the default scale 1.0, so B's cache rounds most of them to "
    "zero, where --calculate-kv-scales (C) scales them from the first forward pass; a trained model's keys and values "
    "mostly fit e4m3 at scale 1.0. And the dummy model's next-token distribution is nearly flat (`flatness`: the "
    "spread of A's top-k logprobs), so the KL over the top-k is small whatever the cache does and top-1 agreement "
    "turns on near-ties."
)


# --- the plan (controller) ------------------------------------------------------------------------------------------


def respell(prompt: str, vocab_size: int) -> str:
    """A prompt in the dummy tokenizer's words (harness.tokenizer_files: t<N> for every id past the specials): each word
    becomes one token, the same word always the same token (the first 8 bytes of its SHA-256, modulo the ids)."""
    first = len(harness.TOKENIZER_SPECIALS)
    if vocab_size <= first:
        raise ValueError(f"vocab_size={vocab_size} leaves no ordinary token")
    ids = [
        first + int.from_bytes(hashlib.sha256(w.encode()).digest()[:8], "big") % (vocab_size - first)
        for w in prompt.split()
    ]
    return " ".join(f"t{i}" for i in ids)


def golden_set(path: Path = GOLDEN) -> dict:
    """The product's golden set and its tokens and top-k, as the rollout role's defaults give them."""
    import yaml  # the controller's (plan only)

    defaults = yaml.safe_load(path.read_text(encoding="utf-8"))
    prompts = defaults["vllm_rollout_answers_prompts"]
    errors = answers.check_prompts(prompts, "vllm_rollout_answers_prompts")
    if errors:
        raise ValueError("; ".join(errors))
    return {
        "source": str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path),
        "setting": "vllm_rollout_answers_prompts",
        "prompts": [{"name": p["name"], "prompt": p["prompt"]} for p in prompts],
        "tokens": int(defaults["vllm_rollout_answers_tokens"]),
        "top_k": int(defaults["vllm_rollout_answers_top_k"]),
    }


def build_plan(profile: str = PROFILE, hosts: tuple[dict, ...] = HOSTS, golden: dict | None = None) -> dict:
    """The three servers for each host card (plan.py's experiment() and plan file, so the harness's own functions read
    it), checked: no planner error, the servers side by side within plan.py's share of the card, and B and C differing
    from A only in the KV cache's arguments."""
    import plan as plan_py  # gpu/bench/plan.py: the project's renderer and planner (controller only)

    golden = golden or golden_set()
    per_host = []
    for host in hosts:
        experiments = []
        for variant in VARIANTS:
            name = variant["name"]
            exp = plan_py.experiment(
                f"drift-{name}",
                CARD,
                profile,
                dict(variant["keys"], **SPECULATIVE_OFF),
                est_s=300,
                note=variant["what"],
                host=host,
            )
            if "left_out" in exp:
                raise ValueError(exp["left_out"])
            if exp["planner"]["errors"]:
                raise ValueError(f"{exp['name']} on the {host['name']}: {' | '.join(exp['planner']['errors'])}")
            if exp["draft"]:
                raise ValueError(f"{exp['name']}: a draft model is left ({exp['draft']}); the experiment runs none")
            experiments.append(dict(exp, variant=name, interleave="answers-drift"))
        share = sum(e["emulated_utilization"] for e in experiments)
        if share > plan_py.TUNE_SIDE_BY_SIDE_SHARE:
            raise ValueError(
                f"the three servers side by side would take {share:.3f} of the {host['name']}'s memory "
                f"(at most {plan_py.TUNE_SIDE_BY_SIDE_SHARE}); nothing planned for it"
            )
        reference = experiments[0]["args"]
        for exp in experiments:
            changed = answers.change_kind({"args": reference}, {"args": exp["args"]})["changed_args"]
            if changed != EXPECTED_CHANGES[exp["variant"]]:
                raise ValueError(f"{exp['name']} differs from A in {changed}, not only in the KV cache's arguments")
        per_host.append(dict(plan_py._wrap(experiments, host, DATE), side_by_side_share=round(share, 6)))
    vocab = per_host[0]["tokenizer_vocab_size"]
    return {
        "what": "answers-drift",
        "issue": ISSUE,
        "date": DATE,
        "vllm_version": plan_py.VLLM_VERSION,
        "profile": profile,
        "card": CARD,
        "variants": [dict(v, keys=dict(v["keys"], **SPECULATIVE_OFF)) for v in VARIANTS],
        "golden": dict(
            golden,
            vocab_size=vocab,
            prompts=[dict(p, sent=respell(p["prompt"], vocab)) for p in golden["prompts"]],
        ),
        "caveat": CAVEAT,
        "hosts": per_host,
    }


# --- pure parts of the run ------------------------------------------------------------------------------------------


def smi_card(nvidia_smi: str) -> tuple[str, int] | None:
    """(name, memory MiB) from nvidia-smi's first line `name, N MiB, ...`, None when unreadable."""
    fields = [f.strip() for f in nvidia_smi.splitlines()[0].split(",")] if nvidia_smi.strip() else []
    try:
        return fields[0], int(fields[1].split()[0])
    except (IndexError, ValueError):
        return None


def host_plan(doc: dict, nvidia_smi: str) -> tuple[dict | None, str | None]:
    """The plan of the host card this is (harness.card_mismatch: within 1 % of its memory), or why none fits."""
    why = None
    for plan in doc["hosts"]:
        why = harness.card_mismatch(plan, nvidia_smi)
        if why is None:
            return plan, None
    planned = ", ".join(f"{p['host_gpu']['name']} ({p['host_gpu']['memory_mib']} MiB)" for p in doc["hosts"])
    return None, f"no plan for this card (planned: {planned}). {why or ''}".strip()


def budget_refusal(plan: dict, total_mib: int, used_mib: int) -> str | None:
    """Why the servers do not fit side by side on the card now, or None: each takes ceil(utilization x the card) as
    vLLM's budget, plus CONTEXT_MIB outside it, out of what is free now."""
    exps = plan["experiments"]
    each = [math.ceil(e["emulated_utilization"] * total_mib) for e in exps]
    needed = sum(each) + CONTEXT_MIB * len(exps)
    free = total_mib - used_mib
    if needed <= free:
        return None
    return (
        f"the {len(exps)} servers side by side need {needed:,} MiB ({' + '.join(f'{m:,}' for m in each)} MiB of "
        f"budget, each the {plan['cards'][CARD]['memory_mib']:,} MiB of the emulated {CARD}, plus {len(exps)} x "
        f"{CONTEXT_MIB} MiB outside vLLM's budget) but the card has {free:,} of {total_mib:,} MiB free "
        f"({used_mib:,} MiB in use); nothing started. Fix: free the card (nvidia-smi lists what holds it), or run on a "
        f"card with room for them"
    )


def past_profiling(log_text: str) -> bool:
    """Whether a starting server has sized and allocated its KV cache (the next may start without disturbing its
    memory profile)."""
    return bool(PROFILED.search(log_text))


def flatness(record: dict) -> dict:
    """How flat the recorded model's next-token distributions are: per position the gap between the top-1 and the
    last top-k logprob, and the share of positions whose top-1 and top-2 are tied (answers.TIE)."""
    gaps, ties, positions = [], 0, 0
    for entry in record.get("answers") or []:
        for top in entry.get("top") or []:
            if len(top) < 2:
                continue
            positions += 1
            gaps.append(float(top[0][1]) - float(top[-1][1]))
            ties += float(top[0][1]) - float(top[1][1]) <= answers.TIE
    return {
        "positions": positions,
        "top1_logprob_median": _median(
            [float(t[0][1]) for e in record.get("answers") or [] for t in e.get("top") or [] if t]
        ),
        "topk_gap_median": _median(gaps),
        "topk_gap_max": max(gaps) if gaps else None,
        "top1_tied_share": round(ties / positions, 4) if positions else None,
    }


def _median(values: list[float]) -> float | None:
    vals = sorted(values)
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def drift(record: dict, measured: dict, reference_args: list, args: list, release: str, seconds: float) -> dict:
    """One server's scores of A's record: answers.compare, change_kind and judge (default limits), with the figures the
    table shows."""
    comparison = answers.compare(record, measured["scores"] or [])
    kind = answers.change_kind({"release": release, "args": reference_args}, {"release": release, "args": args})
    verdict = answers.judge(comparison, kind)
    present = [p for p in comparison["prompts"] if not p.get("missing")]
    return {
        "agreement": comparison["agreement"],
        "mean_kl": comparison["mean_kl"],
        "max_kl": max((p["max_kl"] for p in present), default=None),
        "tokens": comparison["tokens"],
        "same_prefix": {p["name"]: p["same_prefix"] for p in present},
        "first_disagreement": {p["name"]: p["first_disagreement"] for p in present},
        "verdict": verdict["verdict"],
        "kind": verdict["kind"],
        "kind_reasons": verdict["kind_reasons"],
        "limits": verdict["limits"],
        "reasons": verdict["reasons"],
        "diverged": verdict["diverged"],
        "measure_s": round(seconds, 2),
        "comparison": comparison,
    }


def table(summary: dict) -> str:
    """The human table: one row per server scored against A's record."""
    names = [p["name"] for p in summary.get("prompts") or []]
    tokens = summary.get("tokens")
    lines = [
        f"answers drift, issue {ISSUE}: {summary.get('profile')} on the emulated {CARD} "
        f"({summary.get('host_gpu') or 'servers given'}), vLLM {summary.get('vllm_installed') or '?'}",
        f"NUMERICAL DRIFT ON RANDOM WEIGHTS, NOT TASK ACCURACY. {summary.get('caveat', '')}",
        "",
        f"{'server':8} {'kv cache':22} {'agreement':>9} {'mean KL':>10} {'max KL':>10} "
        f"{'verdict':>17} {'s/measure':>9}  same prefix of {tokens} tokens ({', '.join(names)})",
    ]
    for row in summary.get("rows") or []:
        d = row.get("drift")
        if not d:
            lines.append(
                f"{row['measure']:8} {row['kv']:22} {'-':>9} {'-':>10} {'-':>10} {'-':>17} {'-':>9}  "
                f"{row.get('error') or 'not measured'}"
            )
            continue
        verdict = f"{d['verdict']} ({d['kind']})"
        prefix = " ".join(str(d["same_prefix"].get(n, "-")) for n in names)
        lines.append(
            f"{row['measure']:8} {row['kv']:22} {_fmt(d['agreement'], 4):>9} {_fmt(d['mean_kl'], 6):>10} "
            f"{_fmt(d['max_kl'], 6):>10} {verdict:>17} {d['measure_s']:>9.1f}  {prefix}"
        )
    flat = summary.get("flatness") or {}
    if flat:
        lines += [
            "",
            f"flatness of A's record: median top-1 logprob {_fmt(flat.get('top1_logprob_median'), 4)}, median gap "
            f"top-1 to top-k {_fmt(flat.get('topk_gap_median'), 6)}, top-1 tied with top-2 at "
            f"{_fmt(flat.get('top1_tied_share'), 4)} of {flat.get('positions')} positions",
        ]
    for row in summary.get("rows") or []:
        if row.get("same_scores_as_B"):
            lines.append(f"{row['measure']} scored A's record exactly as B did: --calculate-kv-scales changed nothing")
        if row.get("drift") and row["drift"]["reasons"]:
            lines.append(f"{row['measure']}: " + "; ".join(row["drift"]["reasons"]))
    return "\n".join(lines) + "\n"


def _fmt(value: Any, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def log_tail(text: str, lines: int = LOG_TAIL_LINES, width: int = 1000) -> list[str]:
    """A server log's last lines, as a terminal shows them (a progress bar's last state), each cut at `width`."""
    split = text.split("\n")  # not splitlines(): a progress bar's updates, \r apart, are one line
    if split and split[-1] == "":
        split.pop()
    return [line.rsplit("\r", 1)[-1][:width] for line in split[-lines:]]


def local_url(url: str) -> str:
    """The URL when it names 127.0.0.1 or localhost (this script sends nothing elsewhere), else ValueError."""
    host = re.match(r"^http://([^/:]+)(:\d+)?/?$", url)
    if not host or host.group(1) not in ("127.0.0.1", "localhost"):
        raise ValueError(f"{url!r} is not http://127.0.0.1:PORT; this script sends requests to this host only")
    return url.rstrip("/")


def write_capped(path: Path, text: str, cap: int = FILE_CAP_BYTES) -> Path:
    """Write text, cut to its last `cap` bytes (a note says so) where longer: the device returns no larger file."""
    if not re.fullmatch(r"[A-Za-z0-9._-]+", path.name):
        raise ValueError(f"{path.name!r}: files back from the device are named in letters, digits, '.', '_', '-'")
    data = text.encode("utf-8")
    if len(data) > cap:
        note = f"[cut: the first {len(data) - cap + 200:,} of {len(data):,} bytes left out]\n".encode()
        data = note + data[-(cap - 200) :]
    part = path.with_name(f".{path.name}.part")  # replaced whole: a reader (or a cut) never sees half a file
    part.write_bytes(data)
    os.replace(part, path)
    return path


# --- measuring (run and cpu-smoke) ----------------------------------------------------------------------------------


def measure_all(
    urls: dict[str, str],
    model: str,
    prompts: list[dict],
    tokens: int,
    top_k: int,
    args: dict[str, list],
    release: str,
    timeout: float,
    deadline: float,
    progress: Callable[[dict, list[dict]], None] | None = None,
) -> tuple[dict, list[dict], dict | None]:
    """A's record, then A, B and C scoring it (those of `urls` that are up), `progress` called after each. Returns (the
    raw measures, the rows, the record's flatness). Each request is bounded by `timeout` and by a share of the time
    left (a measure sends two requests a prompt), so that a server that hangs cannot take the run past `deadline`."""
    raw: dict[str, Any] = {}
    rows: list[dict] = []
    what = {v["name"]: {"kv": v["kv"], "what": v["what"]} for v in VARIANTS}

    def one(url: str, recorded: dict | None) -> tuple[dict | None, str | None, float]:
        left = deadline - time.time()
        if left < 30:
            return None, "skipped: the run's budget is spent", 0.0
        bound = min(timeout, max(10.0, (left - 20) / (2 * len(prompts))))
        t0 = time.time()
        try:
            return answers.measure(url, model, prompts, tokens, top_k, recorded, None, bound), None, time.time() - t0
        except (answers.AnswersError, OSError, ValueError, KeyError, TypeError) as exc:
            return None, f"{type(exc).__name__}: {exc}", time.time() - t0

    if "A" not in urls:
        return raw, [{"measure": n, **what[n], "error": "A (the reference) did not start"} for n in what], None
    record, error, seconds = one(urls["A"], None)
    raw["A-record"] = {"result": record, "error": error, "seconds": round(seconds, 2)}
    if progress:
        progress(raw, rows)
    harness.log(
        f"A's record: {len(record['answers'])} answers in {seconds:.1f} s" if record else f"A's record: {error}"
    )
    if record is None:
        return raw, [{"measure": n, **what[n], "error": f"no record from A: {error}"} for n in what], None
    for name, measure in (("A", "A-self"), ("B", "B"), ("C", "C")):
        row = {"measure": measure, "server": name, **what[name]}
        if name not in urls:
            row["error"] = f"{name} did not start"
            rows.append(row)
            continue
        result, error, seconds = one(urls[name], record)
        raw[measure] = {"result": _without_reference(result), "error": error, "seconds": round(seconds, 2)}
        if result is None:
            row["error"] = error
        else:
            try:
                row["drift"] = drift(record, result, args["A"], args[name], release, seconds)
            except answers.AnswersError as exc:
                row["error"] = f"AnswersError: {exc}"
        d = row.get("drift") or {}
        harness.log(f"{measure}: agreement {d.get('agreement')} mean KL {d.get('mean_kl')} {d.get('verdict', error)}")
        rows.append(row)
        if progress:
            progress(raw, rows)
    scored = {m: (raw.get(m) or {}).get("result") for m in ("B", "C")}
    if all(scored.values()):  # whether --calculate-kv-scales changed anything at all
        rows[-1]["same_scores_as_B"] = same_scores(scored["B"], scored["C"])
    return raw, rows, flatness(record)


def same_scores(one: dict, other: dict) -> bool:
    """Whether two measures scored the record alike to the last bit (every position's rank, logprob and top-k)."""
    return [s["positions"] for s in one["scores"] or []] == [s["positions"] for s in other["scores"] or []]


def _without_reference(result: dict | None) -> dict | None:
    """A measure's output without the copy of A's record it carries (kept once, as A-record)."""
    if result is None:
        return None
    return dict(result, reference="A-record" if result.get("reference") else None)


def summary_doc(doc: dict, rows: list[dict], flat: dict | None, **extra: Any) -> dict:
    golden = doc["golden"]
    return {
        "what": "answers-drift",
        "issue": ISSUE,
        "measures": "NUMERICAL DRIFT ON RANDOM WEIGHTS, NOT TASK ACCURACY",
        "caveat": CAVEAT,
        "profile": doc["profile"],
        "card": CARD,
        "vllm_version": doc.get("vllm_version"),
        "variants": doc["variants"],
        "golden_source": golden["source"],
        "tokens": golden["tokens"],
        "top_k": golden["top_k"],
        "prompts": golden["prompts"],
        "flatness": flat,
        "rows": rows,
        **extra,
    }


def write_outputs(out: Path, summary: dict, raw: dict, logs: str, show: bool = True) -> list[Path]:
    """The run's files in $OUT (rewritten as it goes: a run cut short still leaves what it had); `show` prints the
    table."""
    text = table(summary)
    if show:
        print(text, flush=True)
    return [
        write_capped(out / "answers-drift-summary.json", json.dumps(summary, indent=1) + "\n"),
        write_capped(out / "answers-drift-measures.json", json.dumps(raw) + "\n"),
        write_capped(out / "answers-drift-table.txt", text),
        write_capped(out / "answers-drift-servers.log", logs),
    ]


# --- the run on the CUDA host ---------------------------------------------------------------------------------------


class _Host(harness.Runner):
    """The harness's install, process environment and host record (harness.Runner's own methods), without a round of
    its own: this run leaves the harness's rounds on the host as they were."""

    def __init__(self, plan: dict, python: str):
        self.plan, self.python = plan, python  # no super().__init__(): it makes a round folder


def launch(exp: dict, plan: dict, paths: dict, port: int, env: dict, python: str, folder: Path) -> dict:
    """Start one server (the plan's arguments, the harness's own, the port) without waiting for it."""
    folder.mkdir(parents=True, exist_ok=True)
    args = harness.substitute(exp["args"], paths) + harness.substitute(plan["harness_args"], paths)
    args += ["--port", str(port)]
    logfile = folder / "server.log"
    with open(logfile, "w", encoding="utf-8") as logf:
        proc = subprocess.Popen(
            [python, "-m", "vllm.entrypoints.cli.main", "serve", *args],
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd=str(folder),
        )
    return {
        "variant": exp["variant"],
        "proc": proc,
        "base": f"http://127.0.0.1:{port}",
        "log": logfile,
        "t0": time.time(),
        "rec": {
            "variant": exp["variant"],
            "name": exp["name"],
            "pid": proc.pid,
            "argv": ["vllm", "serve", *args],
            "status": "starting",
        },
    }


def wait_for(server: dict, deadline: float, ready: str) -> bool:
    """Wait, bounded by `deadline`, until the server is healthy or (ready == "profiled") past its memory profile;
    False when it exited or the time ran out (its record says which)."""
    rec = server["rec"]
    while time.time() < deadline:
        if server["proc"].poll() is not None:
            text = server["log"].read_text(encoding="utf-8", errors="replace")
            rec.update(status="refused", returncode=server["proc"].returncode)
            rec["reason"] = harness.refusal_reason(text) or f"exited (rc {server['proc'].returncode})"
            return False
        if harness.http_get(server["base"] + "/health", 3)[0] == 200:
            rec.setdefault("profiled_s", round(time.time() - server["t0"], 1))
            rec.update(status="healthy", start_s=round(time.time() - server["t0"], 1))
            return True
        if ready == "profiled" and past_profiling(server["log"].read_text(encoding="utf-8", errors="replace")):
            rec["profiled_s"] = round(time.time() - server["t0"], 1)
            return True
        time.sleep(2)
    rec.update(status="start-timeout", reason=f"not {ready} after {time.time() - server['t0']:.0f} s")
    return False


def server_facts(server: dict) -> None:
    """What the engine says about itself: the KV cache it sized, start-up memory, backend and scale lines."""
    text = server["log"].read_text(encoding="utf-8", errors="replace")
    lines = harness.interesting_lines(text)
    rec = server["rec"]
    rec["log_lines"] = lines
    rec["memory"] = harness.parse_memory_lines(lines)
    rec["scale_lines"] = [line.strip()[:400] for line in text.splitlines() if SCALE_LINES.search(line)][:20]
    if rec["status"] == "healthy":
        rec["cache_config"] = harness.cache_config(harness.http_get(server["base"] + "/metrics", 10)[1])


def run(args: argparse.Namespace) -> int:
    """Install, start A, B and C staggered, wait for them, measure, stop them (whatever happened), write $OUT."""
    t_start = time.time()
    deadline = t_start + args.budget_s
    doc = json.loads(args.plan.read_text(encoding="utf-8"))
    host = _Host(doc["hosts"][0], args.python)  # the environment and harness arguments are the same for every card
    record: dict[str, Any] = {"started": t_start, "budget_s": args.budget_s, "servers": []}
    servers: list[dict] = []
    measured: dict[str, Any] = {"raw": {}, "rows": [], "flatness": None}

    def save(status: str, final: bool = False) -> None:
        record["status"] = status
        logs = []
        for server in servers:
            logs.append(
                f"===== server {server['variant']} ({server['rec']['name']}): last {LOG_TAIL_LINES} lines ====="
            )
            logs += log_tail(server["log"].read_text(encoding="utf-8", errors="replace"))
        summary = summary_doc(
            doc,
            measured["rows"],
            measured["flatness"],
            run=record,
            host_gpu=record.get("host_gpu"),
            vllm_installed=(record.get("install") or {}).get("vllm_version"),
        )
        write_outputs(args.out, summary, measured["raw"], "\n".join(logs) + "\n", show=final)

    def progress(raw: dict, rows: list[dict]) -> None:
        measured.update(raw=raw, rows=rows)
        save("measuring")

    def steps() -> tuple[str, str | None]:
        try:
            record["install"] = host.install()
        except (ValueError, subprocess.CalledProcessError, OSError) as exc:
            return "install-failed", f"install failed: {exc}"
        harness.log(f"installed: vLLM {record['install'].get('vllm_version')}")
        record["environment"] = host.environment()
        smi = record["environment"]["nvidia_smi"]
        plan, why = host_plan(doc, smi)
        card = smi_card(smi)
        if plan is None or card is None:
            return "refused", why or f"cannot read the card from nvidia-smi: {smi[:200]!r}"
        record["host_gpu"] = plan["host_gpu"]["name"]
        record["jit_cache"] = harness.restore_planned_jit_cache(plan, host.env())
        harness.log(f"JIT cache: {record['jit_cache']}")
        refusal = budget_refusal(plan, card[1], harness.gpu_used_mib() or 0)
        if refusal:
            return "refused", refusal
        paths = harness.write_models(plan)
        env = host.env()
        bound = min(t_start + args.start_timeout_s, deadline - MEASURE_RESERVE_S)
        last = len(plan["experiments"]) - 1
        for index, exp in enumerate(plan["experiments"]):
            port = int(plan["port"]) + index
            if time.time() >= bound:
                record["not_started"] = [e["name"] for e in plan["experiments"][index:]]
                harness.log(f"no time left to start {', '.join(record['not_started'])}")
                break
            if harness.http_get(f"http://127.0.0.1:{port}/health", 3)[0] != -1:
                return "refused", f"port {port} already answers; nothing more started (stop what holds it)"
            server = launch(exp, plan, paths, port, env, args.python, harness.WORK / "answers-drift" / exp["variant"])
            servers.append(server)
            record["servers"].append(server["rec"])
            harness.log(f"started {exp['name']} on port {port}: {' '.join(exp['args'][1:])}")
            save("starting")
            if index == last:
                break
            # The next starts once this one's memory profile is done; without A there is nothing to hold B and C to.
            rec = server["rec"]
            if wait_for(server, bound, "profiled"):
                harness.log(f"  {exp['name']}: {rec['status']}, past its memory profile after {rec['profiled_s']} s")
            elif exp["variant"] == "A":
                server_facts(server)
                return "refused", f"A (the reference) did not start: {rec.get('reason')}"
            else:
                harness.log(f"  {exp['name']}: {rec['status']}: {rec.get('reason')}")
        for server in servers:
            if server["rec"]["status"] == "starting":
                wait_for(server, bound, "healthy")
            server_facts(server)
            rec = server["rec"]
            harness.log(
                f"{rec['name']}: {rec['status']} after {rec.get('start_s')} s {rec.get('reason', '')} "
                f"KV tokens {rec.get('cache_config', {}).get('kv_cache_size_tokens')}"
            )
        save("started")
        urls = {s["variant"]: s["base"] for s in servers if s["rec"]["status"] == "healthy"}
        golden = doc["golden"]
        raw, rows, flat = measure_all(
            urls,
            plan["experiments"][0]["served_model_name"],
            [{"name": p["name"], "prompt": p["sent"]} for p in golden["prompts"]],
            golden["tokens"],
            golden["top_k"],
            {e["variant"]: e["args"] for e in plan["experiments"]},
            doc["vllm_version"],
            args.request_timeout_s,
            deadline,
            progress,
        )
        measured.update(raw=raw, rows=rows, flatness=flat)
        if all(r.get("drift") for r in rows):
            return "measured", None
        return "incomplete", "not every server was measured: " + "; ".join(
            f"{r['measure']}: {r['error']}" for r in rows if r.get("error")
        )

    try:
        status, message = steps()
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 - the servers stop whatever broke
        status, message = "error", f"{type(exc).__name__}: {exc}"
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second TERM must not leave the servers running
    late = time.time() > deadline - 30  # past the budget: stop quickly, without waiting for the card's memory
    for index, server in enumerate(servers):
        harness.stop(server["proc"], grace=5 if late else 20, wait_gpu=not late and index == len(servers) - 1)
    record.update(message=message, total_s=round(time.time() - t_start, 1))
    save(status, final=True)
    harness.log(f"{status}{': ' + message if message else ''} ({record['total_s']} s); files in {args.out}")
    return 0 if status == "measured" else 1


def cpu_smoke(args: argparse.Namespace) -> int:
    """The measurements against servers already running here (a CPU vLLM with its own tokenizer: the golden set's own
    words, not respelt)."""
    doc = json.loads(args.plan.read_text(encoding="utf-8"))
    urls = {"A": local_url(args.url)}
    urls["B"] = local_url(args.url_b) if args.url_b else urls["A"]
    urls["C"] = local_url(args.url_c) if args.url_c else urls["A"]
    for name, url in urls.items():
        if harness.http_get(url + "/health", 5)[0] != 200:
            print(f"{name}: {url}/health does not answer 200; start the server first", file=sys.stderr)
            return 2
    golden = doc["golden"]
    argv = {e["variant"]: e["args"] for e in doc["hosts"][0]["experiments"]}
    tokens = args.tokens or golden["tokens"]
    t0 = time.time()
    raw, rows, flat = measure_all(
        urls,
        args.model,
        [{"name": p["name"], "prompt": p["prompt"]} for p in golden["prompts"]],
        tokens,
        golden["top_k"],
        argv,
        doc["vllm_version"],
        args.request_timeout_s,
        t0 + args.budget_s,
    )
    note = "cpu smoke: " + ("A, B and C are the same server" if len(set(urls.values())) == 1 else "servers given")
    version = json.loads(harness.http_get(urls["A"] + "/version", 5)[1] or "{}").get("version")
    run = {"mode": note, "urls": urls, "total_s": round(time.time() - t0, 1)}
    summary = summary_doc(doc, rows, flat, run=run, host_gpu=note, vllm_installed=version, tokens=tokens)
    write_outputs(args.out, summary, raw, "")
    return 0 if all(r.get("drift") for r in rows) else 1


def plan_cmd(args: argparse.Namespace) -> int:
    hosts = tuple(args.host_gpu) or HOSTS
    try:
        doc = build_plan(args.profile, hosts)
    except ValueError as exc:
        print(f"answers_drift.py plan: {exc}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    for plan in doc["hosts"]:
        gpu = plan["host_gpu"]
        print(f"{gpu['name']} ({gpu['memory_mib']} MiB): side by side {plan['side_by_side_share']} of the card")
        for exp in plan["experiments"]:
            util, kv, argv = exp["emulated_utilization"], exp["planner"]["kv_cache_tokens"], " ".join(exp["args"][1:])
            print(f"  {exp['variant']} util {util:.6f} predicted KV {kv}: {argv}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="write the plan (on the controller)")
    p.add_argument("--profile", default=PROFILE, help=f"the shipped profile (default {PROFILE})")
    p.add_argument(
        "--host-gpu",
        action="append",
        default=[],
        metavar="NAME,MIB,GB_S",
        type=_host_gpu,
        help="a host card to plan for (repeatable; default: H100,81559,3350 and H200,143771,4800)",
    )
    p.add_argument("--out", type=Path, default=PLAN)
    r = sub.add_parser("run", help="start the servers, measure, stop (on the CUDA host)")
    s = sub.add_parser("cpu-smoke", help="measure servers already running on 127.0.0.1")
    for q in (r, s):
        q.add_argument("--plan", type=Path, default=PLAN)
        q.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gpu-out")))
        q.add_argument("--request-timeout-s", type=float, default=60.0, help="each request's bound (default 60)")
    r.add_argument("--python", default=sys.executable, help="the Python that runs vLLM (default: this one)")
    r.add_argument(
        "--budget-s",
        type=float,
        default=1200.0,
        help="the whole run's bound, install and stops included (default 1200; 480 in a command of 540 s)",
    )
    r.add_argument("--start-timeout-s", type=float, default=900.0, help="the servers' starts' bound (default 900)")
    s.add_argument("--url", required=True, help="A's server, http://127.0.0.1:PORT")
    s.add_argument("--url-b", help="B's server (default: A's)")
    s.add_argument("--url-c", help="C's server (default: A's)")
    s.add_argument("--model", required=True, help="the served model name")
    s.add_argument("--tokens", type=int, default=0, help="tokens per answer (default: the golden set's)")
    s.add_argument("--budget-s", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.cmd == "plan":
        return plan_cmd(args)
    args.out.mkdir(parents=True, exist_ok=True)
    # A TERM (a command's time limit) stops the servers too: run's finally-like finish() runs on SystemExit.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return run(args) if args.cmd == "run" else cpu_smoke(args)


def _host_gpu(text: str) -> dict:
    try:
        name, mib, gb_s = (part.strip() for part in text.split(","))
        return {"name": name, "memory_mib": int(mib), "bandwidth_gb_s": int(gb_s), "count": 1}
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME,MIB,GB_S (e.g. 'H100,81559,3350')") from None


if __name__ == "__main__":
    sys.exit(main())
