#!/usr/bin/env python3
"""The GPU benchmark's runner, on the CUDA host: the plan's vLLM starts, loads and playbooks.

    harness.py run [--round N] [--only A,B] [--budget-s S] [--python PY] [--again]
                                  install if needed, write the dummy models, run the plan's experiments
                                  not yet done on this host (--again: all of them, or --only's, once more
                                  as a new round), in order; results into $OUT
    harness.py next-round         the number the next `run` takes on this host
    harness.py jit-cache-save     pack the driver's JIT cache into $OUT (`run` unpacks the plan's)

What `run` does, in order, writing $OUT/results-roundN.json and $OUT/raw-roundN.tar.gz after every
experiment (so a round stopped at its time limit still leaves what it measured):
1. uses the vLLM that PY imports, or, where the offline bundle is in .gpu/ (build-bundle.sh), assembles it
   (sha256 of every part and of the joined file) and installs it with `pip install --no-deps --no-index
   --target` into /tmp/gpu-site/{vllm,ansible} (once per host), and unpacks the plan's JIT cache where
   the driver looks (once per host; plan.py JIT_CACHE);
2. writes one folder per catalogue model holding only config.json (the planner's catalogue values:
   real dimensions, served with --load-format dummy) and one WordLevel tokenizer folder;
3. per experiment (or per interleaved search: its settings' servers side by side, their loads
   alternated, `Runner.run_group`): starts `vllm serve` with the plan's exact arguments, waits for /health or for the
   process to exit (a refusal: the log's error lines are recorded), reads vllm:cache_config_info and
   the start-up memory lines, runs the experiment's actions (loads, the verification playbook, the
   benchmark playbook), stops the server and waits for the GPU memory to be released.

A round that stops at --budget-s leaves the rest for the next `run` on the same host, which goes on
where it stopped. Stdlib only (python3 3.12); the plan (experiments.json) is written on the controller by
plan.py with the project's renderer and planner, so nothing here decides an argument.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "src"))
import bundle  # noqa: E402  (gpu/bench/bundle.py)
import parts  # noqa: E402  (gpu/bench/parts.py)
from vllm_fleet import bench  # noqa: E402  (stdlib only: the load generator and its counter reader)

# Everything lives under /tmp on the host; GPU_HARNESS_TMP moves it (a dry run, tests).
TMP = Path(os.environ.get("GPU_HARNESS_TMP", "/tmp"))
BUNDLE_DIR = TMP / "gpu-bundle"
SITE = TMP / "gpu-site"
MODELS = TMP / "gpu-models"
ADAPTERS = TMP / "gpu-adapters"
WORK = TMP / "gpu-work"
START_TIMEOUT_S = 420
TOKENIZER_SPECIALS = ("<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)
# Start-up lines worth keeping: the engine's own account of memory and time.
LOG_PATTERNS = (
    r"Model loading took",
    r"Available KV cache memory",
    r"GPU KV cache size",
    r"Maximum concurrency",
    r"CUDA graph memory profiling",
    r"Graph capturing finished",
    r"torch\.compile took",
    r"Actual usage is",
    r"Estimated CUDA graph memory",
    r"Model Runner V2",
    r"init engine .* took",
    r"memory profiling",
    r"VocabMapping",
    r"LoRA",
    r"Using .* backend",
    r"attention backend",
    r"[Ee]rror",
    r"Traceback",
    r"Exception",
)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --- models ---------------------------------------------------------------------------------------


def model_dir(model_id: str) -> Path:
    return MODELS / model_id.replace("/", "--")


def model_config(config: dict) -> dict:
    """The config.json of a dummy-weight model: the catalogue's values (what the planner sizes), plus
    the few fields transformers needs to read it, at Qwen2's own values."""
    out = dict(config)
    out.setdefault("bos_token_id", 1)
    out.setdefault("eos_token_id", 3)
    out.setdefault("hidden_act", "silu")
    out.setdefault("rms_norm_eps", 1e-6)
    out.setdefault("rope_theta", 1000000.0)
    out.setdefault("use_sliding_window", False)
    out.setdefault("attention_dropout", 0.0)
    return out


def tokenizer_files(vocab_size: int, max_len: int = 32768) -> dict[str, dict]:
    """A WordLevel tokenizer with one token per id below vocab_size (specials first, then t<N>), so
    that every id random weights emit decodes, and decode/encode round-trips (whitespace split)."""
    if vocab_size <= len(TOKENIZER_SPECIALS):
        raise ValueError(f"vocab_size={vocab_size} is too small for a tokenizer")
    vocab = {t: i for i, t in enumerate(TOKENIZER_SPECIALS)}
    vocab.update((f"t{i}", i) for i in range(len(TOKENIZER_SPECIALS), vocab_size))
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, t in enumerate(TOKENIZER_SPECIALS)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": max_len,
        "chat_template": CHAT_TEMPLATE,
    }
    return {"tokenizer.json": tokenizer, "tokenizer_config.json": config}


def write_models(plan: dict, root: Path = MODELS) -> dict[str, str]:
    """Write every plan model's folder and the tokenizer folder; returns {name: path}."""
    paths = {}
    tok_dir = root / "tokenizer"
    tok_dir.mkdir(parents=True, exist_ok=True)
    files = tokenizer_files(plan["tokenizer_vocab_size"])
    for name, content in files.items():
        (tok_dir / name).write_text(json.dumps(content), encoding="utf-8")
    paths["tokenizer"] = str(tok_dir)
    for model_id, entry in plan["models"].items():
        folder = root / model_id.replace("/", "--")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(model_config(entry["config"]), indent=1), encoding="utf-8")
        if entry.get("tokenizer_in_folder"):  # a draft loaded with its own tokenizer (heterogeneous vocab)
            for name in files:
                shutil.copy(tok_dir / name, folder / name)
        paths[model_id] = str(folder)
    return paths


