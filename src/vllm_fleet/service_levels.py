"""Service levels: what a user would see, estimated from the card's compute and bandwidth with the efficiencies
the H200's measured figures give (CALIBRATION), against the tuning reference's targets per card (GUIDE_TARGETS).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, TypedDict, TypeVar

from . import catalogue
from .sizing import Sizing

# --- service levels: what a user would see, estimated from the card's compute and bandwidth -------------
# Dense bf16/fp16 tensor TFLOP/s (FP32 accumulate, as vLLM's GEMMs run), by card name; `vllm_gpu.bf16_tflops`
# overrides. A card not listed gets no estimate.
GPU_BF16_TFLOPS = (
    (re.compile(r"\bRTX 4090\b", re.I), 165.2),
    (re.compile(r"\bL40S\b", re.I), 362.0),
    (re.compile(r"\bL40\b", re.I), 181.0),
    (re.compile(r"\bH(100|200)\b", re.I), 989.4),
)


# The tuning reference's promise per card: TTFT under ttft_ms for prompts under prompt_tokens at `users`
# concurrent users, and at least min_tokens_per_s (up to max_tokens_per_s) of decode per user.
GUIDE_TARGETS: tuple[tuple[re.Pattern[str], dict[str, Any]], ...] = (
    (
        re.compile(r"\bRTX 4090\b", re.I),
        {
            "card": "RTX 4090",
            "ttft_ms": 500,
            "prompt_tokens": 1024,
            "users": 64,
            "min_tokens_per_s": 35,
            "max_tokens_per_s": 55,
        },
    ),
    (
        re.compile(r"\bL40\b", re.I),
        {
            "card": "L40",
            "ttft_ms": 800,
            "prompt_tokens": 2048,
            "users": 128,
            "min_tokens_per_s": 25,
            "max_tokens_per_s": 40,
        },
    ),
)


# Calibration: run 7 on an H200 host (2026-12-01, vLLM 0.26.0, Qwen2.5-7B bf16 on the 4090's memory budget,
# 64 users x 1,024 + 512 tokens, `vllm bench serve`; docs/gpu-results.md, "Run 7"). A prefill step of B tokens
# (the median stalled inter-token gap) took 52.4 ms at 2,048 and 181.0 ms at 8,192 (33.3 at 1,152): t(B) =
# 9.53 ms + B x 0.020931 ms. The steady-state TTFT (the median of the requests sent after the first 64) was
# 323.0 ms at 2,048 and 911.0 at 8,192: TTFT = 83.4 ms + 4.572 x t(B) (1,152: 237.2 estimated, 234.2
# measured). The decode step (the median inter-token gap) at 64 sequences: 6.33 ms.
class _Calibration(TypedDict):
    gpu_tflops: float
    bandwidth_gb_s: float
    model: str
    dtype_bytes: int
    step_token_ms: float
    step_fixed_ms: float
    ttft_fixed_ms: float
    ttft_steps: float
    decode_step_ms: float
    decode_seqs: int
    decode_context_tokens: int


CALIBRATION: _Calibration = {
    "gpu_tflops": 989.4,
    "bandwidth_gb_s": 4800,
    "model": "Qwen/Qwen2.5-7B-Instruct",
    "dtype_bytes": 2,
    "step_token_ms": 0.020931,
    "step_fixed_ms": 9.53,
    "ttft_fixed_ms": 83.4,
    "ttft_steps": 4.572,
    "decode_step_ms": 6.33,
    "decode_seqs": 64,
    "decode_context_tokens": 1024 + 512 // 2,
}


@lru_cache(maxsize=1)
def efficiencies() -> dict[str, float]:
    """The shares of peak compute and bandwidth the H200's measured figures (CALIBRATION) reached: compute in
    prefill (2 x linear parameters FLOPs per token), the bandwidth of a prefill step's fixed part (one read of
    the weights) and of a decode step (the weights plus every sequence's KV cache)."""
    c = CALIBRATION
    arch = catalogue.lookup(c["model"])
    weights = arch.weight_bytes(c["dtype_bytes"])
    ideal_token_ms = 2 * arch.linear_params() / (c["gpu_tflops"] * 1e12) * 1e3
    weights_ms = weights / (c["bandwidth_gb_s"] * 1e9) * 1e3
    kv = c["decode_seqs"] * c["decode_context_tokens"] * arch.kv_bytes_per_token(c["dtype_bytes"])
    return {
        "compute": ideal_token_ms / c["step_token_ms"],
        "step_bandwidth": weights_ms / c["step_fixed_ms"],
        "decode_bandwidth": (weights + kv) / (c["bandwidth_gb_s"] * 1e9) * 1e3 / c["decode_step_ms"],
    }


def derived_batching(kv_cache_tokens: int, prompt_tokens: int, output_tokens: int, align: int = 128) -> dict[str, int]:
    """Scheduler settings from the plan's numbers: max_num_seqs, the requests of the typical length (prompt +
    answer) that the KV cache holds at once (more would preempt); max_num_batched_tokens, one typical prompt
    plus one decode token for each of those sequences, rounded up to `align`, so that a step admits about one
    prompt: a decode step is stalled by at most one prompt's prefill and a new prompt waits for no larger
    batch than its own. Measured in run 7 (docs/gpu-results.md): the interactive trade-off against vLLM's
    defaults (lower median TTFT and p99 inter-token latency, higher p99 TTFT, 3 % less throughput)."""
    seqs = kv_cache_tokens // (prompt_tokens + output_tokens)
    tokens = -(-(prompt_tokens + seqs) // align) * align
    return {"max_num_seqs": seqs, "max_num_batched_tokens": tokens}


_Value = TypeVar("_Value")


def match_card(table: Iterable[tuple[re.Pattern[str], _Value]], gpu: Mapping[str, Any]) -> _Value | None:
    return next((value for pattern, value in table if pattern.search(str(gpu.get("name", "")))), None)


def service_levels(s: Sizing, users: int | None = None, prompt_tokens: int | None = None) -> dict[str, Any] | None:
    """Estimated TTFT (ms) of a prompt of prompt_tokens (default: the typical one) in steady state at `users`
    concurrent users (default: max_num_seqs; at most max_num_seqs), and decode tokens/s per user, from the
    card's compute and bandwidth with the H200's efficiencies; None where the card's compute is unknown."""
    tflops = s.gpu.get("bf16_tflops") or match_card(GPU_BF16_TFLOPS, s.gpu)
    if s.device != "gpu" or not tflops or not s.gpu.get("bandwidth_gb_s"):
        return None
    eff, cal = efficiencies(), CALIBRATION
    users = min(users or s.seqs, s.seqs)
    prompt = prompt_tokens or s.prompt_tokens
    compute = tflops * 1e12 * s.tp
    bandwidth = s.gpu["bandwidth_gb_s"] * 1e9 * s.tp
    weights = s.weights + s.draft_weights
    token_ms = 2 * s.arch.linear_params() / (compute * eff["compute"]) * 1e3
    fixed_ms = weights / (bandwidth * eff["step_bandwidth"]) * 1e3
    step_tokens = min(s.budget, users * prompt)  # a step holds no more than what is waiting
    step_ms = fixed_ms + step_tokens * token_ms
    ttft_ms = cal["ttft_fixed_ms"] + cal["ttft_steps"] * step_ms
    context = prompt + s.output_tokens // 2
    decode_ms = (weights + users * context * s.kv_per_token) / (bandwidth * eff["decode_bandwidth"]) * 1e3
    return {
        "users": users,
        "prompt_tokens": prompt,
        "ttft_ms": round(ttft_ms, 1),
        "prefill_step_ms": round(step_ms, 1),
        "decode_tokens_per_s_per_user": round(1000 / decode_ms, 1),
        "calibration": "H200, run 7 (docs/gpu-results.md)",
    }


def misses_target(s: Sizing) -> list[str]:
    """The tuning reference's promise for the card (GUIDE_TARGETS) against service_levels at its load."""
    target = match_card(GUIDE_TARGETS, s.gpu)
    if not (target and s.fits):
        return []
    est = service_levels(s, target["users"], target["prompt_tokens"])
    if not est:
        return []
    out = []
    where = (
        f"{target['users']} users"
        + (f" (max_num_seqs={s.seqs})" if s.seqs < target["users"] else "")
        + f", {target['prompt_tokens']}-token prompts"
    )
    if est["ttft_ms"] > target["ttft_ms"]:
        out.append(
            f"{s.host}: estimated TTFT {est['ttft_ms']:,.0f} ms on {s.gpu['name']} at {where}, above the "
            f"tuning reference's {target['ttft_ms']} ms (prefill steps of {est['prefill_step_ms']:,.0f} ms); "
            "fix: fewer users per card, a smaller max_num_batched_tokens, shorter prompts or a faster card"
        )
    if est["decode_tokens_per_s_per_user"] < target["min_tokens_per_s"]:
        out.append(
            f"{s.host}: estimated decode {est['decode_tokens_per_s_per_user']:.1f} tokens/s per user on "
            f"{s.gpu['name']} at {where}, below the tuning reference's {target['min_tokens_per_s']}-"
            f"{target['max_tokens_per_s']}; fix: fewer users per card, a quantized model or fp8 KV cache"
        )
    return out
