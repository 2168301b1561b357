"""gpu/bench/parts.py: how the plan packs into rounds of limited time."""

from __future__ import annotations

import pytest

from gpu_modules import plan_mod


def test_schedule_packs_the_plan_as_the_harness_runs_it():
    """plan.schedule: in order, while est_s fits the round (the first also installs); candidates only when named."""
    exps = [
        {"name": n, "est_s": s, **({"optional": True} if n.startswith("cand") else {})}
        for n, s in (("a", 300), ("b", 200), ("c", 100), ("d", 400), ("cand", 50))
    ]
    packed = plan_mod.schedule(exps, budgets=(550, 560))
    assert packed["rounds"] == [["a", "b"], ["c", "d"]]  # 25 s install: 300 + 200 = 500 <= 525; c waits
    assert packed["experiment_s"] == 1000
    assert packed["gpu_s"] == plan_mod.STAGING_S + plan_mod.INSTALL_S + 2 * plan_mod.PER_ROUND_S + 1000
    assert plan_mod.schedule(exps, only={"cand", "c"})["rounds"] == [["c", "cand"]]
    with pytest.raises(ValueError, match="does not fit"):
        plan_mod.schedule([{"name": "big", "est_s": 900}])
    shipped = plan_mod.schedule(plan_mod.build()["experiments"])
    assert shipped["gpu_s"] < 1800  # the whole plan in 30 minutes of GPU time, by the measured estimates


def test_stage_collects_the_carried_parts_where_the_install_looks(tmp_path):
    """`run.sh stage` runs `parts.py stage` in the host's checkout: each part carried into .gpu/ whose checksum
    matches SHA256SUMS is copied to the harness's bundle folder; a damaged part is named and not copied; the
    parts still missing are listed. Without SHA256SUMS it says what to copy."""
    import hashlib
    import os
    import shutil
    import subprocess
    import sys

    from gpu_modules import GPU, ROOT

    checkout = tmp_path / "checkout"
    shutil.copytree(GPU, checkout / "gpu" / "bench", ignore=shutil.ignore_patterns("*.json", "*part-*"))
    shutil.copytree(
        ROOT / "src" / "vllm_fleet", checkout / "src" / "vllm_fleet", ignore=shutil.ignore_patterns("__pycache__")
    )
    carried = checkout / ".gpu"
    carried.mkdir()
    env = dict(os.environ, GPU_HARNESS_TMP=str(tmp_path / "host"))

    def stage():
        return subprocess.run(
            [sys.executable, str(checkout / "gpu" / "bench" / "parts.py"), "stage"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )

    missing_sums = stage()
    assert missing_sums.returncode == 1 and "no .gpu/SHA256SUMS" in missing_sums.stderr + missing_sums.stdout
    contents = {"part-00": b"first", "part-01": b"second", "part-02": b"third"}
    (carried / "SHA256SUMS").write_text("".join(f"{hashlib.sha256(v).hexdigest()}  {k}\n" for k, v in contents.items()))
    (carried / "part-00").write_bytes(b"first")
    (carried / "part-01").write_bytes(b"damaged")
    done = stage()
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    staged = tmp_path / "host" / "gpu-bundle" / "parts"
    assert sorted(p.name for p in staged.iterdir()) == ["part-00"] and (staged / "part-00").read_bytes() == b"first"
    assert "part-01 (checksum mismatch, not staged)" in said and "missing: ['part-01', 'part-02']" in said
