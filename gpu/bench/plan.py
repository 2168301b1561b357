#!/usr/bin/env python3
"""Write gpu/bench/experiments.json: what the GPU benchmark runs, decided on the controller.

    gpu/bench/plan.py [--out gpu/bench/experiments.json] [--host-gpu NAME,MIB,GB_S]

--host-gpu names the GPU the plan will run on, as nvidia-smi reports its memory (default: the H200 of
the committed plan, "H200,143771,4800"); experiments for a card larger than it are left out.

Every serve argument comes from the project's own renderer for vLLM 0.26.0 (the release the H200
host runs), every prediction from the project's planner with vllm_gpu set to the emulated card, so the
file is the exact record of what ran and what the planner promised. An RTX 4090 (24,564 MiB) or L40
(46,068 MiB) is emulated on the H200 (143,771 MiB) by its memory budget:

    gpu_memory_utilization(H200) = card MiB x profile utilization / 143,771

which gives vLLM the same ceil(total x utilization) budget it would have on the card. Bandwidth and
compute stay the H200's. Both cards are Ada (compute capability 8.9), so the H200 is also made to pick
the kernels vLLM 0.26 picks on Ada: FlashAttention 2 (`--attention-config {"flash_attn_version": 2}`;
Hopper's default is FlashAttention 3, which has no float16-model + fp8-KV path: it crashed the AWQ
profile in graph capture), which for an fp8 KV cache sends vLLM down its backend list to Triton
attention as on Ada (a real Ada host with flashinfer installed gets FlashInfer there; the bundle has
no flashinfer), and Marlin for AWQ (`VLLM_DISABLED_KERNELS=MacheteLinearKernel`: Machete needs
compute capability 9.0).

Experiments run in the listed order; a round with a time budget skips one that no longer fits and the
next round takes it up (priority: fidelity of the decode profiles with the verification, the AWQ profile, then
each card's tuned profile against vLLM's defaults with single-stream decode, then the refusal).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "src"))

sys.path.insert(0, str(HERE))
from parts import INSTALL_S, PER_ROUND_S, STAGING_S, schedule  # noqa: E402,F401  (gpu/bench/parts.py)
from vllm_fleet import catalogue, planner, profiles, render, service_levels, tune  # noqa: E402

VLLM_VERSION = "0.26.0"
DATE = "2026-11-29"
H200 = {"name": "H200", "memory_mib": 143771, "bandwidth_gb_s": 4800, "count": 1}
CARDS = {
    "RTX 4090": {"name": "RTX 4090", "memory_mib": 24564, "bandwidth_gb_s": 1008, "count": 1},
    "L40": {"name": "L40", "memory_mib": 46068, "bandwidth_gb_s": 864, "count": 1},
}
# vLLM 0.26 defaults on a GPU under 70 GiB for the API server (engine/arg_utils.py get_batch_defaults)
# and its CacheConfig default utilization; a run "with vLLM's defaults" sets these explicitly because
# the H200 itself would get the large-GPU defaults (8192 tokens, 1024 sequences).
VLLM_DEFAULTS = {"gpu_memory_utilization": 0.92, "max_num_batched_tokens": 2048, "max_num_seqs": 256}
ENVIRONMENT = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",  # the bundle has no flashinfer
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "VLLM_DISABLED_KERNELS": "MacheteLinearKernel",  # Ada emulation: AWQ on Marlin, as on an RTX 4090 or L40
    # vLLM 0.26's FlashAttention 2 library holds sm_80 code only, which the driver JIT-compiles on the
    # H200 (sm_90): 43-52 s at the first FULL CUDA graph and ~70 s of warm-up in every bf16 or fp16 start
    # of run 3, none of it on an Ada card (sm_89 runs sm_80 code). With the driver's JIT cache at its 4 GiB
    # maximum run 4 kept it between starts: vLLM's bf16 defaults started in 102 s after a bf16 start had
    # filled it, 252-274 s without it. See JIT_CACHE.
    "CUDA_CACHE_MAXSIZE": "4294967296",
}
# The driver's JIT cache as run 4 on the H200 left it (`run.sh jit-cache save`: 123.9 MiB holding
# FlashAttention 2 compiled for sm_90 in bf16 and fp16, driver 580.159.04, vLLM 0.26.0). The harness unpacks
# it into the driver's cache folder before the first start, so no start on a fresh H200 pays the JIT (run 5:
# FULL CUDA graphs of a bf16 start in 4 s, 139 s without it); any other GPU, driver or vLLM misses it and
# simply compiles (the driver keys its cache by all three).
JIT_CACHE = {
    "parts": [".gpu/h200-jit-cache.part-00"],
    "sha256": {"h200-jit-cache.part-00": "d9a5a24da748d922cabef05e96be27a76dcbe66e8ec170167b5d48178d71c84f"},
}
# Ada emulation: FlashAttention 2, and with it Ada's choice of attention backend (see the docstring).
ADA_ATTENTION = ["--attention-config", '{"flash_attn_version": 2}']
HARNESS_ARGS = ["--load-format", "dummy", "--tokenizer", "{tokenizer}", "--host", "127.0.0.1", *ADA_ATTENTION]


# Loads: the project's own load generator (src/vllm_fleet/bench.py, what playbooks/benchmark.yml runs on
# a host; stdlib, so a load starts at once where `vllm bench serve` first imports vLLM for ~20 s). Random
# prompt token ids of an exact length, answers of exactly max_tokens (ignore_eos), TTFT and inter-token
# latency from the streamed chunks, preemptions from /metrics; optional single-stream requests first (the
# decode rate 1 / mean ITL). Bounded in requests and time. Runs 1 and 2 used `vllm bench serve`
# (kind "bench", still supported by the harness).
def fleet_load(
    name: str, prompt_tokens: int, max_tokens: int, requests: int, users: int, single: int, est_s: int
) -> dict:
    return {
        "kind": "fleet",
        "name": name,
        "prompt_tokens": prompt_tokens,
        "max_tokens": max_tokens,
        "requests": requests,
        "concurrency": users,
        "single_requests": single,
        "duration_s": 120,
        "timeout_s": 150,
        "est_s": est_s,
    }


SINGLE = fleet_load("single-stream", 128, 256, 1, 1, 3, est_s=15)


def reference_load(users: int, prompts: int, single: int = 0) -> dict:
    """The tuning reference's load (named "guide-<users>u"): many concurrent users, ~1K-token prompts,
    ~512-token answers (after `single` single-stream requests of the same size)."""
    return fleet_load(f"guide-{users}u", 1024, 512, prompts, users, single, est_s=15 + prompts // 5 + 5 * single)


# Run 7's load: the same traffic through `vllm bench serve` (a client the project did not write), with
# --save-detailed so that the result keeps every request's TTFT and start (the harness reduces them to the
# first wave's and the later waves' TTFT and the share of stalled inter-token gaps, then drops the arrays).
def bench_load(users: int, prompts: int, est_s: int = 45) -> dict:
    return {
        "kind": "bench",
        "name": f"guide-{users}u-bench",
        "input_len": 1024,
        "output_len": 512,
        "num_prompts": prompts,
        "max_concurrency": users,
        "save_detailed": True,
        "timeout_s": 150,
        "est_s": est_s,
    }


# Run 8's experiments, in the order they run (`run.sh run --only` with these names; see build()).
RUN8 = (
    "r8-default-l40-14b-awq",
    "r8-l40-14b-awq-prefill",
    "cand-l40-14b-awq-prefill-derived",
    "r8-default-rtx4090-7b",
    "cand-rtx4090-7b-prefill-seqs",
    "r8-rtx4090-7b-prefix-heavy",
    "r8-default-rtx4090-7b-awq",
    "r8-rtx4090-7b-awq",
)
# Run 9's: the one profile without speculation run 8 left out, beside vLLM's defaults in the same run, then (only
# when the round has time for it) the setting service_levels.derived_batching makes of that profile's KV capacity.
RUN9 = ("r9-default-rtx4090-7b", "r9-rtx4090-7b-prefix-heavy", "cand-rtx4090-7b-prefix-heavy-derived")


def emulated_utilization(card_mib: int, utilization: float, host_mib: int = H200["memory_mib"]) -> float:
    """The H200 utilization that gives vLLM the card's budget (card MiB x utilization)."""
    if not 0 < utilization <= 1 or card_mib <= 0 or card_mib > host_mib:
        raise ValueError(f"cannot emulate {card_mib} MiB x {utilization} on {host_mib} MiB")
    return round(card_mib * utilization / host_mib, 8)