def write_adapters(plan: dict, paths: dict[str, str], root: Path = ADAPTERS) -> dict[str, str]:
    """Build every LoRA adapter the plan names (plan["adapters"]: {name: {model, rank, seed}}) with
    lab/scripts/build-lora-adapter.py, for the model's folder that write_models wrote (random non-zero weights of the
    model's shapes, PEFT's format); returns {"adapter:NAME": path}, the keys substitute() replaces."""
    out = {}
    for name, spec in (plan.get("adapters") or {}).items():
        folder = root / name
        if not (folder / "adapter_config.json").exists():
            subprocess.run(
                [
                    sys.executable,
                    str(REPO / "lab" / "scripts" / "build-lora-adapter.py"),
                    paths[spec["model"]],
                    str(folder),
                    "--base",
                    spec["model"],
                    "--rank",
                    str(spec["rank"]),
                    "--seed",
                    str(spec["seed"]),
                ],
                check=True,
                capture_output=True,
                text=True,
            )
        out[f"adapter:{name}"] = str(folder)
    return out


def substitute(args: list[str], paths: dict[str, str]) -> list[str]:
    """Replace {model:ID}, {adapter:NAME} and {tokenizer} placeholders (also inside JSON arguments)."""
    out = []
    for arg in args:
        for key, path in paths.items():
            if key == "tokenizer":
                arg = arg.replace("{tokenizer}", path)
            elif key.startswith("adapter:"):
                arg = arg.replace("{%s}" % key, json.dumps(path)[1:-1])  # also inside a JSON argument
            else:
                arg = arg.replace("{model:%s}" % key, path)
        if "{model:" in arg or "{adapter:" in arg or "{tokenizer}" in arg:
            raise ValueError(f"unresolved placeholder in argument {arg!r}")
        out.append(arg)
    return out


# --- metrics and logs -----------------------------------------------------------------------------


def cache_config(metrics_text: str) -> dict[str, str]:
    """The labels of vllm:cache_config_info (raw strings), {} when absent."""
    return bench.info_labels(metrics_text, "vllm:cache_config_info")


def counter(metrics_text: str, name: str) -> float | None:
    """Sum of a counter's series (name without _total, one of vllm_fleet.bench's), None when absent."""
    return bench.counters(metrics_text).get(name)


def dataset_args(action: dict) -> list[str]:
    """vllm bench serve's dataset arguments of a bench action: the random prompts of input_len and output_len, or the
    dataset the action names with its own options (a tune search's shared-prefix load: prefix_repetition)."""
    dataset = action.get("dataset")
    if not dataset:
        return [
            "--dataset-name",
            "random",
            "--random-input-len",
            str(action["input_len"]),
            "--random-output-len",
            str(action["output_len"]),
        ]
    args = ["--dataset-name", str(dataset["dataset_name"])]
    for key, value in dataset.items():
        if key != "dataset_name":
            args += ["--" + key.replace("_", "-"), str(value)]
    return args


def prefix_cache_delta(before: str, after: str) -> dict | None:
    """The prefix cache's hits and queries (in tokens) between two scrapes of /metrics, and their ratio; None when
    the release exposes no such counters."""
    names = ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries")
    first, last = (bench.counters(text or "", names) for text in (before, after))
    hits, queries = (last.get(n, 0.0) - first.get(n, 0.0) for n in names)
    if not queries:
        return None
    return {"hits": hits, "queries": queries, "hit_rate": round(hits / queries, 4)}


def interesting_lines(text: str, limit: int = 60) -> list[str]:
    pattern = re.compile("|".join(LOG_PATTERNS))
    lines = [line.strip()[:400] for line in text.splitlines() if pattern.search(line)]
    return lines[:limit]


def refusal_reason(text: str) -> str | None:
    """The last line of a failed start that says why (an exception message), if any."""
    candidates = [
        line.strip()
        for line in text.splitlines()
        if (re.search(r"(Error|Exception)\b.*:", line) or "Value error, " in line) and "Traceback" not in line
    ]
    # pydantic wraps a validator's message: "1 validation error for X" then "  Value error, <message>".
    values = [c for c in candidates if "Value error, " in c]
    if values:
        return values[-1][:600]
    return candidates[-1][:600] if candidates else None


def parse_memory_lines(lines: list[str]) -> dict[str, float]:
    """Numbers out of the start-up lines: weights GiB, KV GiB, KV tokens, CUDA graph estimate."""
    out: dict[str, float] = {}
    for line in lines:
        if m := re.search(r"Model loading took ([\d.]+) GiB", line):
            out["weights_gib"] = out.get("weights_gib", 0.0) + float(m.group(1))
        if m := re.search(r"Available KV cache memory: ([\d.]+) GiB", line):
            out["kv_gib"] = float(m.group(1))
        if m := re.search(r"GPU KV cache size: ([\d,]+) tokens", line):
            out["kv_tokens"] = float(m.group(1).replace(",", ""))
        if m := re.search(
            r"Actual usage is ([\d.]+) GiB for weight, ([\d.]+) GiB for peak activation, "
            r"([\d.]+) GiB for non-torch memory, and ([\d.]+) GiB for CUDAGraph memory",
            line,
        ):
            out.update(
                usage_weights_gib=float(m.group(1)),
                usage_activation_gib=float(m.group(2)),
                usage_non_torch_gib=float(m.group(3)),
                usage_cuda_graph_gib=float(m.group(4)),
            )
        if m := re.search(r"Estimated CUDA graph memory: ([\d.]+) GiB", line):
            out["cuda_graph_estimate_gib"] = float(m.group(1))
        if m := re.search(
            r"current --gpu-memory-utilization=([\d.]+) is equivalent to "
            r"--gpu-memory-utilization=([\d.]+)",
            line,
        ):
            out["cuda_graph_util"] = round(float(m.group(1)) - float(m.group(2)), 4)
    return out


