"""benchmarks/gpu/parts.py: how the plan packs into rounds of limited time."""

from __future__ import annotations

import pytest

from gpu_modules import plan_mod


def test_schedule_packs_the_plan_as_the_harness_runs_it():
    """plan.schedule: in order, while est_s fits the round (the first also installs); candidates only when named."""
    exps = [{"name": n, "est_s": s, **({"optional": True} if n.startswith("cand") else {})}
            for n, s in (("a", 300), ("b", 200), ("c", 100), ("d", 400), ("cand", 50))]
    packed = plan_mod.schedule(exps, budgets=(550, 560))
    assert packed["rounds"] == [["a", "b"], ["c", "d"]]          # 25 s install: 300 + 200 = 500 <= 525; c waits
    assert packed["experiment_s"] == 1000
    assert packed["gpu_s"] == plan_mod.STAGING_S + plan_mod.INSTALL_S + 2 * plan_mod.PER_ROUND_S + 1000
    assert plan_mod.schedule(exps, only={"cand", "c"})["rounds"] == [["c", "cand"]]
    with pytest.raises(ValueError, match="does not fit"):
        plan_mod.schedule([{"name": "big", "est_s": 900}])
    shipped = plan_mod.schedule(plan_mod.build()["experiments"])
    assert shipped["gpu_s"] < 1800  # the whole plan in 30 minutes of GPU time, by the measured estimates