def placeholder(model_id: str) -> str:
    return "{model:%s}" % model_id


def _plan(host: str, profile_name: str | None, profile: dict, gpu: dict) -> dict:
    hostvars = {
        "vllm_profile_name": profile_name,
        "vllm_profile": profile,
        "vllm_gpu": gpu,
        "vllm_version": VLLM_VERSION,
        "vllm_typical_prompt_tokens": 1024,
        "vllm_typical_output_tokens": 512,
    }
    return planner.plan_host(host, hostvars)


def experiment(
    name: str,
    card: str,
    profile_name: str | None,
    overrides: dict | None = None,
    actions: list | None = None,
    est_s: int = 120,
    expect_refusal: bool = False,
    note: str = "",
    host: dict = H200,
) -> dict:
    """One vLLM start: the profile (shipped, plus overrides) on the emulated card. A card larger than the
    host gives a record marked `left_out` (build drops it)."""
    overrides = copy.deepcopy(overrides or {})
    gpu = CARDS[card]
    if gpu["memory_mib"] > host["memory_mib"]:
        return {
            "name": name,
            "card": card,
            "actions": [],
            "emulated_utilization": None,
            "left_out": f"the {card} ({gpu['memory_mib']:,} MiB) does not fit on the {host['name']}",
        }
    profile = profiles.resolve(name, profile_name, overrides)
    util = profile.get("gpu_memory_utilization", VLLM_DEFAULTS["gpu_memory_utilization"])
    emulated = emulated_utilization(gpu["memory_mib"], util, host["memory_mib"])
    # The planner sees the card; vLLM sees the host with the card's budget.
    plan_card = _plan(name, profile_name, overrides, gpu)
    served = dict(profile, gpu_memory_utilization=emulated)
    draft = (profile.get("speculative") or {}).get("model")
    rendered = render.render_args(
        served,
        VLLM_VERSION,
        model_path=placeholder(profile["model"]),
        draft_model_path=placeholder(draft) if draft else None,
    )
    capacity = plan_card["capacity"]
    # The decode ceiling on the machine that runs it: the planner with the host's bandwidth ("_h200": the
    # key's name since the first plan, which ran there).
    plan_h200 = _plan(name, profile_name, dict(overrides, gpu_memory_utilization=emulated), host)
    return {
        "name": name,
        "card": card,
        "profile": profile_name,
        "overrides": overrides,
        "note": note,
        "settings": profile,  # the profile as resolved today: summarize replans with it after profiles change
        "model": profile["model"],
        "draft": draft,
        "served_model_name": profile.get("served_model_name") or profile["model"],
        "utilization": util,
        "emulated_utilization": emulated,
        "args": rendered.args,
        "dropped": rendered.dropped,
        "render_warnings": rendered.warnings,
        "planner": {
            "errors": plan_card["errors"],
            "warnings": plan_card["warnings"],
            "kv_cache_tokens": capacity["kv_cache_tokens"],
            "kv_cache_bytes": capacity["kv_cache_bytes"],
            "kv_bytes_per_token": capacity["kv_bytes_per_token"],
            "weights_bytes": capacity["weights_bytes"],
            "draft_weights_bytes": capacity["draft_weights_bytes"],
            "estimates": plan_card.get("estimates"),
            "decode_ceiling_card": capacity["decode_ceiling_tokens_per_s"],
            "decode_ceiling_h200": plan_h200["capacity"]["decode_ceiling_tokens_per_s"],
            "kv_cache_tokens_h200_plan": plan_h200["capacity"]["kv_cache_tokens"],
        },
        "expect_refusal": expect_refusal,
        "actions": actions or [],
        "est_s": est_s,
    }