def bench_summary(result: dict) -> dict:
    """The numbers the docs compare, from a `vllm bench serve --save-result` JSON."""
    keys = (
        "completed",
        "failed",
        "duration",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "median_tpot_ms",
        "p99_tpot_ms",
        "mean_itl_ms",
        "median_itl_ms",
        "p99_itl_ms",
        "mean_e2el_ms",
        "p99_e2el_ms",
        "max_concurrency",
        "max_concurrent_requests",
        "spec_decode_acceptance_rate",
    )
    return {k: result.get(k) for k in keys if k in result}


def _pct(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100, linear between ranks, as numpy's default), None for no values."""
    vals = sorted(values)
    if not vals:
        return None
    k = (len(vals) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)


def bench_detail(result: dict, users: int) -> dict:
    """What a `--save-detailed` result says about where the TTFT comes from: requests in the order they were
    sent (start_times), the first `users` (the burst at t=0) against the later ones (sent as earlier ones
    finished), in ms; and the inter-token gaps over 3x their median (stalled by a prefill step), as a
    share of all gaps with their median length."""
    starts, ttfts = result.get("start_times") or [], result.get("ttfts") or []
    if not ttfts or len(starts) != len(ttfts):
        return {}
    t0 = min(starts)
    order = sorted(range(len(ttfts)), key=lambda i: starts[i])
    ttft_ms = [round(ttfts[i] * 1000, 1) for i in order]
    start_s = [round(starts[i] - t0, 3) for i in order]
    first, later = ttft_ms[:users], ttft_ms[users:]
    gaps = [g * 1000 for per in (result.get("itls") or []) for g in per]
    median = _pct(gaps, 50) or 0.0
    stalled = [g for g in gaps if g > 3 * median]
    r = lambda v: None if v is None else round(v, 1)  # noqa: E731
    return {
        "first_wave": {"requests": len(first), "median_ttft_ms": r(_pct(first, 50)), "p99_ttft_ms": r(_pct(first, 99))},
        "later": {"requests": len(later), "median_ttft_ms": r(_pct(later, 50)), "p99_ttft_ms": r(_pct(later, 99))},
        "itl_gaps": len(gaps),
        "itl_stalled_pct": round(100 * len(stalled) / len(gaps), 3) if gaps else None,
        "itl_stalled_median_ms": r(_pct(stalled, 50)),
        "itl_p999_ms": r(_pct(gaps, 99.9)),
        "ttft_ms_in_send_order": ttft_ms,
        "start_s_in_send_order": start_s,
    }


def fleet_summary(result: dict) -> dict:
    """vllm_fleet.bench's JSON in the keys of bench_summary (no TPOT: it measures chunk gaps, the ITL),
    plus the single-stream decode rate (1000 / mean ITL of the single-stream requests)."""
    load = result.get("load") or {}
    ttft, itl = load.get("ttft_ms") or {}, load.get("itl_ms") or {}
    out = {
        "completed": load.get("completed"),
        "failed": load.get("failed"),
        "duration": load.get("wall_s"),
        "total_output_tokens": load.get("output_tokens"),
        "request_throughput": load.get("requests_per_s"),
        "output_throughput": load.get("output_tokens_per_s"),
        "max_concurrency": load.get("concurrency"),
        "mean_ttft_ms": ttft.get("mean"),
        "median_ttft_ms": ttft.get("p50"),
        "p99_ttft_ms": ttft.get("p99"),
        "mean_itl_ms": itl.get("mean"),
        "median_itl_ms": itl.get("p50"),
        "p99_itl_ms": itl.get("p99"),
        "p999_itl_ms": itl.get("p999"),
        "max_itl_ms": itl.get("max"),
        "itl_stalled_pct": itl.get("stalled_pct"),
    }
    single = result.get("single") or {}
    if single.get("completed"):
        out["single_completed"] = single["completed"]
        out["single_tokens_per_s"] = (result.get("efficiency") or {}).get("single_stream_tokens_per_s")
    return out


# --- processes ------------------------------------------------------------------------------------


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (OSError, ValueError):
        return -1, ""


def jit_cache_dir(env: dict) -> Path:
    """Where the CUDA driver keeps PTX it compiled for this GPU between processes (up to CUDA_CACHE_MAXSIZE)."""
    return Path(env.get("CUDA_CACHE_PATH") or Path(env.get("HOME", "/root")) / ".nv" / "ComputeCache")


def jit_cache_mib(env: dict) -> float:
    """The size of the driver's JIT cache: whether a start paid for the JIT or found its output there."""
    root = jit_cache_dir(env)
    total = sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) if root.is_dir() else 0
    return round(total / 2**20, 1)


def save_jit_cache(env: dict, out: Path, part_bytes: int = parts.JIT_PART_BYTES) -> list[Path]:
    """Pack the driver's JIT cache (tar.xz) into out/jit-cache.part-NN, so that a later start on a fresh
    machine with the same driver and vLLM runs bf16/fp16 FlashAttention 2 without the JIT."""
    root = jit_cache_dir(env)
    packed = out / "jit-cache.tar.xz"
    with tarfile.open(packed, "w:xz", preset=6) as tar:
        tar.add(root, arcname="ComputeCache")
    pieces = parts.split(packed, out, part_bytes, prefix="jit-cache.part-")
    packed.unlink()
    return pieces


