"""The planner's rules, as two lists: ERROR_RULES (vLLM would refuse to start, or the tuning reference forbids it)
and WARNING_RULES (it runs, not as the tuning reference intends), each a small function of a
:class:`vllm_fleet.sizing.Sizing` that returns its messages; and the known crashes of data/known_failures.yml,
which run between the two lists on GPU hosts. Every message names the host, the numbers and a fix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from . import catalogue, datafiles
from .sizing import Sizing, gib, gpu_is, is_ada

MAX_UTILIZATION = 0.95
SPECULATION_MAX_SEQS = 32


@lru_cache(maxsize=1)
def known_failures() -> list[dict[str, Any]]:
    """Starts that crashed on real hardware (data/known_failures.yml)."""
    failures: list[dict[str, Any]] = datafiles.load("known_failures.yml")
    return failures


def runs_in_float16(arch: catalogue.Architecture, dtype: Any) -> bool:
    if dtype in (None, "auto"):
        return arch.quant_method in ("awq", "gptq") or arch.torch_dtype == "float16"
    return dtype in ("float16", "half")


def known_failure(
    host: str,
    gpu: Mapping[str, Any],
    version: str,
    arch: catalogue.Architecture,
    profile: Mapping[str, Any],
    extra: Mapping[str, Any],
) -> tuple[list[str], list[str]]:
    """(errors, warnings) for the known crashes this host would meet."""
    errors: list[str] = []
    warnings: list[str] = []
    kv = profile.get("kv_cache_dtype", "auto")
    for failure in known_failures():
        if not gpu_is(gpu, failure["compute_cap"], failure["gpu_name"]):
            continue
        if failure["model_dtype"] == "float16" and not runs_in_float16(arch, profile.get("dtype")):
            continue
        if kv not in failure["kv_cache_dtype"]:
            continue
        avoided = failure.get("avoided_by") or {}
        if avoided and all(_subset(want, extra.get(key)) for key, want in avoided.items()):
            continue
        text = (
            f"{host}: {profile['model']} runs in float16 with kv_cache_dtype={kv} on {gpu['name']}: vLLM "
            f"{', '.join(failure['seen_on'])} crashed at start in {failure['where']}: "
            f'"{" ".join(failure["vllm_said"].split())}"; fix: {" ".join(failure["fix"].split())}'
        )
        if version in failure["seen_on"]:
            errors.append(text)
        else:
            warnings.append(text.replace(" crashed at start", f" (not tried with {version}) crashed at start", 1))
    return errors, warnings


def _subset(want: Any, have: Any) -> bool:
    """`want` is contained in `have` (a mapping, or its JSON text as vllm_extra_args may give it)."""
    if isinstance(have, str):
        try:
            have = json.loads(have)
        except ValueError:
            return False
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(_subset(v, have.get(k)) for k, v in want.items())
    same: bool = want == have
    return same


# --- errors: vLLM would refuse to start, or the tuning reference forbids it ------------------------------------------
def _above_max_utilization(s: Sizing) -> list[str]:
    if s.util <= MAX_UTILIZATION:
        return []
    return [
        f"{s.host}: gpu_memory_utilization={s.util} is above {MAX_UTILIZATION}: the tuning reference's limit (the CUDA "
        f"context, fragmentation and other processes need the rest); fix: 0.90-0.95"
    ]


def _does_not_fit(s: Sizing) -> list[str]:
    """The KV cache does not fit, or holds less than one sequence of max_model_len (one message at most)."""
    if not s.fits and s.device == "cpu":
        return [
            f"{s.host}: the KV cache of {gib(s.kv_bytes)} ({s.explicit_name}) exceeds {s.limit_text}; fix: lower "
            f"{s.explicit_name} or raise vllm_gpu.memory_mib to the memory the host can give vLLM's KV cache"
        ]
    if not s.fits:
        # Per GPU (the same as the totals on one card): what each worker of the group holds.
        draft_text = f" + draft {gib(-(-s.draft_weights // s.draft_tp))}" if s.draft else ""
        kv_gpu = s.kv_bytes // s.tp
        return [
            f"{s.host}: {s.model} does not fit: {s.limit_text}; "
            + ("per GPU: " if s.tp > 1 else "")
            + f"weights {gib(-(-s.weights // s.tp))}{draft_text} + "
            f"activations {gib(s.activation // s.tp)} + runtime {gib(s.runtime // s.tp)}"
            + (f" + LoRA slots {gib(s.lora_bytes // s.tp)}" if s.lora_bytes else "")
            + (
                f" + KV cache {gib(kv_gpu)} = {gib(s.others_gpu + kv_gpu)}"
                if s.explicit_kv is not None
                else f" leave {gib(kv_gpu)} for the KV cache"
            )
            + "; fix: "
            + (s.fit_hint + ", or " if s.fit_hint else "")
            + "a quantized checkpoint (AWQ), a smaller model or no draft, more GPUs "
            "(tensor_parallel_size), or a lower max_num_batched_tokens"
            + (
                f", or fewer or smaller LoRA slots (vllm_lora_max_loras={s.lora_slots}, "
                f"vllm_lora_max_rank={s.lora_rank})"
                if s.lora_bytes
                else ""
            )
        ]
    if s.max_len and s.kv_tokens < s.max_len:
        return [
            f"{s.host}: the KV cache holds {s.kv_tokens:,} tokens ({gib(s.kv_bytes)} at {s.kv_per_token:,} "
            f"B/token), below max_model_len={s.max_len:,}: vLLM refuses to start; fix: max_model_len <= "
            f"{s.kv_tokens:,}, {s.fp8_fix}a quantized checkpoint or a higher gpu_memory_utilization"
            + (
                f", or fewer or smaller LoRA slots (vllm_lora_max_loras={s.lora_slots}, "
                f"vllm_lora_max_rank={s.lora_rank}: {gib(s.lora_bytes // s.tp)} per GPU)"
                if s.lora_bytes and s.device == "gpu" and s.explicit_kv is None
                else ""
            )
            + (f", or {s.fit_hint}" if s.fit_hint.startswith("the smallest") else "")
        ]
    return []


def _draft_vocabulary_differs(s: Sizing) -> list[str]:
    if not s.draft or s.draft.vocab_size == s.arch.vocab_size or s.spec.get("use_heterogeneous_vocab"):
        return []
    return [
        f"{s.host}: draft model {s.spec['model']} has vocab_size={s.draft.vocab_size:,}, the target {s.model} "
        f'{s.arch.vocab_size:,}: vLLM refuses to start ("Target and draft model should have the same vocabulary '
        f'size", seen with vLLM 0.26.0); fix: speculative.use_heterogeneous_vocab: true (vLLM maps the shared '
        "tokens, greedy drafts), a draft with the same vocab_size, or speculative: null"
    ]


def _max_len_above_positions(s: Sizing) -> list[str]:
    positions = s.arch.max_position_embeddings
    if not positions or s.profile.get("max_model_len", 0) <= positions:
        return []
    return [
        f"{s.host}: max_model_len={s.profile['max_model_len']:,} exceeds {s.model}'s max_position_embeddings="
        f"{positions:,}: vLLM refuses it; fix: max_model_len <= {positions:,}"
    ]


def _long_prompts_never_scheduled(s: Sizing) -> list[str]:
    if not (s.max_len and s.budget < s.max_len and not s.chunked):
        return []
    return [
        f"{s.host}: max_num_batched_tokens={s.budget:,} < max_model_len={s.max_len:,} with chunked prefill off: a "
        f"prompt longer than {s.budget:,} tokens can never be scheduled; fix: enable_chunked_prefill: true "
        f"or max_num_batched_tokens >= {s.max_len:,}"
    ]


# --- warnings: it runs, but not as the tuning reference intends -------------------------------------------------------
def _speculation_in_large_batches(s: Sizing) -> list[str]:
    if not (s.spec and s.seqs > SPECULATION_MAX_SEQS):
        return []
    return [
        f"{s.host}: speculative decoding with max_num_seqs={s.seqs} (> {SPECULATION_MAX_SEQS}): in large batches "
        "decoding is compute-bound and drafts cost more than they save; fix: max_num_seqs <= 32 or "
        "speculative: null"
    ]


def _budget_never_fills(s: Sizing) -> list[str]:
    filled = s.seqs * s.prompt_tokens
    if filled >= s.budget:
        return []
    return [
        f"{s.host}: max_num_seqs={s.seqs} x typical prompt {s.prompt_tokens} tokens = {filled:,} < "
        f"max_num_batched_tokens={s.budget:,}: the token budget never fills; fix: max_num_seqs >= "
        f"{-(-s.budget // s.prompt_tokens)} or max_num_batched_tokens = {filled:,}"
    ]


def _expect_preemptions(s: Sizing) -> list[str]:
    if not (s.fits and s.kv_tokens < s.seqs * s.typical):
        return []
    return [
        f"{s.host}: the KV cache holds {s.kv_tokens:,} tokens, less than max_num_seqs={s.seqs} requests of "
        f"typical length {s.typical} ({s.prompt_tokens} prompt + {s.output_tokens} output) = "
        f"{s.seqs * s.typical:,}: expect preemptions; fix: max_num_seqs <= {s.kv_tokens // s.typical}, "
        f"{s.fp8_fix}" + ("a quantized model or no draft model" if s.draft else "or a quantized model")
    ]


def _fp8_buys_nothing_on_ada(s: Sizing) -> list[str]:
    """fp8 KV on Ada: vLLM 0.26 has no FlashAttention path for it there and runs it on Triton attention
    (FlashInfer where installed). Measured (docs/gpu-results.md, fourth run): rtx4090-7b-prefill at 64 users x
    1,536 tokens gave 8.4 % less output throughput with fp8 than with bf16 on FlashAttention 2. Where the bf16
    cache holds max_num_seqs typical requests, fp8 buys nothing for that cost. Measured for bf16 models without
    a draft."""
    if not (
        s.device == "gpu"
        and s.fits
        and s.kv_elem == 1
        and not s.draft
        and s.act_bytes == 2
        and not runs_in_float16(s.arch, s.profile.get("dtype"))
        and is_ada(s.gpu)
    ):
        return []
    wide_tokens = max(s.kv_bytes, 0) // s.arch.kv_bytes_per_token(s.act_bytes, s.tp) // s.block * s.block
    if wide_tokens < s.seqs * s.typical:
        return []
    return [
        f"{s.host}: kv_cache_dtype={s.kv_dtype} buys no capacity here: a {s.act_bytes * 8}-bit cache would hold "
        f"{wide_tokens:,} tokens, enough for max_num_seqs={s.seqs} requests of typical length {s.typical} "
        f"({s.seqs * s.typical:,}); on {s.gpu['name']} (Ada) vLLM runs an fp8 cache on Triton attention, which "
        "cost 8.4 % output throughput against bf16 on FlashAttention 2 (rtx4090-7b-prefill, "
        "docs/gpu-results.md); fix: kv_cache_dtype: auto (calculate_kv_scales: null), or keep fp8 for "
        f"more than {wide_tokens // s.typical} such requests"
    ]


# The rules, in the order their messages appear. The known failures of data/known_failures.yml run between
# the two lists (GPU hosts only).
ERROR_RULES = (
    _above_max_utilization,
    _does_not_fit,
    _draft_vocabulary_differs,
    _max_len_above_positions,
    _long_prompts_never_scheduled,
)
WARNING_RULES = (_speculation_in_large_batches, _budget_never_fills, _expect_preemptions, _fp8_buys_nothing_on_ada)
