"""gpu/bench/plan.py: the experiment plan (vLLM 0.26 arguments and the planner's predictions), kept in step with
the committed experiments.json (written with the profiles as they were until run 12:
gpu_modules.PREFIX_HEAVY_UNTIL_RUN12), and the candidates each run derives in the planner."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpu_modules import GPU, PREFIX_HEAVY_UNTIL_RUN12, ROOT, as_shipped_until_run12, plan_mod, profiles, service_levels


def test_emulated_utilization_gives_the_card_budget():
    util = plan_mod.emulated_utilization(24564, 0.92)
    assert abs(util * 143771 - 24564 * 0.92) < 0.01
    with pytest.raises(ValueError):
        plan_mod.emulated_utilization(200000, 0.9)


def test_plan_renders_0_26_arguments_and_predictions():
    plan = plan_mod.build()
    names = [e["name"] for e in plan["experiments"] if not e.get("optional")]
    assert names[:2] == ["fid-rtx4090-7b-decode", "fid-l40-14b-decode"] and names[-1] == "refuse-rtx4090-7b-decode"
    assert [e["name"] for e in plan["experiments"] if e.get("optional")] == [
        "r7-default-rtx4090-7b",
        "r7-rtx4090-7b-prefill",
        "cand-rtx4090-7b-prefill-derived",
        *plan_mod.RUN8,
        *plan_mod.RUN9,
        "cand-rtx4090-7b-prefix-heavy-kv-auto",
        "cand-l40-14b-awq-prefill-8k",
    ]
    # the JIT cache run 4 saved is named by its SHA-256, outside the tree (.gpu/, built on the host by
    # `run.sh jit-cache save`): no binary is committed
    (part,) = plan["jit_cache"]["parts"]
    assert part.startswith(".gpu/") and len(plan["jit_cache"]["sha256"][Path(part).name]) == 64
    tracked = subprocess.run(["git", "ls-files", part], cwd=ROOT, capture_output=True, text=True, check=True)
    assert tracked.stdout == ""
    assert len(names) == 9 and {e["profile"] for e in plan["experiments"]} >= {
        "rtx4090-7b-decode",
        "rtx4090-7b-prefill",
        "rtx4090-7b-awq",
        "rtx4090-7b-prefix-heavy",
        "l40-14b-decode",
        "l40-14b-awq-prefill",
    }  # every shipped GPU profile
    assert all(
        e["args"][-2:] == ["--attention-config", '{"flash_attn_version": 2}'] or "--attention-config" not in e["args"]
        for e in plan["experiments"]
    )
    assert plan["harness_args"][-2:] == ["--attention-config", '{"flash_attn_version": 2}']  # Ada emulation
    assert plan["environment"]["VLLM_DISABLED_KERNELS"] == "MacheteLinearKernel"
    for exp in plan["experiments"]:
        args = exp["args"]
        assert args[0] == "{model:%s}" % exp["model"]
        util = float(args[args.index("--gpu-memory-utilization") + 1])
        assert util == exp["emulated_utilization"] < 0.35
        assert exp["planner"]["kv_cache_tokens"] > 0
        if exp["profile"] and "calculate_kv_scales" in str(exp["profile"]):
            pass
    refuse = next(e for e in plan["experiments"] if e["name"] == "refuse-rtx4090-7b-decode")
    spec = json.loads(refuse["args"][refuse["args"].index("--speculative-config") + 1])
    assert "use_heterogeneous_vocab" not in spec and refuse["expect_refusal"]
    fixed = plan["experiments"][0]
    assert json.loads(fixed["args"][fixed["args"].index("--speculative-config") + 1])["use_heterogeneous_vocab"] is True
    assert [a["expect"] for a in fixed["actions"]] == ["pass", "fail"]
    default = next(e for e in plan["experiments"] if e["name"] == "default-rtx4090-7b")
    assert "--kv-cache-dtype" not in default["args"] and default["args"][-4:] == [
        "--max-num-seqs",
        "256",
        "--max-num-batched-tokens",
        "2048",
    ]


def test_committed_plan_is_current(monkeypatch):
    """gpu/bench/experiments.json is what plan.py writes today (rerun plan.py after a change to plan.py) from the
    profiles as they were when runs 6 to 9 ran it: rtx4090-7b-prefix-heavy with its fp8 cache, shipped until run 12.
    The plan records what ran; the profile's bf16 settings since then never ran under its experiments' names."""
    committed = json.loads((GPU / "experiments.json").read_text())
    heavy = next(e for e in committed["experiments"] if e["name"] == "fid-rtx4090-7b-prefix-heavy")
    assert heavy["settings"] == profiles.resolve("h", "rtx4090-7b-prefix-heavy", PREFIX_HEAVY_UNTIL_RUN12)
    as_shipped_until_run12(monkeypatch)
    assert committed == json.loads(json.dumps(plan_mod.build()))


def test_run8_plan_derives_its_candidates_in_the_planner(monkeypatch):
    """Run 8's experiments: the L40 side by side (vLLM's defaults for the card, the shipped profile, the setting
    service_levels.derived_batching makes of the shipped profile's KV capacity), then the 4090's, each loaded by
    `vllm bench serve` with the reference's load for the card (rtx4090-7b-prefix-heavy as shipped then, fp8)."""
    as_shipped_until_run12(monkeypatch)
    plan = plan_mod.build()
    exps = {e["name"]: e for e in plan["experiments"]}
    assert all(exps[n].get("optional") for n in plan_mod.RUN8)
    guide, derived = exps["r8-l40-14b-awq-prefill"], exps["cand-l40-14b-awq-prefill-derived"]
    assert (guide["settings"]["max_num_batched_tokens"], guide["settings"]["max_num_seqs"]) == (16384, 128)
    assert (
        derived["overrides"]
        == service_levels.derived_batching(guide["planner"]["kv_cache_tokens"], 1024, 512)
        == {"max_num_seqs": 206, "max_num_batched_tokens": 1280}
    )
    # the derived setting is what the L40 profile ships since run 8
    assert derived["settings"] == profiles.resolve("h", "l40-14b-awq-prefill")
    # the committed run ran the arguments the plan has today
    ran = {
        e["name"]: e
        for e in json.loads(
            (ROOT / "results" / "gpu" / "2026-12-02-run8-side-by-side" / "experiments.json").read_text()
        )["experiments"]
    }
    assert all(ran[n]["args"] == exps[n]["args"] for n in plan_mod.RUN8)
    for name in plan_mod.RUN8:
        (load,) = exps[name]["actions"]
        users = 128 if exps[name]["card"] == "L40" else 64
        assert (load["kind"], load["max_concurrency"], load["num_prompts"], load["input_len"], load["output_len"]) == (
            "bench",
            users,
            2 * users if users == 128 else 192,
            1024,
            512,
        )
    assert exps["r8-default-l40-14b-awq"]["args"][-4:] == ["--max-num-seqs", "256", "--max-num-batched-tokens", "2048"]
    # the L40 side by side comes first and fits, with the install, in the first round
    packed = plan_mod.schedule(plan["experiments"], only=set(plan_mod.RUN8))
    assert packed["rounds"][0] == ["r8-default-l40-14b-awq", "r8-l40-14b-awq-prefill"]


