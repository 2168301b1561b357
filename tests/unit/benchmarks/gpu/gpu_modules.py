"""What the tests of benchmarks/gpu/ share: the harness's modules, loaded from their folder as the GPU host runs
them (not a test file; the project's one conftest.py is tests/unit/conftest.py)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
GPU = ROOT / "benchmarks" / "gpu"
METRICS_026 = ROOT / "tests" / "unit" / "fixtures" / "vllm" / "0.26.0-cuda-h200" / "metrics_fp8_kv_after_bench.txt"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", GPU / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(GPU))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(GPU))
    return module


bundle = load("bundle")
harness = load("harness")
plan_mod = load("plan")
planner, profiles, service_levels = plan_mod.planner, plan_mod.profiles, plan_mod.service_levels
