"""What the tests of gpu/bench/ share: the harness's modules, loaded from their folder as the GPU host runs
them (not a test file; the project's one conftest.py is tests/unit/conftest.py)."""

from __future__ import annotations

from pathlib import Path

from conftest import load_source

ROOT = Path(__file__).resolve().parents[4]
GPU = ROOT / "gpu" / "bench"
METRICS_026 = ROOT / "tests" / "unit" / "fixtures" / "vllm" / "0.26.0-cuda-h200" / "metrics_fp8_kv_after_bench.txt"


def load(name: str):
    """gpu/bench/<name>.py, with its folder on sys.path while it loads (it imports its siblings)."""
    return load_source(f"gpu_{name}", GPU / f"{name}.py", beside=GPU)


bundle = load("bundle")
harness = load("harness")
plan_mod = load("plan")
planner, profiles, service_levels = plan_mod.planner, plan_mod.profiles, plan_mod.service_levels