def test_run9_plan_derives_its_candidate_in_the_planner(monkeypatch):
    """Run 9's experiments: vLLM's defaults for the 4090, rtx4090-7b-prefix-heavy as shipped then (its fp8 cache,
    until run 12) and the setting service_levels.derived_batching makes of its KV capacity, each loaded by `vllm bench
    serve` with the 4090's load; the committed run ran the arguments the plan has with the profile as it was then."""
    as_shipped_until_run12(monkeypatch)
    plan = plan_mod.build()
    exps = {e["name"]: e for e in plan["experiments"]}
    assert all(exps[n].get("optional") for n in plan_mod.RUN9)
    heavy, derived = exps["r9-rtx4090-7b-prefix-heavy"], exps["cand-rtx4090-7b-prefix-heavy-derived"]
    assert heavy["settings"] == profiles.resolve("h", "rtx4090-7b-prefix-heavy")
    assert (heavy["settings"]["kv_cache_dtype"], heavy["settings"]["calculate_kv_scales"]) == ("fp8", True)
    assert (
        derived["overrides"]
        == service_levels.derived_batching(heavy["planner"]["kv_cache_tokens"], 1024, 512)
        == {"max_num_seqs": 157, "max_num_batched_tokens": 1280}
    )
    assert exps["r9-default-rtx4090-7b"]["args"] == exps["r8-default-rtx4090-7b"]["args"]
    assert heavy["args"] == exps["r8-rtx4090-7b-prefix-heavy"]["args"]
    ran = {
        e["name"]: e
        for e in json.loads(
            (ROOT / "results" / "gpu" / "2026-12-02-run9-rtx4090-prefix-heavy" / "experiments.json").read_text()
        )["experiments"]
    }
    assert all(ran[n]["args"] == exps[n]["args"] for n in plan_mod.RUN9)
    for name in plan_mod.RUN9:
        (load,) = exps[name]["actions"]
        assert (load["kind"], load["max_concurrency"], load["num_prompts"], load["input_len"], load["output_len"]) == (
            "bench",
            64,
            192,
            1024,
            512,
        )
