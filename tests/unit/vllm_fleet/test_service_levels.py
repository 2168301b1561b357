"""vllm_fleet.service_levels: the estimate calibrated on the H200 runs, the tuning reference's targets per card, and
the scheduler settings derived from the plan's KV capacity (through planner.plan_host, as the plan shows them)."""

from __future__ import annotations

import pytest

from conftest import H200, L40, RTX4090
from test_planner import plan
from vllm_fleet import planner, service_levels

RUN7 = {"gpu_memory_utilization": 0.15718664}  # the 4090's budget on the H200 (docs/gpu-results.md, run 7)


@pytest.mark.parametrize(
    "overrides, ttft_ms, tolerance",
    [
        ({}, 911.0, 0.01),  # shipped: 8,192 tokens, 64 sequences (a calibration point)
        ({"max_num_seqs": 256, "max_num_batched_tokens": 2048}, 323.0, 0.01),  # vLLM's defaults (the other)
        ({"max_num_seqs": 77, "max_num_batched_tokens": 1152}, 234.2, 0.02),  # derived: not in the fit, within 2 %
    ],
)
def test_service_levels_reproduce_the_h200_run(overrides, ttft_ms, tolerance):
    levels = plan(
        "rtx4090-7b-prefill",
        dict(RUN7, **overrides),
        gpu=H200,
        version="0.26.0",
        vllm_typical_prompt_tokens=1024,
        vllm_typical_output_tokens=512,
    )["service_levels"]
    assert abs(levels["ttft_ms"] - ttft_ms) <= tolerance * ttft_ms
    assert levels["guide"] is None and levels["warnings"] == []  # the tuning reference names no target for an H200


def test_service_levels_decode_rate_is_the_measured_step_at_64_users():
    levels = plan(
        "rtx4090-7b-prefill",
        RUN7,
        gpu=H200,
        version="0.26.0",
        vllm_typical_prompt_tokens=1024,
        vllm_typical_output_tokens=512,
    )["service_levels"]
    assert abs(levels["decode_tokens_per_s_per_user"] - 1000 / 6.33) < 1  # median inter-token gap, run 7


def test_guide_targets_the_4090_profile_misses_are_warned():
    entry = plan("rtx4090-7b-prefill", vllm_typical_prompt_tokens=1024, vllm_typical_output_tokens=512)
    levels = entry["service_levels"]
    assert levels["guide"]["users"] == 64 and levels["guide"]["prompt_tokens"] == 1024
    assert levels["guide"]["ttft_ms"] > 500 and levels["guide"]["decode_tokens_per_s_per_user"] < 35
    ttft, decode = levels["warnings"]
    assert "above the tuning reference's 500 ms" in ttft and "64 users, 1024-token prompts" in ttft
    assert "below the tuning reference's 35-55" in decode
    assert entry["warnings"] == []  # kept apart from the deployment's warnings


def test_the_plan_table_shows_the_guide_targets_missed_apart_from_the_warnings():
    entry = plan("rtx4090-7b-prefill", vllm_typical_prompt_tokens=1024, vllm_typical_output_tokens=512)
    lines = planner.table({"hosts": {"h1": entry}})
    assert [line for line in lines if line.startswith("slo")] == [
        f"slo   {m}" for m in entry["service_levels"]["warnings"]
    ]
    assert entry["service_levels"]["target"] == {
        "card": "RTX 4090",
        "ttft_ms": 500,
        "prompt_tokens": 1024,
        "users": 64,
        "min_tokens_per_s": 35,
        "max_tokens_per_s": 55,
    }
    assert lines[2].rstrip().endswith("ok")  # an estimate does not make the host's status a warning


def test_guide_target_met_gives_no_warning():
    # a card with ten times the 4090's compute and bandwidth (named as the 4090, so the tuning reference's target
    # applies) and the derived scheduler settings of run 7 (one typical prompt per step)
    fast = dict(RTX4090, bandwidth_gb_s=10080, bf16_tflops=1652)
    levels = plan(
        "rtx4090-7b-prefill",
        {"max_num_seqs": 77, "max_num_batched_tokens": 1152},
        gpu=fast,
        vllm_typical_prompt_tokens=1024,
        vllm_typical_output_tokens=512,
    )["service_levels"]
    assert levels["guide"]["ttft_ms"] < 500 and levels["guide"]["decode_tokens_per_s_per_user"] >= 35
    assert levels["warnings"] == []


def test_l40_targets_and_unknown_cards():
    levels = plan("l40-14b-awq-prefill", gpu=L40)["service_levels"]
    assert levels["guide"]["users"] == 128 and levels["guide"]["prompt_tokens"] == 2048
    assert any("above the tuning reference's 800 ms" in w for w in levels["warnings"])
    unknown = dict(RTX4090, name="Some Future GPU")
    assert "service_levels" not in plan("rtx4090-7b-prefill", gpu=unknown)


def test_derived_batching_from_the_kv_capacity_and_the_typical_request():
    kv = plan("rtx4090-7b-prefill", version="0.26.0", vllm_typical_prompt_tokens=1024, vllm_typical_output_tokens=512)[
        "capacity"
    ]
    assert kv["kv_cache_tokens"] == 119_744  # the 4090's bf16 cache, as the plan of run 7 predicted
    assert service_levels.derived_batching(kv["kv_cache_tokens"], 1024, 512) == {
        "max_num_seqs": 77,
        "max_num_batched_tokens": 1152,
    }
    assert service_levels.derived_batching(1536 * 10, 1024, 512, align=1) == {
        "max_num_seqs": 10,
        "max_num_batched_tokens": 1034,
    }