def restore_jit_cache(env: dict, pieces: list[Path]) -> Path:
    """Join jit-cache.part-NN files and unpack them where the driver looks (CUDA_CACHE_PATH, else
    ~/.nv/ComputeCache), whatever that folder is called."""
    root = jit_cache_dir(env)
    root.mkdir(parents=True, exist_ok=True)
    joined = root.parent / f".{root.name}.jit-cache.tar.xz"
    with open(joined, "wb") as out:
        for part in sorted(pieces):
            out.write(part.read_bytes())
    with tarfile.open(joined) as tar:
        members = []
        for member in tar.getmembers():
            head, _, rest = member.name.partition("/")
            if head == "ComputeCache" and rest:  # as save_jit_cache packed it
                member.name = rest
                members.append(member)
        tar.extractall(root, members=members, filter="data")
    joined.unlink()
    return root


def restore_planned_jit_cache(plan: dict, env: dict) -> dict:
    """Unpack the plan's JIT cache (plan.py JIT_CACHE) into the driver's cache folder, once per
    machine, after checking each part's sha256; a part that is missing or damaged is reported, not fatal
    (the starts then compile, and take longer)."""
    spec = plan.get("jit_cache") or {}
    marker = jit_cache_dir(env) / ".restored-by-harness"
    if not spec.get("parts"):
        return {"restored": False, "why": "the plan carries none", "mib": jit_cache_mib(env)}
    if marker.exists():
        return {"restored": True, "why": "earlier on this machine", "mib": jit_cache_mib(env)}
    pieces = [REPO / name for name in spec["parts"]]
    bad = [q.name for q in pieces if not q.exists() or parts.sha256(q) != spec["sha256"].get(q.name)]
    if bad:
        return {"restored": False, "why": f"missing or damaged: {bad}", "mib": jit_cache_mib(env)}
    t0 = time.time()
    restore_jit_cache(env, pieces)
    marker.write_text(json.dumps(spec["sha256"]))
    return {"restored": True, "seconds": round(time.time() - t0, 1), "mib": jit_cache_mib(env)}