def verify_actions(exp_name: str, profile_name: str, emulated: float, draft: bool, host: dict = H200) -> list[dict]:
    """The verify playbook against the running server: as the inventory would say (must pass), then
    with a wrong expectation (fp8 KV cache expected as auto: the read-back must fail the host)."""
    host_vars = {
        "vllm_profile_name": profile_name,
        "vllm_profile": {"gpu_memory_utilization": emulated},
        "vllm_gpu": host,
        "vllm_version": VLLM_VERSION,
        "vllm_port": 8000,
        "vllm_verify_check_unit": False,
        "vllm_verify_health_timeout": 60,
    }
    if draft:  # the shipped profile as corrected here (see docs/gpu-results.md)
        host_vars["vllm_profile"]["speculative"] = {"use_heterogeneous_vocab": True}
    wrong = copy.deepcopy(host_vars["vllm_profile"])
    wrong["kv_cache_dtype"] = "auto"
    return [
        {
            "kind": "ansible",
            "name": "verify-pass",
            "playbook": "playbooks/verify.yml",
            "host_vars": host_vars,
            "extra_vars": {"vllm_verify_report_run_id": f"{exp_name}-pass"},
            "expect": "pass",
            "timeout_s": 120,
            "est_s": 30,
        },
        {
            "kind": "ansible",
            "name": "verify-wrong-kv-dtype",
            "playbook": "playbooks/verify.yml",
            "host_vars": host_vars,
            "extra_vars": {"vllm_verify_report_run_id": f"{exp_name}-wrong", "vllm_profile": wrong},
            "expect": "fail",
            "timeout_s": 120,
            "est_s": 30,
        },
    ]


