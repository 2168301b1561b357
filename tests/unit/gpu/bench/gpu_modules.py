"""What the tests of gpu/bench/ share: the harness's modules, loaded from their folder as the GPU host runs
them (not a test file; the project's one conftest.py is tests/unit/conftest.py)."""

from __future__ import annotations

import copy
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


# rtx4090-7b-prefix-heavy as it was shipped until run 12 (2026-12-04): an fp8 cache with its scales, over the settings
# it ships since (a bf16 cache, run 12's choice). The committed plans gpu/bench/experiments.json and
# tune-rtx4090-7b-prefix-heavy-shared.json were written with it, and every run that started the profile until run 12
# ran it: they record what ran and are not rewritten to the bf16 settings, so the tests that keep them in step with
# plan.py build them with the profile as it was then (`as_shipped_until_run12`).
PREFIX_HEAVY_UNTIL_RUN12 = {"kv_cache_dtype": "fp8", "calculate_kv_scales": True}


def as_shipped_until_run12(monkeypatch) -> None:
    """Makes the shipped profiles, for the rest of a test, what they were until run 12: rtx4090-7b-prefix-heavy with
    PREFIX_HEAVY_UNTIL_RUN12 over its settings (the planner and plan.py resolve profiles through profiles._shipped)."""
    shipped = copy.deepcopy(profiles._shipped())
    shipped["rtx4090-7b-prefix-heavy"]["settings"].update(PREFIX_HEAVY_UNTIL_RUN12)
    monkeypatch.setattr(profiles, "_shipped", lambda: shipped)