def gpu_used_mib() -> int | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        return int(out.split()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def stop(proc: subprocess.Popen, grace: float = 20.0, wait_gpu: bool = True) -> None:
    """Stop a server and, unless another one still runs beside it (`wait_gpu` false), wait for the GPU's memory."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    # The engine core is a child process: wait until the GPU memory is back.
    for _ in range(30 if wait_gpu else 0):
        used = gpu_used_mib()
        if used is None or used < 2048:
            return
        time.sleep(1)


def card_mismatch(plan: dict, nvidia_smi: str) -> str | None:
    """Why the plan cannot run on this GPU, or None. The plan emulates each card's budget as a fraction of the host
    card's memory (plan.py --host-gpu): a plan made for another card's memory would give every start another budget
    than the card it stands for, so it is refused rather than run. nvidia-smi's first line: `name, N MiB, ...`."""
    host = plan.get("host_gpu") or {}
    fields = [f.strip() for f in nvidia_smi.splitlines()[0].split(",")] if nvidia_smi.strip() else []
    try:
        name, mib = fields[0], int(fields[1].split()[0])
    except (IndexError, ValueError):
        return None if not host else f"cannot read this host's GPU from nvidia-smi ({nvidia_smi[:200]!r}); nothing ran"
    planned = host.get("memory_mib")
    if planned and abs(mib - planned) > planned * 0.01:
        return (
            f"the plan is for a host GPU of {planned} MiB ({host.get('name')}); this host has {name} of {mib} MiB, "
            f"so each emulated card would get another budget. Nothing ran. Fix: on the controller, "
            f"gpu/bench/plan.py --host-gpu '{name},{mib},GB_S' (with --tune ... as before), and run that plan"
        )
    return None


def next_round() -> int:
    """The round a new `run` on this host takes: one more than the rounds already run here."""
    return 1 + len(list(WORK.glob("round*"))) if WORK.is_dir() else 1


class Runner:
    def __init__(
        self,
        plan: dict,
        round_: int,
        out: Path,
        deadline: float,
        python: str = sys.executable,
        only: list[str] | None = None,
        again: bool = False,
    ):
        self.plan, self.round, self.out, self.deadline, self.python = plan, round_, out, deadline, python
        self.only = set(only or [])
        self.again = again
        self.work = WORK / f"round{round_}"
        self.work.mkdir(parents=True, exist_ok=True)
        self.results: dict = {
            "round": round_,
            "plan_date": plan.get("date"),
            "started": time.time(),
            "install": None,
            "environment": None,
            "experiments": [],
        }
        self.paths: dict[str, str] = {}
        self.port = int(plan.get("port", 8000))

    # environment
    def env(self, site: str = "vllm") -> dict:
        env = dict(os.environ)
        env.update(self.plan.get("environment", {}))
        env["PYTHONPATH"] = str(SITE / site) + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def left(self) -> float:
        return self.deadline - time.time()

    def save(self) -> None:
        self.results["saved"] = time.time()
        (self.out / f"results-round{self.round}.json").write_text(json.dumps(self.results, indent=1), encoding="utf-8")
        with tarfile.open(self.out / f"raw-round{self.round}.tar.gz", "w:gz") as tar:
            tar.add(self.work, arcname=f"round{self.round}")

    # steps
    def install(self) -> dict:
        marker = SITE / ".installed"
        if marker.exists():
            return json.loads(marker.read_text())
        t0 = time.time()
        sums = REPO / ".gpu" / bundle.SUMS
        if not sums.exists():  # no offline bundle: the vLLM (and ansible-core) that --python imports
            version = subprocess.run(
                [self.python, "-c", "import vllm; print(vllm.__version__)"],
                env=self.env(),
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            return {"vllm_version": version, "python": self.python}
        wheels = bundle.assemble([BUNDLE_DIR / "parts", REPO / ".gpu"], sums, BUNDLE_DIR / "unpacked")
        t1 = time.time()
        for section in ("vllm", "ansible"):
            target = SITE / section
            subprocess.run(
                [
                    self.python,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--no-deps",
                    "--no-index",
                    "--no-compile",
                    "--no-cache-dir",
                    "--target",
                    str(target),
                    *sorted(map(str, (wheels / section).glob("*.whl"))),
                ],
                check=True,
            )
        version = subprocess.run(
            [self.python, "-c", "import vllm; print(vllm.__version__)"],
            env=self.env(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        info = {
            "assemble_s": round(t1 - t0, 1),
            "pip_s": round(time.time() - t1, 1),
            "vllm_version": version,
            "manifest": json.loads((wheels / bundle.MANIFEST).read_text())["sections"],
        }
        shutil.rmtree(BUNDLE_DIR / "unpacked", ignore_errors=True)
        marker.write_text(json.dumps(info))
        return info

    def environment(self) -> dict:
        def run(cmd: list[str], env: dict | None = None) -> str:
            try:
                return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env).stdout.strip()
            except (OSError, subprocess.SubprocessError) as exc:
                return f"failed: {exc}"

        torch_info = run(
            [
                self.python,
                "-c",
                "import torch; p = torch.cuda.get_device_properties(0); "
                "print(torch.__version__, p.name, p.total_memory, torch.cuda.mem_get_info()[1])",
            ]
        )
        return {
            "nvidia_smi": run(
                [
                    "nvidia-smi",
                    "--query-gpu=name,memory.total,memory.used,driver_version,clocks.max.sm,clocks.max.mem",
                    "--format=csv,noheader",
                ]
            ),
            "torch": torch_info,
            "python": sys.version.split()[0],
            "transformers": run([self.python, "-c", "import transformers; print(transformers.__version__)"]),
        }

    def run_experiment(self, exp: dict) -> dict:
        """One experiment alone: start its server, run its actions in order, stop it."""
        rec, server = self.start(exp, self.port)
        if server is None:
            return rec
        try:
            for action in exp.get("actions", []):
                self.act(rec, server, action, exp)
        finally:
            self.finish(rec, server)
        return rec

    def run_group(self, exps: list[dict]) -> list[dict]:
        """The experiments of one interleaved search (plan.py's `interleave`), each on its own port, all running at
        once: started one after the other, then their loads alternated A B, B A, A B... by repeat (the order turns
        each repeat, so neither setting always loads first), then stopped. Each setting's repeats are spread over the
        same minutes as the others', so a drift of the host (clocks, heat, another tenant) falls on all alike, and
        a search of N repeats costs one start per setting instead of N. Only one server loads at a time; the idle
        one takes no GPU time (its engine waits on its socket). Its memory is its own: gpu_memory_utilization is a
        fraction of the card, and the plan keeps the group's sum below 1 (a start that does not fit is refused by
        vLLM and recorded as such)."""
        started: list[tuple[dict, dict, dict]] = []
        records = []
        for index, exp in enumerate(exps):
            rec, server = self.start(exp, self.port + index)
            records.append(rec)
            if server is not None:
                started.append((exp, rec, server))
        try:
            rounds = max((len(exp.get("actions", [])) for exp, _, _ in started), default=0)
            for repeat in range(rounds):
                order = started if repeat % 2 == 0 else started[::-1]
                for exp, rec, server in order:
                    if repeat < len(exp.get("actions", [])):
                        self.act(rec, server, exp["actions"][repeat], exp)
        finally:
            for index, (_exp, rec, server) in enumerate(started):
                self.finish(rec, server, wait_gpu=index == len(started) - 1)
        for exp, rec, _server in started:
            if exp.get("warm_restart"):
                self.warm_restart(exp, rec)
        return records

    def warm_restart(self, exp: dict, rec: dict) -> None:
        """Start an experiment's server once more, alone, with the same arguments, so that vLLM finds the compile
        cache its first start wrote; record the KV cache it sizes then (the planner's warm-restart prediction is
        checked against it) and stop it. No load runs on it."""
        # est_s: a start alone (76-124 s for the 4090's 7B on the H200 in run 10), not the experiment's loads
        again, server = self.start(dict(exp, name=f"{exp['name']}/warm-restart", est_s=130), self.port)
        keep = ("status", "reason", "start_s", "cache_config", "memory")
        rec["warm_restart"] = {key: again[key] for key in keep if key in again}
        if server is not None:
            log_text = (server["folder"] / "server.log").read_text(encoding="utf-8", errors="replace")
            rec["warm_restart"]["compiled"] = "Directly load the compiled graph" not in log_text
            stop(server["proc"])
            rec["warm_restart"]["status"] = "ran"
        self.save_partial(rec)

    def start(self, exp: dict, port: int) -> tuple[dict, dict | None]:
        """Start an experiment's server on `port` and wait for /health: (its record, the server) or (the record of
        a skip, a refusal or a start that ran out of time, None)."""
        name = exp["name"]
        rec: dict = {"name": name, "kind": exp.get("kind"), "profile": exp.get("profile"), "status": "started"}
        if exp.get("interleave"):
            rec["interleave"] = exp["interleave"]
        wanted = exp.get("est_s", 150)
        if self.left() < wanted:
            rec.update(
                status="skipped", reason=f"{self.left():.0f} s left in this round, the experiment needs ~{wanted} s"
            )
            return rec, None
        folder = self.work / name
        folder.mkdir(parents=True, exist_ok=True)
        args = substitute(exp["args"], self.paths) + substitute(self.plan["harness_args"], self.paths)
        args += ["--port", str(port)]
        rec["argv"] = ["vllm", "serve", *args]
        logfile = folder / "server.log"
        rec["jit_cache_mib"] = {"before": jit_cache_mib(self.env())}
        t0 = time.time()
        with open(logfile, "w", encoding="utf-8") as logf:
            proc = subprocess.Popen(
                [self.python, "-m", "vllm.entrypoints.cli.main", "serve", *args],
                stdout=logf,
                stderr=subprocess.STDOUT,
                env=self.env(),
                start_new_session=True,
                cwd=str(self.work),
            )
        base = f"http://127.0.0.1:{port}"
        # On the H200, vLLM's defaults and other bf16 caches under FlashAttention 2 started in 275-300 s when
        # the driver compiled (FULL CUDA graphs: 46-52 s for each of the first sizes), so the bound is well
        # above that.
        own_bound = exp.get("start_timeout_s", START_TIMEOUT_S)
        timeout = min(own_bound, max(self.left() - 20, 30))
        healthy = False
        while time.time() - t0 < timeout:
            if proc.poll() is not None:
                break
            if http_get(base + "/health", 3)[0] == 200:
                healthy = True
                break
            time.sleep(2)
        rec["start_s"] = round(time.time() - t0, 1)
        rec["jit_cache_mib"]["after_start"] = jit_cache_mib(self.env())
        text = logfile.read_text(encoding="utf-8", errors="replace")
        if not healthy:
            # Still running when the bound ran out: a slow start, not a refusal (our SIGTERM below makes
            # vLLM exit cleanly, so its return code cannot tell the two apart).
            timed_out = proc.poll() is None
            stop(proc)
            text = logfile.read_text(encoding="utf-8", errors="replace")
            rec["log_lines"] = interesting_lines(text)
            rec["log_tail"] = text.splitlines()[-25:]
            if timed_out:
                rec["reason"] = f"not healthy after {rec['start_s']} s (the start bound); still starting"
                rec["status"] = "start-timeout"
                # a bound the round's remaining time cut short: the next round on this host tries again
                rec["budget_cut"] = timeout < own_bound
            else:
                rec["reason"] = refusal_reason(text) or f"exited (rc {proc.returncode}) after {rec['start_s']} s"
                rec["status"] = "refused"
            rec["returncode"] = proc.returncode
            rec["expected"] = bool(exp.get("expect_refusal")) and rec["status"] == "refused"
            return rec, None
        _status, metrics = http_get(base + "/metrics", 10)
        (folder / "metrics_idle.txt").write_text(metrics, encoding="utf-8")
        rec["cache_config"] = cache_config(metrics)
        rec["log_lines"] = interesting_lines(text)
        rec["memory"] = parse_memory_lines(rec["log_lines"])
        rec["expected"] = not exp.get("expect_refusal")
        rec["actions"] = []
        return rec, {"proc": proc, "base": base, "folder": folder, "t0": t0}

    def act(self, rec: dict, server: dict, action: dict, exp: dict) -> None:
        """One of an experiment's actions on its running server, recorded (skipped when the round's time is short:
        est_s is what the action usually takes, its timeout_s the hard stop, bounded by the round)."""
        if self.left() < action.get("est_s", action.get("timeout_s", 60)) + 10:
            rec["actions"].append(
                {
                    "name": action["name"],
                    "kind": action["kind"],
                    "status": "skipped",
                    "reason": f"round time: {self.left():.0f} s left",
                }
            )
            return
        rec["actions"].append(self.action(action, exp, server["folder"], server["base"]))
        self.save_partial(rec)

    def finish(self, rec: dict, server: dict, wait_gpu: bool = True) -> None:
        _, after = http_get(server["base"] + "/metrics", 10)
        (server["folder"] / "metrics_end.txt").write_text(after, encoding="utf-8")
        rec["preemptions_total"] = counter(after, "vllm:num_preemptions")
        stop(server["proc"], wait_gpu=wait_gpu)
        rec["status"] = "ran"
        rec["total_s"] = round(time.time() - server["t0"], 1)

    def save_partial(self, rec: dict) -> None:
        self.results["in_progress"] = rec
        self.save()
        self.results.pop("in_progress", None)

    def action(self, action: dict, exp: dict, folder: Path, base: str) -> dict:
        kind = action["kind"]
        t0 = time.time()
        # at_s: when it began, in seconds since the round started (an interleaved search's order is read from it)
        out: dict = {"name": action["name"], "kind": kind, "at_s": round(t0 - self.results["started"], 2)}
        if kind == "bench":
            _, before = http_get(base + "/metrics", 10)
            cmd = [
                self.python,
                "-m",
                "vllm.entrypoints.cli.main",
                "bench",
                "serve",
                "--backend",
                "vllm",
                "--base-url",
                base,
                "--endpoint",
                "/v1/completions",
                "--model",
                exp["served_model_name"],
                "--tokenizer",
                self.paths["tokenizer"],
                *dataset_args(action),
                "--num-prompts",
                str(action["num_prompts"]),
                "--max-concurrency",
                str(action["max_concurrency"]),
                "--request-rate",
                "inf",
                "--ignore-eos",
                "--seed",
                str(action.get("seed", 0)),  # a repeat draws other prompts: no prefix cached by the one before
                "--disable-tqdm",
                "--percentile-metrics",
                "ttft,tpot,itl,e2el",
                "--metric-percentiles",
                "50,90,99",
                "--save-result",
                "--result-dir",
                str(folder),
                "--result-filename",
                f"bench-{action['name']}.json",
            ]
            if action.get("save_detailed"):
                cmd.append("--save-detailed")
            if action.get("lora_modules"):  # each request names one of these adapters (vLLM's assignment below)
                cmd += ["--lora-modules", *action["lora_modules"]]
                cmd += ["--lora-assignment", action.get("lora_assignment", "round-robin")]
            out["argv"] = ["vllm", *cmd[3:]]
            try:
                proc = subprocess.run(
                    cmd,
                    env=self.env(),
                    capture_output=True,
                    text=True,
                    timeout=min(action.get("timeout_s", 120), max(self.left() - 20, 10)),
                )
                out["returncode"] = proc.returncode
                (folder / f"bench-{action['name']}.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
            except subprocess.TimeoutExpired:
                out["returncode"] = "timeout"
            _, after = http_get(base + "/metrics", 10)
            result_file = folder / f"bench-{action['name']}.json"
            if result_file.exists():
                result = json.loads(result_file.read_text())
                out["result"] = bench_summary(result)
                if action.get("save_detailed"):
                    out["detail"] = bench_detail(result, action["max_concurrency"])
                    for key in ("itls", "generated_texts"):  # the arrays are reduced above; keep the raw tar small
                        result.pop(key, None)
                    result_file.write_text(json.dumps(result), encoding="utf-8")
            b, a = counter(before, "vllm:num_preemptions"), counter(after, "vllm:num_preemptions")
            out["preemptions"] = None if a is None else a - (b or 0)
            out["prefix_cache"] = prefix_cache_delta(before, after)
        elif kind == "fleet":
            out.update(self.fleet(action, exp, folder, base))
        elif kind == "ansible":
            out.update(self.ansible(action, exp, folder))
        else:
            raise ValueError(f"unknown action kind {kind!r}")
        out["s"] = round(time.time() - t0, 1)
        return out

    def fleet(self, action: dict, exp: dict, folder: Path, base: str) -> dict:
        """The project's load generator (src/vllm_fleet/bench.py, stdlib) against the running server."""
        cmd = [
            self.python,
            "-m",
            "vllm_fleet.bench",
            "--url",
            base,
            "--model",
            exp["served_model_name"],
            "--requests",
            str(action["requests"]),
            "--concurrency",
            str(action["concurrency"]),
            "--duration-s",
            str(action["duration_s"]),
            "--prompt-tokens",
            str(action["prompt_tokens"]),
            "--max-tokens",
            str(action["max_tokens"]),
            "--single-requests",
            str(action["single_requests"]),
            "--decode-ceiling",
            str(exp["planner"]["decode_ceiling_h200"]),
            "--seed",
            "0",
        ]
        out: dict = {"argv": ["python3", *cmd[1:]]}
        env = dict(self.env(), PYTHONPATH=str(REPO / "src"))
        try:
            proc = subprocess.run(
                cmd,
                env=env,
                capture_output=True,
                text=True,
                cwd=str(REPO),
                timeout=min(action.get("timeout_s", 120), max(self.left() - 20, 10)),
            )
            out["returncode"] = proc.returncode
            (folder / f"bench-{action['name']}.json").write_text(proc.stdout, encoding="utf-8")
            if proc.stderr:
                (folder / f"bench-{action['name']}.log").write_text(proc.stderr, encoding="utf-8")
            result = json.loads(proc.stdout or "{}")
        except subprocess.TimeoutExpired:
            out["returncode"] = "timeout"
            return out
        except ValueError:
            return out
        if result.get("load"):
            out["result"] = fleet_summary(result)
            out["preemptions"] = (result.get("server") or {}).get("num_preemptions")
        else:
            out["error"] = result.get("error")
        return out

    def ansible(self, action: dict, exp: dict, folder: Path) -> dict:
        """ansible-playbook PLAYBOOK against this machine (connection local) with the action's vars."""
        adir = folder / action["name"]
        adir.mkdir(parents=True, exist_ok=True)
        cfg = adir / "ansible.cfg"
        cfg.write_text(
            "\n".join(
                [
                    "[defaults]",
                    # the repository as the collection vllm_fleet.fleet (its roles, modules and filters by full name)
                    f"collections_path = {REPO / 'collections'}",
                    "stdout_callback = ansible.builtin.default",
                    "callback_result_format = yaml",
                    "host_key_checking = false",
                    "retry_files_enabled = false",
                    f"local_tmp = {adir / 'tmp'}",
                    "nocolor = true",
                    "",
                ]
            ),
            encoding="utf-8",
        )
        host_vars = dict(action.get("host_vars", {}))
        host_vars.update(ansible_connection="local", ansible_python_interpreter=self.python)
        inventory = {
            "all": {"children": {g: {"hosts": {"gpu-host": host_vars}} for g in action.get("groups", ["vllm_nodes"])}}
        }
        (adir / "inventory.json").write_text(json.dumps(inventory, indent=1), encoding="utf-8")
        env = self.env("ansible")
        env["PYTHONPATH"] = env["PYTHONPATH"] + ":" + str(REPO / "src")
        env.update(ANSIBLE_CONFIG=str(cfg), LC_ALL="C.UTF-8", LANG="C.UTF-8")
        extra = {"vllm_report_dir": str(adir / "reports")}
        extra.update(action.get("extra_vars", {}))
        (adir / "extra_vars.json").write_text(json.dumps(extra), encoding="utf-8")
        bundled = SITE / "ansible" / "bin" / "ansible-playbook"
        if "GPU_HARNESS_ANSIBLE_PLAYBOOK" in os.environ or bundled.exists():
            run = [self.python, os.environ.get("GPU_HARNESS_ANSIBLE_PLAYBOOK", str(bundled))]
        else:  # no bundle: the host's own ansible-playbook
            run = [shutil.which("ansible-playbook") or str(Path(self.python).parent / "ansible-playbook")]
        cmd = [
            *run,
            "-i",
            str(adir / "inventory.json"),
            str(REPO / action["playbook"]),
            "-e",
            "@" + str(adir / "extra_vars.json"),
        ]
        try:
            proc = subprocess.run(
                cmd,
                env=env,
                capture_output=True,
                text=True,
                cwd=str(REPO),
                timeout=min(action.get("timeout_s", 120), max(self.left() - 10, 10)),
            )
            rc, text = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, text = "timeout", (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        (adir / "ansible.log").write_text(text, encoding="utf-8")
        reports = sorted((adir / "reports").glob("*/report.json"))
        out = {
            "returncode": rc,
            "expect": action.get("expect", "pass"),
            "recap": [line for line in text.splitlines() if "ok=" in line and "failed=" in line][-3:],
            "failure": [
                line.strip()[:500]
                for line in text.splitlines()
                if "verification failed" in line or "FAILED!" in line or "fatal:" in line
            ][:6],
        }
        out["as_expected"] = (rc == 0) == (out["expect"] == "pass")
        if reports:
            report = json.loads(reports[-1].read_text())
            out["report"] = report
        return out

    def main(self) -> int:
        try:
            self.results["install"] = self.install()
        except (ValueError, subprocess.CalledProcessError, OSError) as exc:
            self.results["install"] = {"error": str(exc)}
            self.save()
            log(f"install failed: {exc}")
            return 1
        log(f"installed: {self.results['install'].get('vllm_version')}")
        self.results["jit_cache"] = restore_planned_jit_cache(self.plan, self.env())
        log(f"JIT cache: {self.results['jit_cache']}")
        self.results["environment"] = self.environment()
        wrong = card_mismatch(self.plan, self.results["environment"]["nvidia_smi"])
        if wrong:
            self.results["refused"] = wrong
            self.save()
            log(wrong)
            return 2
        self.paths = write_models(self.plan)
        try:
            self.paths.update(write_adapters(self.plan, self.paths))
        except (OSError, subprocess.CalledProcessError) as exc:
            self.results["refused"] = f"building the plan's LoRA adapters failed: {exc} {getattr(exc, 'stderr', '')}"
            self.save()
            log(self.results["refused"])
            return 1
        self.save()
        done_file = WORK / "done.json"
        done = json.loads(done_file.read_text()) if done_file.exists() else {}
        todo = []
        for exp in self.plan["experiments"]:
            if (exp["name"] in done and not self.again) or (self.only and exp["name"] not in self.only):
                continue
            if exp.get("optional") and exp["name"] not in self.only:  # candidates run only when named
                continue
            todo.append(exp)
        # An interleaved search's experiments run together (run_group), where the first of them stands in the plan.
        batches: list[list[dict]] = []
        groups: dict[str, list[dict]] = {}
        for exp in todo:
            key = exp.get("interleave")
            if key and key in groups:
                groups[key].append(exp)
                continue
            batches.append([exp])
            if key:
                groups[key] = batches[-1]
        for batch in batches:
            names = ", ".join(exp["name"] for exp in batch)
            log(f"experiment{'s' if len(batch) > 1 else ''} {names} ({self.left():.0f} s left)")
            try:
                recs = self.run_group(batch) if batch[0].get("interleave") else [self.run_experiment(batch[0])]
            except Exception as exc:  # noqa: BLE001 - keep going: one broken experiment must not lose the others
                recs = [{"name": exp["name"], "status": "harness-error", "reason": repr(exc)} for exp in batch]
            for rec in recs:
                log(
                    f"  -> {rec['name']}: {rec['status']} {rec.get('reason', '')} start {rec.get('start_s')} s "
                    f"kv_tokens {rec.get('cache_config', {}).get('kv_cache_size_tokens')}"
                )
                self.results["experiments"].append(rec)
                if rec["status"] != "skipped" and not rec.get("budget_cut"):  # a later round takes up what did not fit
                    done[rec["name"]] = {"round": self.round, "status": rec["status"]}
                    done_file.write_text(json.dumps(done, indent=1))
            self.save()
        self.results["finished"] = time.time()
        self.save()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("next-round", help="print the number the next run on this host takes")
    j = sub.add_parser("jit-cache-save", help="pack the driver's JIT cache into --out")
    j.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gpu-out")))
    r = sub.add_parser("run")
    r.add_argument("--plan", type=Path, default=HERE / "experiments.json")
    r.add_argument("--round", type=int, default=None, help="default: the next round on this host")
    r.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gpu-out")))
    r.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="stop starting work after this many seconds (default: run the whole plan)",
    )
    r.add_argument("--python", default=sys.executable, help="the Python that runs vLLM (default: this one)")
    r.add_argument(
        "--only",
        default="",
        help="comma-separated experiment names (default: every one not done on this host yet, in the plan's order)",
    )
    r.add_argument(
        "--again",
        action="store_true",
        help="run the plan's experiments (or --only's) once more, as a new round, even those done on this host: "
        "summarize.py pools every round of a setting as its repeats",
    )
    args = parser.parse_args(argv)
    if args.cmd == "next-round":
        print(next_round())
        return 0
    if args.cmd == "jit-cache-save":
        env = dict(os.environ)
        args.out.mkdir(parents=True, exist_ok=True)
        pieces = save_jit_cache(env, args.out)
        log(
            f"JIT cache {jit_cache_mib(env)} MiB packed into {len(pieces)} part(s): "
            + ", ".join(f"{q.name} {q.stat().st_size / 2**20:.1f} MiB" for q in pieces)
        )
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    plan = json.loads(args.plan.read_text())
    only = [n for n in args.only.split(",") if n]
    budget = args.budget_s if args.budget_s is not None else float("inf")
    return Runner(
        plan,
        args.round or next_round(),
        args.out,
        time.time() + budget,
        python=args.python,
        only=only,
        again=args.again,
    ).main()


if __name__ == "__main__":
    sys.exit(main())