def benchmark_action(profile_name: str, emulated: float, host: dict = H200) -> dict:
    """playbooks/benchmark.yml against the running server (the operator's benchmark, -c local)."""
    return {
        "kind": "ansible",
        "name": "benchmark-playbook",
        "playbook": "playbooks/benchmark.yml",
        "host_vars": {
            "vllm_profile_name": profile_name,
            "vllm_profile": {"gpu_memory_utilization": emulated},
            "vllm_gpu": host,
            "vllm_version": VLLM_VERSION,
            "vllm_port": 8000,
        },
        "extra_vars": {
            "vllm_benchmark_run_id": "gpu-benchmark-playbook",
            "vllm_benchmark_requests": 64,
            "vllm_benchmark_concurrency": 16,
            "vllm_benchmark_prompt_tokens": 1024,
            "vllm_benchmark_max_tokens": 256,
            "vllm_benchmark_duration_s": 60,
        },
        "expect": "pass",
        "timeout_s": 150,
        "est_s": 30,
    }


HET_VOCAB = {"speculative": {"use_heterogeneous_vocab": True}}
AS_REFERENCE = {"speculative": {"use_heterogeneous_vocab": None}}


def build(host: dict = H200) -> dict:
    experiments: list[dict] = []
    experiment = functools.partial(globals()["experiment"], host=host)  # every start below, on this host
    # In priority order; the harness runs them in this order while they fit in a round and takes up the
    # skipped ones in the next. est_s: the longest measured start plus actions of runs 2 to 4 on the H200
    # (results/gpu/2026-11-29-run*/), with the stdlib generator's loads, rounded up; schedule() packs them.
    # Starts with FlashAttention 2 (bf16 or fp16 KV) assume the JIT cache (JIT_CACHE): 102 s for vLLM's bf16
    # defaults in run 4, against 252-364 s for a bf16 or fp16 start that compiled; fp8 starts (Triton
    # attention) take 100-160 s. Run 6 ran this plan on a fresh machine with the cache: each experiment took
    # 89-196 s, the L40 defaults 172 s (start 116 s), and the prefix-heavy profile's first start, whose vLLM
    # compiles its graphs, outran a 98 s bound (runs 2-4: 94-108 s), so it gets 130 s.
    dec = experiment(
        "fid-rtx4090-7b-decode",
        "RTX 4090",
        "rtx4090-7b-decode",
        HET_VOCAB,
        est_s=205,
        note="use_heterogeneous_vocab: true, the correction",
    )
    dec["actions"] = verify_actions(dec["name"], "rtx4090-7b-decode", dec["emulated_utilization"], True, host)
    experiments.append(dec)
    experiments.append(
        experiment(
            "fid-l40-14b-decode",
            "L40",
            "l40-14b-decode",
            HET_VOCAB,
            est_s=165,
            note="use_heterogeneous_vocab: true, the correction",
        )
    )
    experiments.append(experiment("fid-rtx4090-7b-awq", "RTX 4090", "rtx4090-7b-awq", actions=[SINGLE], est_s=150))
    pre = experiment(
        "fid-rtx4090-7b-prefill",
        "RTX 4090",
        "rtx4090-7b-prefill",
        est_s=190,
        actions=[reference_load(64, 192, single=3)],
    )
    pre["actions"].append(benchmark_action("rtx4090-7b-prefill", pre["emulated_utilization"], host))
    experiments.append(pre)
    experiments.append(
        experiment(
            "default-rtx4090-7b",
            "RTX 4090",
            None,
            {"model": "Qwen/Qwen2.5-7B-Instruct", **VLLM_DEFAULTS},
            actions=[reference_load(64, 192)],
            est_s=140,
            note="vLLM 0.26 defaults for a GPU under 70 GiB",
        )
    )
    experiments.append(
        experiment(
            "fid-l40-14b-awq-prefill",
            "L40",
            "l40-14b-awq-prefill",
            actions=[reference_load(128, 256, single=3)],
            est_s=190,
        )
    )
    experiments.append(
        experiment(
            "default-l40-14b-awq",
            "L40",
            None,
            {"model": "Qwen/Qwen2.5-14B-Instruct-AWQ", "quantization": "awq", **VLLM_DEFAULTS},
            actions=[reference_load(128, 256)],
            est_s=180,
            note="vLLM 0.26 defaults for a GPU under 70 GiB",
        )
    )
    experiments.append(experiment("fid-rtx4090-7b-prefix-heavy", "RTX 4090", "rtx4090-7b-prefix-heavy", est_s=130))
    # The decode profiles as the tuning reference writes them: vLLM 0.26 refuses a draft whose vocab_size differs
    # from the target's (Qwen2.5-0.5B/1.5B: 151,936; 7B/14B: 152,064). Last: the planner refuses it first.
    experiments.append(
        experiment(
            "refuse-rtx4090-7b-decode",
            "RTX 4090",
            "rtx4090-7b-decode",
            AS_REFERENCE,
            est_s=30,
            expect_refusal=True,
            note="as the tuning reference writes it: draft and target vocab sizes differ",
        )
    )
    # Candidates (optional: they run only when named with --only). The 4090's bf16 candidate of runs 3 and 4
    # met the goal and is now the shipped profile; the planner flags the prefix-heavy variant's fp8 cache for
    # the same reason (docs/gpu-results.md), so its bf16 form is the next candidate (the reference's load
    # against the fp8 profile's, in the same run). The L40 met the goal in run 3; its candidate trades TTFT
    # for ITL with a smaller token budget.
    # Run 7 (2026-12-01): the 4090's prefill profile, vLLM's defaults and the planner-derived settings side by
    # side in one round, all with `vllm bench serve` (issue #23: the shipped profile's median TTFT was 2.5x the
    # defaults'). Optional: they run only when named (`--only`, the names of RUN7).
    derived = service_levels.derived_batching(pre["planner"]["kv_cache_tokens"], 1024, 512)
    run7 = (
        experiment(
            "r7-default-rtx4090-7b",
            "RTX 4090",
            None,
            {"model": "Qwen/Qwen2.5-7B-Instruct", **VLLM_DEFAULTS},
            actions=[bench_load(64, 192)],
            est_s=140,
            note="vLLM 0.26 defaults for a GPU under 70 GiB",
        ),
        experiment(
            "r7-rtx4090-7b-prefill",
            "RTX 4090",
            "rtx4090-7b-prefill",
            actions=[bench_load(64, 192)],
            est_s=140,
            note="shipped",
        ),
        experiment(
            "cand-rtx4090-7b-prefill-derived",
            "RTX 4090",
            "rtx4090-7b-prefill",
            dict(derived),
            actions=[bench_load(64, 192)],
            est_s=140,
            note=(
                "candidate: max_num_seqs and max_num_batched_tokens from the KV capacity and one typical prompt "
                "per step"
            ),
        ),
        experiment(
            "cand-rtx4090-7b-prefill-seqs",
            "RTX 4090",
            "rtx4090-7b-prefill",
            {"max_num_seqs": derived["max_num_seqs"]},
            actions=[bench_load(64, 192)],
            est_s=140,
            note="candidate: the shipped token budget, max_num_seqs from the KV capacity",
        ),
    )
    # Run 8 (2026-12-02): the same side by side for the L40 (the shipped AWQ prefill profile, vLLM's defaults for
    # the card and the planner-derived setting, at the reference's 128 users), then the 4090's fourth candidate
    # with vLLM's defaults again in the same run, then the other 4090 profiles without speculation against
    # those defaults. In priority order; optional: they run only when named (`--only`, RUN8).
    # est_s: run 6's starts (L40 defaults 116 s, the L40 profile 132 s, 4090 bf16 80-126 s, fp8 88-98 s, the
    # 4090 AWQ profile 108 s) plus run 7's loads by `vllm bench serve` (its import ~25 s, then the load).
    # Since run 8 the L40 profile ships the derived setting; r8-l40-14b-awq-prefill keeps the tuning reference's
    # 16,384 tokens and 128 sequences, shipped until then, and the candidate is derived from that setting's KV
    # capacity as in the run, so the three run as they did.
    l40_guide = experiment(
        "r8-l40-14b-awq-prefill",
        "L40",
        "l40-14b-awq-prefill",
        {"max_num_seqs": 128, "max_num_batched_tokens": 16384},
        actions=[bench_load(128, 256, est_s=80)],
        est_s=215,
        note="the tuning reference's settings, shipped until run 8",
    )
    l40_derived = service_levels.derived_batching(l40_guide["planner"]["kv_cache_tokens"], 1024, 512)
    run8 = (
        experiment(
            "r8-default-l40-14b-awq",
            "L40",
            None,
            {"model": "Qwen/Qwen2.5-14B-Instruct-AWQ", "quantization": "awq", **VLLM_DEFAULTS},
            actions=[bench_load(128, 256, est_s=85)],
            est_s=205,
            note="vLLM 0.26 defaults for a GPU under 70 GiB",
        ),
        l40_guide,
        experiment(
            "cand-l40-14b-awq-prefill-derived",
            "L40",
            "l40-14b-awq-prefill",
            dict(l40_derived),
            actions=[bench_load(128, 256, est_s=85)],
            est_s=215,
            note=(
                "candidate: max_num_seqs and max_num_batched_tokens from the KV capacity and one typical prompt "
                "per step"
            ),
        ),
        experiment(
            "r8-default-rtx4090-7b",
            "RTX 4090",
            None,
            {"model": "Qwen/Qwen2.5-7B-Instruct", **VLLM_DEFAULTS},
            actions=[bench_load(64, 192)],
            est_s=150,
            note="vLLM 0.26 defaults for a GPU under 70 GiB",
        ),
        run7[3],  # cand-rtx4090-7b-prefill-seqs, planned for run 7, which had no time left for it
        experiment(
            "r8-rtx4090-7b-prefix-heavy",
            "RTX 4090",
            "rtx4090-7b-prefix-heavy",
            actions=[bench_load(64, 192)],
            est_s=140,
            note="shipped",
        ),
        experiment(
            "r8-default-rtx4090-7b-awq",
            "RTX 4090",
            None,
            {"model": "Qwen/Qwen2.5-7B-Instruct-AWQ", "quantization": "awq", **VLLM_DEFAULTS},
            actions=[bench_load(64, 192)],
            est_s=150,
            note="vLLM 0.26 defaults for a GPU under 70 GiB",
        ),
        experiment(
            "r8-rtx4090-7b-awq", "RTX 4090", "rtx4090-7b-awq", actions=[bench_load(64, 192)], est_s=150, note="shipped"
        ),
    )
    assert tuple(e["name"] for e in run8) == RUN8
    # Run 9 (2026-12-02): rtx4090-7b-prefix-heavy beside vLLM's defaults for the 4090 in one round, as run 8 planned
    # (r8-rtx4090-7b-prefix-heavy did not fit there), then the planner-derived setting for it. Optional (`--only`,
    # RUN9).
    heavy = experiment(
        "r9-rtx4090-7b-prefix-heavy",
        "RTX 4090",
        "rtx4090-7b-prefix-heavy",
        actions=[bench_load(64, 192)],
        est_s=140,
        note="shipped",
    )
    heavy_derived = service_levels.derived_batching(heavy["planner"]["kv_cache_tokens"], 1024, 512)
    run9 = (
        experiment(
            "r9-default-rtx4090-7b",
            "RTX 4090",
            None,
            {"model": "Qwen/Qwen2.5-7B-Instruct", **VLLM_DEFAULTS},
            actions=[bench_load(64, 192)],
            est_s=160,
            note="vLLM 0.26 defaults for a GPU under 70 GiB",
        ),
        heavy,
        experiment(
            "cand-rtx4090-7b-prefix-heavy-derived",
            "RTX 4090",
            "rtx4090-7b-prefix-heavy",
            dict(heavy_derived),
            actions=[bench_load(64, 192)],
            est_s=140,
            note=(
                "candidate: max_num_seqs and max_num_batched_tokens from the KV capacity and one typical prompt "
                "per step"
            ),
        ),
    )
    assert tuple(e["name"] for e in run9) == RUN9
    for cand in (
        *run7[:3],
        *run8,
        *run9,
        experiment(
            "cand-rtx4090-7b-prefix-heavy-kv-auto",
            "RTX 4090",
            "rtx4090-7b-prefix-heavy",
            {"kv_cache_dtype": "auto", "calculate_kv_scales": None},
            actions=[reference_load(64, 192)],
            est_s=150,
            note="candidate: bf16 KV cache",
        ),
        experiment(
            "cand-l40-14b-awq-prefill-8k",
            "L40",
            "l40-14b-awq-prefill",
            {"max_num_batched_tokens": 8192},
            actions=[reference_load(128, 256)],
            est_s=190,
            note="candidate: 8,192 batched tokens",
        ),
    ):
        cand["optional"] = True
        experiments.append(cand)
    return _wrap(experiments, host)


def _wrap(experiments: list[dict], host: dict, date: str = DATE) -> dict:
    """The plan file: the experiments (those left out for a card larger than the host listed apart), the models
    they start and what every start shares."""
    left_out = [e for e in experiments if "left_out" in e]
    experiments = [e for e in experiments if "left_out" not in e]
    used = sorted({e["model"] for e in experiments} | {e["draft"] for e in experiments if e["draft"]})
    models = {}
    for model_id in used:
        entry = {"config": catalogue.catalogue()[model_id]["config"]}
        if any(
            e["draft"] == model_id and e["overrides"].get("speculative", {}).get("use_heterogeneous_vocab")
            for e in experiments
        ):
            entry["tokenizer_in_folder"] = True  # vLLM loads a heterogeneous-vocab draft's own tokenizer
        models[model_id] = entry
    vocab = max(m["config"]["vocab_size"] for m in models.values())
    return {
        "date": date,
        "vllm_version": VLLM_VERSION,
        "host_gpu": host,
        "cards": {c: v for c, v in CARDS.items() if v["memory_mib"] <= host["memory_mib"]},
        "port": 8000,
        "environment": ENVIRONMENT,
        "harness_args": HARNESS_ARGS,
        "tokenizer_vocab_size": vocab,
        "vllm_defaults_small_gpu": VLLM_DEFAULTS,
        "models": models,
        "experiments": experiments,
        "jit_cache": JIT_CACHE,
        **({"left_out": {e["name"]: e["left_out"] for e in left_out}} if left_out else {}),
    }


# The tune playbook's search (vllm_fleet.tune) on this host, for one shipped profile and its card: vLLM's defaults
# for the card, then the candidates vllm_fleet.tune.candidates plans for it (the profile, the planner's derived
# batching, and the settings given here), each loaded `repeats` times with the reference's load by vllm bench serve
# (repeat r with seed r, the same for every setting: other prompts each repeat, the same prompts across settings).
# Five repeats by default: vllm_fleet.tune.against_defaults' exact Mann-Whitney test can separate 5 from 5 (p down to
# 0.0079) and never 2 from 2 (0.33) or 3 from 3 (0.1) (issue #49). Every experiment of a search carries
# "interleave": the search's name, so that the harness runs them side by side and alternates their loads (a drift of
# the host falls on every setting alike). summarize.py makes the front and the pick of the results, pooling every
# round's loads of a setting.
TUNE_DATE = "2026-12-04"
TUNE_REPEATS = 5
# An interleaved search's servers share the host's card: their emulated memory shares together at most this much of
# it, the rest for their CUDA contexts (about 0.5 GiB each outside vLLM's budget) and the harness's margin.
TUNE_SIDE_BY_SIDE_SHARE = 0.9


# The loads a search may send: the reference's random prompts, or prompts that share prefixes (a prefix-caching
# profile's traffic: vllm bench serve's prefix_repetition dataset).
TUNE_LOADS = {"reference": tune.reference_load, "shared-prefix": tune.shared_prefix_load}


def build_tune(
    profile_name: str,
    card: str,
    repeats: int = TUNE_REPEATS,
    extra: tuple[dict, ...] = (),
    host: dict = H200,
    limit: int = 4,
    load_kind: str = "reference",
    interleave: bool = True,
) -> dict:
    """The search's plan. `interleave` marks its experiments for the harness to run side by side; the committed
    records of runs 10 to 12 (gpu/bench/tune-*.json, two repeats each, one experiment after the other) were written
    before it and are rebuilt with repeats=2, interleave=False (tests/unit/gpu/bench/test_gpu_tune.py)."""
    gpu = CARDS[card]
    load = TUNE_LOADS[load_kind](gpu)
    users = int(load["bench"]["max_concurrency"])
    prompt_tokens, output_tokens = tune.load_lengths(load)
    hostvars = {
        "vllm_profile_name": profile_name,
        "vllm_profile": {},
        "vllm_gpu": gpu,
        "vllm_version": VLLM_VERSION,
        "vllm_typical_prompt_tokens": prompt_tokens,
        "vllm_typical_output_tokens": output_tokens,
    }
    found = tune.candidates(f"tune-{card}", hostvars, planner.plan_host, load, extra=extra, limit=limit)

    # Each load: vllm bench serve's import (~25 s), then 3 x users requests at the output rate run 8 measured.
    lengths = {"input_len": prompt_tokens, "output_len": output_tokens}
    per_load_s = 30 + (3 * users * output_tokens) // (2300 if card == "L40" else 6500)
    # The dataset's own arguments where the load is not the random one (the harness passes them to bench serve).
    dataset = {k: v for k, v in load["bench"].items() if k != "max_concurrency"} if load_kind != "reference" else None
    tag = "" if load_kind == "reference" else f"-{load_kind}"

    def loads() -> list[dict]:
        return [
            dict(
                bench_load(users, 3 * users, est_s=per_load_s),
                **lengths,
                name=f"guide-{users}u{tag}-bench-r{i}",
                seed=i,
                **({"dataset": dataset} if dataset else {}),
            )
            for i in range(1, repeats + 1)
        ]

    model = profiles.resolve("tune", profile_name)["model"]
    defaults = {"model": model, **VLLM_DEFAULTS}
    # A quantized checkpoint's method, as runs 2 to 8 gave vLLM's defaults for the AWQ models.
    method = (catalogue.catalogue()[model]["config"].get("quantization_config") or {}).get("quant_method")
    if method:
        defaults["quantization"] = method
    # est_s: the start (run 8: 108-124 s for the L40's 14B AWQ, 76-124 s for the 4090's 7B in run 10) and the loads.
    est_s = 130 + repeats * per_load_s
    experiments = [
        experiment(
            f"tune-default-{profile_name}",
            card,
            None,
            defaults,
            actions=loads(),
            est_s=est_s,
            note="vLLM 0.26 defaults for a GPU under 70 GiB",
            host=host,
        )
    ]
    for name, candidate in found["candidates"].items():
        experiments.append(
            experiment(
                f"tune-{name}-{profile_name}",
                card,
                profile_name,
                dict(candidate["settings"]),
                actions=loads(),
                est_s=est_s,
                note=f"tune candidate {name}: {candidate['settings'] or 'the profile as shipped'}",
                host=host,
            )
        )
    search = f"tune-{profile_name}{tag}"
    if interleave:
        share = sum(e["emulated_utilization"] for e in experiments)
        if share > TUNE_SIDE_BY_SIDE_SHARE:
            raise ValueError(
                f"the search {search}'s {len(experiments)} servers side by side would take {share:.2f} of the "
                f"{host['name']}'s memory (at most {TUNE_SIDE_BY_SIDE_SHARE}); fix: fewer candidates (--limit)"
            )
        for e in experiments:
            e["interleave"] = search
    plan = _wrap(experiments, host, TUNE_DATE)
    plan["tune"] = {
        "profile": profile_name,
        "card": card,
        "repeats": repeats,
        "load": load,
        # What each experiment sets (its own args are the experiment's, planned for the emulated card above).
        "candidates": {
            f"tune-{n}-{profile_name}": {k: v for k, v in c.items() if k != "args"}
            for n, c in found["candidates"].items()
        },
        "defaults": f"tune-default-{profile_name}",
        "refused": found["refused"],
    }
    return plan


def _host_gpu(text: str) -> dict:
    try:
        name, mib, gb_s = (part.strip() for part in text.split(","))
        return {"name": name, "memory_mib": int(mib), "bandwidth_gb_s": int(gb_s), "count": 1}
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME,MIB,GB_S (e.g. 'RTX 4090,24564,1008')") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "experiments.json")
    parser.add_argument(
        "--host-gpu",
        type=_host_gpu,
        default=H200,
        metavar="NAME,MIB,GB_S",
        help="the GPU that will run the plan (default: H200,143771,4800)",
    )
    parser.add_argument("--tune", metavar="PROFILE", help="the tune search for one shipped profile (see build_tune)")
    parser.add_argument("--card", choices=sorted(CARDS), help="--tune: the card the profile is for")
    parser.add_argument(
        "--repeats",
        type=int,
        default=TUNE_REPEATS,
        help=f"--tune: loads per candidate, interleaved with the others' (default {TUNE_REPEATS})",
    )
    parser.add_argument("--limit", type=int, default=4, help="--tune: candidates besides the defaults (default 4)")
    parser.add_argument(
        "--load",
        choices=sorted(TUNE_LOADS),
        default="reference",
        help="--tune: the reference's random prompts, or prompts sharing prefixes (default: reference)",
    )
    parser.add_argument(
        "--candidate",
        action="append",
        type=json.loads,
        default=[],
        metavar="JSON",
        help="--tune: one more candidate, e.g. '{\"max_num_batched_tokens\": 4096}' (repeatable)",
    )
    parser.add_argument(
        "--warm-restart",
        action="store_true",
        help="--tune: after the loads, start each setting once more alone and record the KV cache it sizes with "
        "vLLM's compile cache warm (the planner's warm-restart prediction; about a start's time each)",
    )
    args = parser.parse_args(argv)
    if args.tune:
        if not args.card:
            parser.error("--tune needs --card")
        try:
            plan = build_tune(
                args.tune, args.card, args.repeats, tuple(args.candidate), args.host_gpu, args.limit, args.load
            )
        except ValueError as exc:
            parser.error(str(exc))
        for e in plan["experiments"] if args.warm_restart else []:
            e["warm_restart"] = True
            e["est_s"] += 130  # a start alone (harness.py Runner.warm_restart)
        for name, why in plan["tune"]["refused"].items():
            print(f"{name:30s} refused by the planner: {' | '.join(why)}")
    else:
        plan = build(args.host_gpu)
    for name, why in plan.get("left_out", {}).items():
        print(f"{name:30s} left out: {why}")
    args.out.write_text(json.dumps(plan, indent=1) + "\n", encoding="utf-8")
    for e in plan["experiments"]:
        p = e["planner"]
        print(
            f"{e['name']:30s} util {e['emulated_utilization']:.6f}  predicted KV {p['kv_cache_tokens']}  "
            f"errors {len(p['errors'])}  actions {[a['name'] for a in e['actions']]}"
        )
    packed = schedule(plan["experiments"])
    print(
        f"expected: {packed['experiment_s']} s of experiments; in rounds of --budget-s 550/560 (parts.py): "
        f"{len(packed['rounds'])} rounds, about {packed['gpu_s']} s of GPU time with staging"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
