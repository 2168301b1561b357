"""planner: hand-computed capacity of the tuning reference's models, the H200 calibration point, the checks and the
rules. The filter plugin is tested in tests/unit/plugins/filter/test_vllm_plan.py, playbooks/plan.yml in
tests/unit/playbooks/test_plan.py."""

import json
import math

import pytest

from conftest import H200, L40, LAB, RTX4090
from vllm_fleet import __version__, catalogue, planner, sizing

GIB, MIB = 1 << 30, 1 << 20
NON_TORCH, GRAPHS_PER_LAYER = 375809638, 12_700_000  # data/memory_model.yml, gpu


def plan(profile_name=None, profile=None, gpu=RTX4090, version="0.33.0", **more):
    hostvars = {
        "vllm_profile_name": profile_name,
        "vllm_profile": profile or {},
        "vllm_gpu": gpu,
        "vllm_version": version,
        **more,
    }
    return planner.plan_host("h1", hostvars)


# --- the models' own numbers ----------------------------------------------------------------------
def test_qwen25_7b_parameters_match_the_hubs_count():
    arch = catalogue.lookup("Qwen/Qwen2.5-7B-Instruct")
    # per layer: q 3584*3584+3584, k and v 3584*512+512 each, o 3584*3584, MLP 3*3584*18944, 2 norms of 3584
    layer = (3584 * 3584 + 3584) + 2 * (3584 * 512 + 512) + 3584 * 3584 + 3 * 3584 * 18944 + 2 * 3584
    # 28 layers, embeddings and LM head (not tied) 152064*3584 each, final norm
    assert arch.parameters() == 28 * layer + 2 * 152064 * 3584 + 3584 == 7_615_616_512
    assert arch.parameters() == catalogue.catalogue()["Qwen/Qwen2.5-7B-Instruct"]["safetensors_parameters"]["BF16"]


@pytest.mark.parametrize(
    "model,params",
    [
        ("Qwen/Qwen2.5-14B-Instruct", 14_770_033_664),  # model card: 14.7B
        ("Qwen/Qwen2.5-0.5B-Instruct", 494_032_768),  # model card: 0.49B
        ("Qwen/Qwen2.5-1.5B-Instruct", 1_543_714_304),  # model card: 1.54B
    ],
)
def test_other_guide_models_match_their_model_cards(model, params):
    assert catalogue.lookup(model).parameters() == params


def test_kv_bytes_per_token_fp8_against_auto():
    arch = catalogue.lookup("Qwen/Qwen2.5-7B-Instruct")
    # 2 (K, V) x 4 KV heads x head_dim 3584/28=128 x 28 layers x bytes
    assert arch.kv_bytes_per_token(2) == 2 * 4 * 128 * 28 * 2 == 57_344
    assert arch.kv_bytes_per_token(1) == 28_672
    l14 = catalogue.lookup("Qwen/Qwen2.5-14B-Instruct")
    assert l14.kv_bytes_per_token(1) == 2 * 8 * 128 * 48 == 98_304


def test_awq_weights_are_packed_int4_plus_scales_and_zeros():
    arch = catalogue.lookup("Qwen/Qwen2.5-7B-Instruct-AWQ")
    other = 2 * 152064 * 3584 + 28 * (2 * 3584 + (28 + 2 * 4) * 128) + 3584  # fp16: embeddings, head, norms, biases
    linear = 7_615_616_512 - other  # 4-bit: the projections
    expected = linear // 2 + (linear // 128) * 2 + (linear // 128) // 2 + other * 2  # packed + scales + zeros + fp16
    assert arch.weight_bytes(2) == expected == 5_570_747_392  # 5.19 GiB (bf16: 14.19 GiB)


# --- hand-computed plans of the tuning reference's configurations ----------------------------------------------
def test_rtx4090_7b_decode_by_hand():
    entry = plan("rtx4090-7b-decode")
    c = entry["capacity"]
    budget = math.ceil(24564 * MIB * 0.92)  # 23,696,643,195 B usable
    weights = 7_615_616_512 * 2  # bf16
    draft = 494_032_768 * 2  # Qwen2.5-0.5B bf16
    activation = (152064 + 2.25 * 8192) * 3584 * 2  # vocab x hidden floor + 8192-token pass
    graphs = GRAPHS_PER_LAYER * (28 + 24)  # draft model: V1 runner reserves, 7B + 0.5B
    kv = budget - weights - draft - int(activation) - NON_TORCH - graphs
    per_token = 2 * 4 * 128 * 28 * 1 + 2 * 2 * 64 * 24 * 1  # fp8: 7B 28,672 + 0.5B draft 6,144
    tokens = kv // per_token // 16 * 16
    warm_activation = 20 * 8192 * 3584 * 2  # a warm restart: the per-token term alone
    warm_tokens = (kv + int(activation) - warm_activation) // per_token // 16 * 16
    assert c == {
        "gpu_memory_bytes": 24564 * MIB,
        "weights_bytes": weights,
        "draft_weights_bytes": draft,
        "kv_bytes_per_token": per_token,
        "kv_cache_bytes": kv,
        "kv_cache_tokens": tokens,
        "kv_cache_tokens_warm": warm_tokens,
        "max_concurrency_at_max_len": tokens // 8192,
        "decode_ceiling_tokens_per_s": int(1008e9 // (weights + draft)),
        "fits": True,
    }
    assert (kv, tokens, tokens // 8192, c["decode_ceiling_tokens_per_s"]) == (5_219_019_669, 149_888, 18, 62)
    assert warm_tokens == 151_264
    assert entry["estimates"] == {
        "activation_peak_bytes": 1_222_115_328,
        "cuda_graph_reserve_bytes": 660_400_000,
        "runtime_reserve_bytes": NON_TORCH + 660_400_000,
    }
    assert entry["estimates_warm"] == {"activation_peak_bytes": 1_174_405_120}
    assert entry["kv_cache_band"] == {"low_tokens": 142_393, "high_tokens": 158_828, "tolerance_pct": 5.0}
    assert entry["errors"] == []
    assert len(entry["warnings"]) == 1
    assert entry["warnings"][0].startswith("h1: speculative decoding with max_num_seqs=64 (> 32)")


def test_l40_14b_decode_by_hand():
    entry = plan("l40-14b-decode", gpu=L40)
    c = entry["capacity"]
    budget = math.ceil(46068 * MIB * 0.90)
    weights, draft = 14_770_033_664 * 2, 1_543_714_304 * 2
    activation = (152064 + 2.25 * 16384) * 5120 * 2
    kv = budget - weights - draft - int(activation) - NON_TORCH - GRAPHS_PER_LAYER * (48 + 28)
    per_token = 2 * 8 * 128 * 48 + 2 * 2 * 128 * 28  # fp8: 98,304 + 1.5B draft 14,336
    assert (c["kv_cache_bytes"], c["kv_bytes_per_token"]) == (kv, per_token)
    assert c["kv_cache_tokens"] == kv // per_token // 16 * 16 == 67_216
    assert c["max_concurrency_at_max_len"] == 4  # 67,216 // 16,384
    assert (
        c["decode_ceiling_tokens_per_s"] == 26
    )  # 864e9 / 32.6e9 B: below the tuning reference's 25-40 per user at batch
    assert entry["errors"] == []
    text = " ".join(entry["warnings"])
    assert "max_num_seqs=128 (> 32)" in text
    assert "holds 67,216 tokens, less than max_num_seqs=128 requests of typical length 768" in text


def test_fp8_kv_holds_twice_the_tokens_of_auto():
    fp8 = plan("rtx4090-7b-prefill", {"kv_cache_dtype": "fp8", "calculate_kv_scales": True})["capacity"]
    auto = plan("rtx4090-7b-prefill")["capacity"]
    assert fp8["kv_cache_bytes"] == auto["kv_cache_bytes"]
    assert auto["kv_bytes_per_token"] == 2 * fp8["kv_bytes_per_token"] == 57_344
    assert fp8["kv_cache_tokens"] == 2 * auto["kv_cache_tokens"] == 227_104


def test_awq_on_the_rtx4090_frees_memory_for_the_kv_cache():
    awq = plan("rtx4090-7b-awq")
    c = awq["capacity"]
    assert c["weights_bytes"] == 5_570_747_392 and c["fits"] and awq["errors"] == []
    assert c["kv_cache_tokens"] > 2 * plan("rtx4090-7b-prefill")["capacity"]["kv_cache_tokens"]
    assert c["decode_ceiling_tokens_per_s"] == 180  # 1008e9 / 5.57e9: AWQ raises the decode ceiling most


def test_h200_calibration_point():
    """vLLM 0.26 on a real H200 (shared/reference/GPU-HOST.md; shared/fixtures/vllm/0.26.0-cuda-h200/
    metrics_after_bench.txt: kv_cache_size_tokens 2115440): gpu_memory_utilization 0.92, Qwen2.5-7B bf16
    dims, weights 14.29 GiB, KV cache 112.98 GiB. A dense model on 0.26's V2 runner: no CUDA-graph
    reserve. vLLM's budget is CUDA's total (143,156 MiB), 615 MiB below nvidia-smi's 143,771."""
    profile = {
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "gpu_memory_utilization": 0.92,
        "max_model_len": 8192,
        "max_num_seqs": 256,
        "max_num_batched_tokens": 8192,
    }
    entry = plan(profile=profile, gpu=H200, version="0.26.0")
    c = entry["capacity"]
    assert entry["errors"] == [] and entry["estimates"]["cuda_graph_reserve_bytes"] == 0
    assert abs(c["weights_bytes"] / GIB - 14.29) / 14.29 < 0.01
    assert c["kv_cache_tokens"] == 2_125_152  # nvidia-smi's total: +0.46 %
    cuda_total = plan(profile=profile, gpu=dict(H200, memory_mib=143156), version="0.26.0")["capacity"]
    assert cuda_total["kv_cache_tokens"] == 2_114_800  # vLLM's own budget: -0.03 %
    assert abs(cuda_total["kv_cache_bytes"] / GIB - 112.98) / 112.98 < 0.001


# Measured on the H200 with vLLM 0.26.0, second run (docs/gpu-results.md;
# results/gpu/2026-11-29-run2-ada-emulation/summary.json):
# the engine's kv_cache_size_tokens, on the budget vLLM had (CUDA's 143,156 MiB x the emulated
# utilization), with the harness's Ada emulation (attention_config flash_attn_version 2).
# (name, profile, overrides, emulated gpu_memory_utilization, engine KV tokens)
HET = {"speculative": {"use_heterogeneous_vocab": True}}
H200_026_RUNS = [
    ("7B + 0.5B draft, 8192 tokens, fp8", "rtx4090-7b-decode", HET, 0.15718664, 148_736),
    ("14B + 1.5B draft, 16384 tokens, fp8", "l40-14b-decode", HET, 0.28838361, 66_688),
    ("7B AWQ, 8192 tokens, fp8", "rtx4090-7b-awq", {}, 0.16060374, 590_944),
    (
        "7B, 8192 tokens, fp8",
        "rtx4090-7b-prefill",
        {"kv_cache_dtype": "fp8", "calculate_kv_scales": True},
        0.15718664,
        236_080,
    ),
    ("7B, 8192 tokens, bf16 (the shipped profile since run 4)", "rtx4090-7b-prefill", {}, 0.15718664, 118_624),
    (
        "7B, 4096 tokens, fp8 (runs 2, 6, 9 and 12; shipped until run 12)",
        "rtx4090-7b-prefix-heavy",
        {"kv_cache_dtype": "fp8", "calculate_kv_scales": True},
        0.15718664,
        238_128,
    ),
    ("7B, 4096 tokens, bf16 (runs 6 and 12; shipped since run 12)", "rtx4090-7b-prefix-heavy", {}, 0.15718664, 119_648),
    (
        "14B AWQ, 16384 tokens, fp8",
        "l40-14b-awq-prefill",
        {"max_num_batched_tokens": 16384, "max_num_seqs": 128},
        0.28838361,
        315_488,
    ),
    ("14B AWQ, 1280 tokens, 206 seqs, fp8 (shipped since run 8)", "l40-14b-awq-prefill", {}, 0.28838361, 318_960),
    (
        "7B, vLLM's defaults: 2048 tokens, 256 seqs, bf16",
        None,
        {"model": "Qwen/Qwen2.5-7B-Instruct", "max_num_batched_tokens": 2048, "max_num_seqs": 256},
        0.15718664,
        120_160,
    ),
    (
        "14B AWQ, vLLM's defaults",
        None,
        {
            "model": "Qwen/Qwen2.5-14B-Instruct-AWQ",
            "quantization": "awq",
            "max_num_batched_tokens": 2048,
            "max_num_seqs": 256,
        },
        0.29479213,
        164_464,
    ),
]


@pytest.mark.parametrize(
    "name,profile,overrides,utilization,engine_tokens", H200_026_RUNS, ids=[run[0] for run in H200_026_RUNS]
)
def test_planner_within_5_percent_of_vllm_026_on_the_h200(name, profile, overrides, utilization, engine_tokens):
    """The issue's goal for the memory model, on every run vLLM 0.26.0 started. The model was fitted on
    the first run's six starts (they moved from -6.5..+5.7 % to within 1.1 %); the second run, with
    another attention backend and two profiles it had not seen, landed within 1.7 %."""
    entry = plan(
        profile,
        dict(overrides, gpu_memory_utilization=utilization),
        gpu=dict(H200, memory_mib=143156),
        version="0.26.0",
        vllm_extra_args={"attention_config": {"flash_attn_version": 2}},
    )
    assert entry["errors"] == []
    error = (entry["capacity"]["kv_cache_tokens"] - engine_tokens) / engine_tokens
    assert abs(error) < 0.05, f"{name}: planner {entry['capacity']['kv_cache_tokens']:,} vs engine {engine_tokens:,}"
    assert abs(error) < 0.02  # what the second run measured: -1.7 .. +0.1 %


# Warm restarts: the same arguments started again on the same machine, finding vLLM's torch.compile cache of the
# first start (docs/gpu-results.md section 1, "A warm restart sizes a larger cache"; summary.json warm_restart of
# results/gpu/2026-11-29-run4-rtx4090-bf16 and -run6-whole-plan). (name, profile, overrides, emulated
# gpu_memory_utilization, engine KV tokens at the first start and warm, vLLM's peak activation GiB warm)
H200_026_WARM_RESTARTS = [
    (
        "7B, vLLM's defaults: 2048 tokens, 256 seqs, bf16 (run 4)",
        None,
        {"model": "Qwen/Qwen2.5-7B-Instruct", "max_num_batched_tokens": 2048, "max_num_seqs": 256},
        0.15718664,
        120_160,
        134_256,
        0.29,
    ),
    (
        "7B, 4096 tokens, 64 seqs, fp8 (run 6)",
        "rtx4090-7b-prefix-heavy",
        {"kv_cache_dtype": "fp8", "calculate_kv_scales": True},
        0.15718664,
        238_128,
        257_696,
        0.55,
    ),
]


@pytest.mark.parametrize(
    "name,profile,overrides,utilization,first_tokens,warm_tokens,warm_activation_gib",
    H200_026_WARM_RESTARTS,
    ids=[run[0] for run in H200_026_WARM_RESTARTS],
)
def test_planner_within_5_percent_of_vllm_026_warm_restarts_on_the_h200(
    name, profile, overrides, utilization, first_tokens, warm_tokens, warm_activation_gib
):
    """The issue's goal on a warm restart: kv_cache_tokens_warm within 5 % of the engine (measured: -0.06 and
    +0.16 % on vLLM's budget), while kv_cache_tokens still predicts the first start, and the first start's
    prediction alone would miss the restart by more than 5 %."""
    entry = plan(
        profile,
        dict(overrides, gpu_memory_utilization=utilization),
        gpu=dict(H200, memory_mib=143156),
        version="0.26.0",
        vllm_extra_args={"attention_config": {"flash_attn_version": 2}},
    )
    c = entry["capacity"]
    assert entry["errors"] == []
    assert abs(c["kv_cache_tokens"] - first_tokens) / first_tokens < 0.02
    warm_error = (c["kv_cache_tokens_warm"] - warm_tokens) / warm_tokens
    assert abs(warm_error) < 0.05, f"{name}: planner {c['kv_cache_tokens_warm']:,} vs engine {warm_tokens:,} warm"
    assert abs(warm_error) < 0.005
    assert (c["kv_cache_tokens"] - warm_tokens) / warm_tokens < -0.05
    assert abs(entry["estimates_warm"]["activation_peak_bytes"] / GIB - warm_activation_gib) < 0.02  # 0.27, 0.55
    band = entry["kv_cache_band"]
    assert band["low_tokens"] <= first_tokens and warm_tokens <= band["high_tokens"]


@pytest.mark.parametrize(
    "name,profile,card_error_pct,warm_tokens",
    [
        ("7B, vLLM's defaults: 2048 tokens, 256 seqs, bf16", None, -9.1, 133_584),
        ("7B, 4096 tokens, 64 seqs, bf16", "rtx4090-7b-prefix-heavy", -6.1, 128_768),
    ],
)
def test_warm_restarts_on_an_h100_are_within_5_percent_of_the_card_plan(name, profile, card_error_pct, warm_tokens):
    """Issue #49, 2026-12-06 on an H100: first starts of 118,976-119,488 tokens, warm restarts of 128,768-133,584,
    -6.1 to -9.1 % for the card plan's first-start prediction. Those two errors pair each restart with its
    arguments (the card plans of 120,896 and 121,472 tokens); the warm prediction is within 2 % of both."""
    overrides = {} if profile else {"model": "Qwen/Qwen2.5-7B-Instruct", "max_num_batched_tokens": 2048}
    entry = plan(profile, overrides, gpu=RTX4090, version="0.26.0")
    c = entry["capacity"]
    assert round((c["kv_cache_tokens"] - warm_tokens) / warm_tokens * 100, 1) == card_error_pct
    assert abs(c["kv_cache_tokens_warm"] - warm_tokens) / warm_tokens < 0.02


def test_a_warm_restart_never_sizes_less_than_the_first_start():
    """Beyond the measured batches the per-token warm term would pass the first start's peak (14B at 16,384
    tokens: 3.1 GiB against 1.8): the planner caps it there, and a restart then predicts the first start's cache."""
    entry = plan("l40-14b-awq-prefill", {"max_num_batched_tokens": 16384, "max_num_seqs": 128}, gpu=L40)
    e, c = entry["estimates"], entry["capacity"]
    assert entry["estimates_warm"]["activation_peak_bytes"] == e["activation_peak_bytes"]
    assert c["kv_cache_tokens_warm"] == c["kv_cache_tokens"]
    shipped = plan("rtx4090-7b-prefill")["capacity"]  # 8,192 tokens: warm barely above the first start
    assert 0 < shipped["kv_cache_tokens_warm"] - shipped["kv_cache_tokens"] < 0.01 * shipped["kv_cache_tokens"]


def test_an_explicit_kv_size_is_the_same_on_a_warm_restart():
    entry = plan(
        "rtx4090-7b-prefill", gpu=H200, version="0.26.0", vllm_extra_args={"kv_cache_memory_bytes": 6300000000}
    )
    c = entry["capacity"]
    assert c["kv_cache_tokens_warm"] == c["kv_cache_tokens"]
    assert entry["estimates_warm"]["activation_peak_bytes"] < entry["estimates"]["activation_peak_bytes"]


@pytest.mark.parametrize(
    "version,speculative,extra,reserved",
    [
        ("0.19.0", None, {}, False),  # estimate off by default before 0.20
        ("0.22.0", None, {}, True),  # V1 runner for Qwen2, estimate on
        ("0.26.0", None, {}, False),  # V2 runner for dense models, profile returns 0
        (
            "0.26.0",
            {"model": "Qwen/Qwen2.5-0.5B-Instruct", "num_speculative_tokens": 5, "use_heterogeneous_vocab": True},
            {},
            True,
        ),  # draft model: falls back to V1
        ("0.26.0", {"method": "ngram", "num_speculative_tokens": 3}, {}, True),
        (
            "0.26.0",
            {
                "method": "eagle",
                "model": "Qwen/Qwen2.5-0.5B-Instruct",
                "num_speculative_tokens": 3,
                "use_heterogeneous_vocab": True,
            },
            {},
            False,
        ),  # eagle runs on V2
        ("0.29.0", None, {}, True),  # V2 profiles its graphs
        ("0.33.0", None, {"enforce_eager": True}, False),  # no graphs at all
    ],
)
def test_cuda_graph_reserve_follows_the_release_and_the_runner(version, speculative, extra, reserved):
    entry = plan("rtx4090-7b-prefill", {"speculative": speculative}, version=version, vllm_extra_args=extra)
    graphs = entry["estimates"]["cuda_graph_reserve_bytes"]
    layers = 28 + (24 if speculative and speculative.get("model") else 0)
    assert graphs == (GRAPHS_PER_LAYER * layers if reserved else 0)
    without = plan(
        "rtx4090-7b-prefill",
        {"speculative": speculative},
        version=version,
        vllm_extra_args=dict(extra, enforce_eager=True),
    )["capacity"]["kv_cache_bytes"]
    assert without - entry["capacity"]["kv_cache_bytes"] == graphs


def test_h200_fp8_kv_with_kv_cache_memory_bytes_matches_vllms_metrics():
    """shared/fixtures/vllm/0.26.0-cuda-h200/metrics_fp8_kv_after_bench.txt: kv_cache_memory_bytes 6.3e9, fp8,
    kv_cache_size_tokens 219712 (13732 blocks of 16), kv_cache_max_concurrency 26.82 at max_model_len 8192."""
    entry = plan(
        profile={
            "model": "Qwen/Qwen2.5-7B-Instruct",
            "kv_cache_dtype": "fp8",
            "max_model_len": 8192,
            "max_num_batched_tokens": 8192,
        },
        gpu=H200,
        version="0.26.0",
        vllm_extra_args={"kv_cache_memory_bytes": 6300000000},
    )
    c = entry["capacity"]
    assert c["kv_cache_bytes"] == 6_300_000_000
    assert c["kv_cache_tokens"] == 219_712 == 13_732 * 16
    assert c["max_concurrency_at_max_len"] == 26


def test_cpu_lab_uses_the_kv_size_it_is_given():
    entry = plan("cpu-lab-tiny", gpu=LAB, version="0.32.0", vllm_extra_args={"kv_cache_memory_bytes": "1G"})
    c = entry["capacity"]
    # tiny-qwen2 in float32: 2 (K, V) x 2 KV heads x 64 x 2 layers x 4 bytes = 2,048 B/token; 1G = 1,073,741,824 B
    assert (c["kv_bytes_per_token"], c["kv_cache_bytes"]) == (2048, 1_073_741_824)
    assert c["kv_cache_tokens"] == 524_288 and c["kv_cache_tokens"] % 128 == 0  # CPU blocks of 128
    assert c["kv_cache_tokens_warm"] == 524_288
    assert c["fits"] and entry["errors"] == [] and "--kv-cache-memory-bytes" in entry["instances"][0]["args"]


def test_cpu_lab_that_gives_more_kv_than_its_budget_does_not_fit():
    entry = plan("cpu-lab-tiny", gpu=LAB, version="0.32.0", vllm_extra_args={"kv_cache_memory_bytes": "8G"})
    assert not entry["capacity"]["fits"]
    assert entry["errors"] == [
        "h1: the KV cache of 8.00 GiB (vllm_extra_args.kv_cache_memory_bytes) exceeds the CPU KV budget "
        "vllm_gpu.memory_mib = 4.00 GiB; fix: lower vllm_extra_args.kv_cache_memory_bytes or raise "
        "vllm_gpu.memory_mib to the memory the host can give vLLM's KV cache"
    ]


def test_cpu_lab_as_the_lab_inventory_gives_it():
    """lab/inventory: count 0 (no GPU), a 1 GiB KV budget, VLLM_CPU_KVCACHE_SPACE=1 in the environment."""
    gpu = {"name": "cpu", "memory_mib": 1024, "bandwidth_gb_s": 20, "count": 0}
    entry = plan(
        "cpu-lab-tiny",
        gpu=gpu,
        version="0.32.0",
        vllm_extra_args={"enforce_eager": True},
        vllm_environment={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1"},
    )
    assert entry["errors"] == [] and entry["capacity"]["kv_cache_bytes"] == 1 << 30
    assert entry["capacity"]["kv_cache_tokens"] == (1 << 30) // 2048  # float32: 2,048 B a token
    # vllm-cpu sizes its cache from VLLM_CPU_KVCACHE_SPACE, not from the profiling pass: a restart sizes the same.
    assert entry["capacity"]["kv_cache_tokens_warm"] == entry["capacity"]["kv_cache_tokens"] == 524_288
    assert entry["estimates_warm"]["activation_peak_bytes"] == entry["estimates"]["activation_peak_bytes"]
    assert entry["kv_cache_band"] == {"low_tokens": 498_073, "high_tokens": 550_503, "tolerance_pct": 5.0}
    bad = plan("cpu-lab-tiny", gpu=gpu, version="0.32.0", vllm_environment={"VLLM_CPU_KVCACHE_SPACE": "one"})
    assert bad["errors"] == [
        "h1: vllm_environment.VLLM_CPU_KVCACHE_SPACE='one' is not a size; fix: give bytes for "
        'kv_cache_memory_bytes (1073741824 or 1G), GiB for VLLM_CPU_KVCACHE_SPACE ("1")'
    ]
    assert plan("cpu-lab-tiny", gpu=dict(gpu, count=-1), version="0.32.0")["errors"][0].startswith(
        "h1: vllm_gpu.count=-1 must be a positive integer"
    )


# --- the checks ------------------------------------------------------------------------------------
def test_a_model_that_does_not_fit():
    entry = plan(
        profile={
            "model": "Qwen/Qwen2.5-14B-Instruct",
            "gpu_memory_utilization": 0.92,
            "max_model_len": 8192,
            "max_num_seqs": 64,
            "max_num_batched_tokens": 8192,
        }
    )
    c = entry["capacity"]
    assert c["fits"] is False and c["kv_cache_bytes"] < 0 and c["kv_cache_tokens"] == 0
    assert c["weights_bytes"] == 29_540_067_328  # 27.51 GiB of bf16 weights on a 24 GiB card
    (error,) = entry["errors"]
    assert error.startswith(
        "h1: Qwen/Qwen2.5-14B-Instruct does not fit: NVIDIA GeForce RTX 4090 23.99 GiB x "
        "gpu_memory_utilization 0.92 = 22.07 GiB; weights 27.51 GiB"
    )
    assert (
        "fix: the smallest placement that fits is 2 x NVIDIA GeForce RTX 4090 per instance (tensor_parallel_size: 2;"
        " the host has 1), or a quantized checkpoint (AWQ)"
    ) in error


def test_kv_cache_below_max_model_len():
    entry = plan(
        profile={
            "model": "Qwen/Qwen2.5-7B-Instruct",
            "gpu_memory_utilization": 0.72,
            "max_model_len": 32768,
            "max_num_seqs": 64,
            "max_num_batched_tokens": 8192,
        }
    )
    # 0.72 x 24564 MiB - 15.23e9 weights - 1.22e9 activations - 0.38e9 non-torch - 0.36e9 CUDA graphs (0.33.0
    # reserves them) = 1.36e9 B / 57,344 B = 23,712 tokens
    assert entry["capacity"]["kv_cache_tokens"] == 23_712
    assert entry["errors"] == [
        "h1: the KV cache holds 23,712 tokens (1.27 GiB at 57,344 B/token), below max_model_len=32,768: vLLM refuses "
        "to start; fix: max_model_len <= 23,712, kv_cache_dtype: fp8, a quantized checkpoint or a higher "
        "gpu_memory_utilization, or the smallest placement that fits is 2 x NVIDIA GeForce RTX 4090 per instance "
        "(tensor_parallel_size: 2; the host has 1)"
    ]


def test_utilization_above_095():
    entry = plan("rtx4090-7b-prefill", {"gpu_memory_utilization": 0.97})
    assert entry["errors"] == [
        "h1: gpu_memory_utilization=0.97 is above 0.95: the tuning reference's limit (the CUDA context, "
        "fragmentation and other processes need the rest); fix: 0.90-0.95"
    ]


def test_token_budget_below_max_model_len_without_chunked_prefill():
    entry = plan("rtx4090-7b-prefix-heavy", {"enable_chunked_prefill": False})
    assert entry["errors"] == [
        "h1: max_num_batched_tokens=4,096 < max_model_len=8,192 with chunked prefill off: a prompt longer than 4,096 "
        "tokens can never be scheduled; fix: enable_chunked_prefill: true or max_num_batched_tokens >= 8,192"
    ]
    assert plan("rtx4090-7b-prefix-heavy")["errors"] == []


def test_token_budget_that_max_num_seqs_cannot_fill():
    entry = plan("rtx4090-7b-prefill", {"max_num_seqs": 4}, vllm_typical_prompt_tokens=512)
    assert entry["warnings"] == [
        "h1: max_num_seqs=4 x typical prompt 512 tokens = 2,048 < max_num_batched_tokens=8,192: the token budget "
        "never fills; fix: max_num_seqs >= 16 or max_num_batched_tokens = 2,048"
    ]


def test_max_model_len_beyond_the_models_positions():
    entry = plan(
        "cpu-lab-tiny",
        {"max_model_len": 8192, "max_num_batched_tokens": 8192},
        gpu=LAB,
        version="0.32.0",
        vllm_extra_args={"kv_cache_memory_bytes": 1 << 28},
    )
    assert (
        "h1: max_model_len=8,192 exceeds lab/tiny-qwen2's max_position_embeddings=4,096: vLLM refuses it; fix: "
        "max_model_len <= 4,096" in entry["errors"]
    )


@pytest.mark.parametrize(
    "hostvars,message",
    [
        ({"vllm_gpu": None}, "h1: vllm_gpu=None is not a mapping; fix: set vllm_gpu to {name: ..., memory_mib: ..."),
        (
            {"vllm_gpu": {"name": "RTX 4090", "memory_mib": "24 GB", "bandwidth_gb_s": 1008, "count": 1}},
            "h1: vllm_gpu.memory_mib='24 GB' must be a positive integer",
        ),
        ({"vllm_gpu": {"name": "RTX 4090", "memory_mib": 24564, "count": 1}}, "h1: vllm_gpu.bandwidth_gb_s is missing"),
        ({"vllm_version": None}, 'h1: vllm_version is not set; fix: set it in group_vars, e.g. vllm_version: "0.33.0"'),
        ({"vllm_version": 0.33}, "h1: vllm_version=0.33 is a float, not a string; fix: quote it"),
        ({"vllm_typical_prompt_tokens": 0}, "h1: vllm_typical_prompt_tokens=0 must be a positive integer"),
        (
            {"vllm_profile": {"model": "mistralai/Mistral-7B-Instruct-v0.3"}},
            "h1: model 'mistralai/Mistral-7B-Instruct-v0.3' is not in the catalogue",
        ),
        (
            {"vllm_model_config": "/nonexistent/config.json"},
            "h1: model config '/nonexistent/config.json' cannot be read",
        ),
        ({"vllm_profile": {"tensor_parallel_size": 2}}, "h1: tensor_parallel_size=2 but the host has 1 GPU(s)"),
        (
            {"vllm_profile": {"quantization": "awq", "dtype": None}},
            "h1: quantization='awq' but Qwen/Qwen2.5-7B-Instruct's config.json has "
            "no quantization_config: vLLM refuses to start",
        ),
        (
            {"vllm_profile": {"speculative": {"model": "Qwen/Qwen2.5-3B-Instruct"}}},
            "h1: draft model 'Qwen/Qwen2.5-3B-Instruct' is not in the catalogue",
        ),
        ({"vllm_extra_args": {"max_model_len": 4096}}, "h1: vllm_extra_args.max_model_len duplicates a profile key"),
        (
            {"vllm_extra_args": {"kv_cache_memory_bytes": "lots"}},
            "h1: vllm_extra_args.kv_cache_memory_bytes='lots' is not",
        ),
        ({"vllm_profile_name": "l40-14b"}, "h1: vllm_profile_name='l40-14b' is not a shipped profile"),
    ],
)
def test_bad_host_inputs(hostvars, message):
    base = {"vllm_profile_name": "rtx4090-7b-decode", "vllm_gpu": RTX4090, "vllm_version": "0.33.0"}
    entry = planner.plan_host("h1", {**base, **hostvars})
    assert any(e.startswith(message) for e in entry["errors"]), entry["errors"]
    assert all("fix" in e for e in entry["errors"])


def test_model_outside_the_catalogue_from_its_config_json(tmp_path):
    config = dict(catalogue.catalogue()["Qwen/Qwen2.5-7B-Instruct"]["config"], num_hidden_layers=14)
    (tmp_path / "config.json").write_text(json.dumps(config))
    entry = plan(
        profile={"model": "acme/half-qwen", "max_model_len": 8192, "max_num_batched_tokens": 8192, "max_num_seqs": 64},
        vllm_model_config=str(tmp_path),
    )
    assert entry["errors"] == [] and entry["capacity"]["kv_bytes_per_token"] == 57_344 // 2
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "mamba"}))
    entry = plan(profile={"model": "acme/mamba"}, vllm_model_config=str(tmp_path / "config.json"))
    assert "architecture model_type='mamba' is not one the planner can size" in entry["errors"][0]


def test_plan_json_contract():
    result = planner.plan_hosts(
        {
            "b": {"vllm_profile_name": "rtx4090-7b-decode", "vllm_gpu": RTX4090, "vllm_version": "0.33.0"},
            "a": {"vllm_profile_name": "nope", "vllm_gpu": RTX4090, "vllm_version": "0.33.0"},
        }
    )
    assert list(result) == ["hosts", "vllm_fleet_version"] and list(result["hosts"]) == ["a", "b"]
    assert result["vllm_fleet_version"] == __version__
    for entry in result["hosts"].values():
        assert {"profile", "vllm_version", "instances", "dropped", "errors", "warnings", "capacity"} <= set(entry)
        assert set(entry["capacity"]) == set(planner.CAPACITY_KEYS)
    good = result["hosts"]["b"]["capacity"]
    assert all(isinstance(good[k], int) and not isinstance(good[k], bool) for k in planner.CAPACITY_KEYS if k != "fits")
    assert result["hosts"]["a"]["capacity"]["fits"] is False
    json.dumps(result)
    lines = planner.table(result)
    assert lines[0].split()[:3] == ["host", "profile", "vllm"]
    assert any(line.startswith("b ") and "149,888" in line for line in lines)
    assert any(line.startswith(("ERROR h1", "ERROR a: ")) for line in lines)


def test_a_large_fleets_table_starts_with_a_summary_and_groups_alike_hosts():
    """Above TABLE_MAX_ROWS hosts: a summary line first, one row per group of hosts that plan alike, every error
    in full, each warning once with its hosts; a small fleet keeps a row per host."""
    hosts = {
        f"h{i:03d}": {
            "vllm_profile_name": "rtx4090-7b-decode" if i % 2 else "rtx4090-7b-prefill",
            "vllm_gpu": RTX4090,
            "vllm_version": "0.33.0",
        }
        for i in range(100)
    }
    hosts["h007"] = {"vllm_profile_name": "nope", "vllm_gpu": RTX4090, "vllm_version": "0.33.0"}
    lines = planner.table(planner.plan_hosts(hosts))
    assert lines[0].startswith("100 hosts: 50 ok, 49 with warnings, 1 with errors; 3 groups")
    rows = [line for line in lines if line.startswith("h0")]
    assert len(rows) == 3 and any(line.startswith("h000 (+49 alike)") for line in rows)
    assert [line for line in lines if line.startswith("ERROR")] == [
        f"ERROR {m}" for m in planner.plan_host("h007", hosts["h007"])["errors"]
    ]
    speculative = [line for line in lines if "speculative decoding with max_num_seqs=64" in line]
    assert len(speculative) == 1 and speculative[0].startswith("warn  (49 hosts: h001, h003, h005 and 46 more) ")
    # The tuning reference's service levels the estimate misses: once each, with the hosts, apart from the warnings.
    slo = [line for line in lines if line.startswith("slo")]
    assert slo and all(
        "above the tuning reference's 500 ms" in line or "below the tuning reference's 35-55" in line for line in slo
    ), slo
    assert any(line.startswith("slo   (50 hosts: h000, h002, h004 and 47 more) ") for line in slo), slo
    assert len(lines) < 15 + len(slo)
    small = planner.table(planner.plan_hosts(dict(list(hosts.items())[: planner.TABLE_MAX_ROWS])))
    assert small[0].split()[:3] == ["host", "profile", "vllm"]
    assert sum(line.startswith("h0") for line in small) == planner.TABLE_MAX_ROWS


def test_kv_cache_that_cannot_hold_max_num_seqs_typical_requests():
    entry = plan("rtx4090-7b-prefill", {"max_num_seqs": 256})
    # 113,552 tokens of bf16 KV < 256 requests x (512 + 256) tokens = 196,608
    assert entry["warnings"] == [
        "h1: the KV cache holds 113,552 tokens, less than max_num_seqs=256 requests of typical length 768 (512 prompt "
        "+ 256 output) = 196,608: expect preemptions; fix: max_num_seqs <= 147, kv_cache_dtype: fp8, or a quantized "
        "model"
    ]
    # fp8 KV: 227,104 tokens hold them (on the 4090 it now also needs them: more than 147 such requests)
    assert plan("rtx4090-7b-prefill", {"max_num_seqs": 256, "kv_cache_dtype": "fp8"})["warnings"] == []


def test_fp8_kv_on_ada_that_buys_no_capacity_is_flagged():
    """Run 4 (docs/gpu-results.md): rtx4090-7b-prefill at the tuning reference's load, 64 users x 1,536 tokens, gave
    7,005.9 output tok/s with a bf16 cache (FlashAttention 2) and 6,419.3 with fp8 (Triton attention on Ada):
    fp8 bought no capacity for 8.4 % of throughput. The planner says so where the bf16 cache holds the load."""
    fp8 = {"kv_cache_dtype": "fp8", "calculate_kv_scales": True}
    (warning,) = plan("rtx4090-7b-prefill", fp8, vllm_typical_prompt_tokens=1024, vllm_typical_output_tokens=512)[
        "warnings"
    ]
    assert warning == (
        "h1: kv_cache_dtype=fp8 buys no capacity here: a 16-bit cache would hold 113,552 tokens, enough for "
        "max_num_seqs=64 requests of typical length 1536 (98,304); on NVIDIA GeForce RTX 4090 (Ada) vLLM runs an "
        "fp8 cache on Triton attention, which cost 8.4 % output throughput against bf16 on FlashAttention 2 "
        "(rtx4090-7b-prefill, docs/gpu-results.md); fix: kv_cache_dtype: auto (calculate_kv_scales: null), or "
        "keep fp8 for more than 73 such requests"
    )
    assert plan("rtx4090-7b-prefill", vllm_typical_prompt_tokens=1024, vllm_typical_output_tokens=512)["warnings"] == []
    # where fp8 is what holds the load, no word: 80 users of 1,536 tokens need 122,880 > 113,552
    assert (
        plan(
            "rtx4090-7b-prefill",
            dict(fp8, max_num_seqs=80),
            vllm_typical_prompt_tokens=1024,
            vllm_typical_output_tokens=512,
        )["warnings"]
        == []
    )
    # not measured, not flagged: Hopper (FlashAttention 3 reads fp8), float16 AWQ models, a draft model
    assert not any("buys no capacity" in w for w in plan("rtx4090-7b-prefill", fp8, gpu=H200)["warnings"])
    assert not any("buys no capacity" in w for w in plan("rtx4090-7b-awq")["warnings"])
    assert not any("buys no capacity" in w for w in plan("rtx4090-7b-decode")["warnings"])
    assert not any("buys no capacity" in w for w in plan("l40-14b-awq-prefill", gpu=L40)["warnings"])


def test_ada_is_told_by_the_detected_compute_capability_before_the_name():
    """The nvidia_driver role publishes the detected compute capability (the plan maps it into vllm_gpu); the Ada rule
    reads it, and falls back to the card's name only for a vllm_gpu without one (a group's assumption)."""
    fp8 = {"kv_cache_dtype": "fp8", "calculate_kv_scales": True}
    load = {"vllm_typical_prompt_tokens": 1024, "vllm_typical_output_tokens": 512}

    def flagged(gpu):
        return any("buys no capacity" in w for w in plan("rtx4090-7b-prefill", fp8, gpu=gpu, **load)["warnings"])

    unnamed_ada = dict(RTX4090, name="NVIDIA RTX 5880 Ada Generation", compute_cap="8.9")  # not in ADA_GPUS
    assert not sizing.ADA_GPUS.search(unnamed_ada["name"]) and flagged(unnamed_ada)
    assert flagged(dict(RTX4090, compute_cap=8.9))  # an unquoted YAML number reads the same
    assert not flagged(dict(RTX4090, compute_cap="9.0"))  # the detected capability wins over the name
    assert flagged(RTX4090) and flagged(dict(RTX4090, compute_cap=""))  # none known: by name
    (error,) = plan("rtx4090-7b-prefill", gpu=dict(RTX4090, compute_cap="Ada"))["errors"]
    assert error == (
        "h1: vllm_gpu.compute_cap='Ada' must be a compute capability such as \"8.9\" (a quoted string; "
        "nvidia-smi --query-gpu=compute_cap prints it), or be left out"
    )


def test_draft_with_another_vocab_size_is_refused_as_vllm_refuses_it():
    """vLLM 0.26.0 on the H200 (docs/gpu-results.md) refused the tuning reference's decode profile: "Target and draft
    model should have the same vocabulary size. Target model vocab_size=152064. Draft model vocab_size=151936."
    The shipped profiles map the vocabularies (use_heterogeneous_vocab: true), which vLLM then accepted."""
    for name, gpu in (("rtx4090-7b-decode", RTX4090), ("l40-14b-decode", L40)):
        assert plan(name, gpu=gpu, version="0.26.0")["errors"] == []
        as_guide = plan(name, {"speculative": {"use_heterogeneous_vocab": None}}, gpu=gpu, version="0.26.0")
        assert len(as_guide["errors"]) == 1
        assert "has vocab_size=151,936, the target" in as_guide["errors"][0]
        assert "152,064: vLLM refuses to start" in as_guide["errors"][0]
        assert "fix: speculative.use_heterogeneous_vocab: true" in as_guide["errors"][0]
        assert as_guide["capacity"]["kv_cache_tokens"] > 0  # still sized, for the report
    same_vocab = plan(
        "rtx4090-7b-decode",
        {"speculative": {"model": "Qwen/Qwen2.5-7B-Instruct-AWQ", "use_heterogeneous_vocab": None}},
        version="0.26.0",
    )
    assert not any("vocab_size" in e for e in same_vocab["errors"])


def test_float16_model_with_fp8_kv_on_hopper_is_refused_where_vllm_crashed():
    """vLLM 0.26.0 on the H200 sized the KV cache of rtx4090-7b-awq, then crashed in FlashAttention 3's
    graph capture ("For FP8 input, output must have dtype BF16"; docs/gpu-results.md). With
    attention_config flash_attn_version 2 the same profile served there (fp8 KV on Triton attention)."""
    entry = plan("rtx4090-7b-awq", gpu=H200, version="0.26.0")
    (error,) = entry["errors"]
    assert error.startswith(
        "h1: Qwen/Qwen2.5-7B-Instruct-AWQ runs in float16 with kv_cache_dtype=fp8 on NVIDIA H200: "
        "vLLM 0.26.0 crashed at start"
    )
    assert (
        "output must have dtype BF16" in error
        and "fix: vllm_extra_args.attention_config: {flash_attn_version: 2}" in error
    )
    other_release = plan("rtx4090-7b-awq", gpu=H200, version="0.33.0")
    assert other_release["errors"] == [] and "(not tried with 0.33.0)" in other_release["warnings"][0]
    for extra in ({"attention_config": {"flash_attn_version": 2}}, {"attention_config": '{"flash_attn_version": 2}'}):
        assert plan("rtx4090-7b-awq", gpu=H200, version="0.26.0", vllm_extra_args=extra)["errors"] == []
    assert (
        plan("rtx4090-7b-awq", {"kv_cache_dtype": "auto", "calculate_kv_scales": None}, gpu=H200, version="0.26.0")[
            "errors"
        ]
        == []
    )
    assert plan("rtx4090-7b-prefill", gpu=H200, version="0.26.0")["errors"] == []  # bf16 model: FA3 takes fp8
    assert plan("rtx4090-7b-awq", version="0.26.0")["errors"] == []  # Ada: no FlashAttention 3
    # the detected compute capability decides before the name: Hopper (9.0) under a name the regex misses
    # is refused, an Ada card (8.9) is not
    assert plan("rtx4090-7b-awq", gpu=dict(H200, name="NVIDIA Hopper Sample", compute_cap="9.0"), version="0.26.0")[
        "errors"
    ]
    assert plan("rtx4090-7b-awq", gpu=dict(RTX4090, compute_cap="8.9"), version="0.26.0")["errors"] == []


@pytest.mark.parametrize(
    "name,hopper",
    [
        ("NVIDIA H100 80GB HBM3", True),
        ("NVIDIA GH200 480GB", True),
        ("NVIDIA H20", True),
        ("NVIDIA H800", True),
        ("NVIDIA GeForce RTX 4090", False),
        ("NVIDIA L40", False),
        ("NVIDIA L40S", False),
        ("NVIDIA A100-SXM4-80GB", False),
    ],
)
def test_the_fa3_rule_matches_hopper_names_only(name, hopper):
    entry = plan("rtx4090-7b-awq", gpu=dict(H200, name=name), version="0.26.0")
    assert bool(entry["errors"]) is hopper, entry["errors"]


# --- the plan is what the unit runs -------------------------------------------------------------------------
def test_the_plan_renders_the_units_arguments_with_the_hosts_model_folders_bind_address_and_port():
    entry = plan(
        "rtx4090-7b-decode",
        vllm_state_dir="/srv/vllm",
        vllm_model_source="url",
        vllm_model_src="",
        vllm_model_url="http://mirror/m",
        vllm_draft_model_source=None,
        vllm_draft_model_src="",
        vllm_draft_model_url="http://mirror/d",
        vllm_bind_address="10.0.0.5",
        vllm_port=8100,
    )
    assert entry["errors"] == []
    args = entry["instances"][0]["args"]
    assert args[0] == "/srv/vllm/models/Qwen--Qwen2.5-7B-Instruct" == entry["model_dir"]
    assert args[args.index("--host") + 1] == "10.0.0.5" and args[args.index("--port") + 1] == "8100"
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec["model"] == "/srv/vllm/models/Qwen--Qwen2.5-0.5B-Instruct" == entry["draft_model_dir"]
    assert entry["profile_effective"]["model"] == "Qwen/Qwen2.5-7B-Instruct"
    assert entry["gpu"] == {"name": "NVIDIA GeForce RTX 4090", "count": 1, "memory_mib": 24564}


def test_a_model_used_in_place_is_served_from_its_own_path():
    entry = plan(
        "rtx4090-7b-awq",
        vllm_state_dir="/srv/vllm",
        vllm_model_source="path",
        vllm_model_src="/models/shared/qwen-awq",
        vllm_bind_address="0.0.0.0",
        vllm_port=8000,
    )
    assert entry["instances"][0]["args"][0] == "/models/shared/qwen-awq"


# --- vllm_extra_args: one gate, at plan time ------------------------------------------------------------------
from vllm_fleet import placement, profiles, render  # noqa: E402

WALK_VALUE = "walk-value-7c1e"  # distinctive: it must be in each message, unless the key is a secret


@pytest.mark.parametrize("key", sorted(render.MANAGED_EXTRA_ARGS))
def test_every_managed_key_is_refused_at_plan_time_naming_host_key_value_and_the_setting(key):
    """Each key of render.MANAGED_EXTRA_ARGS (the one list), given through vllm_extra_args, is a plan error that names
    the host, the key and the setting to use instead; the value is shown unless the key is a secret (api_key)."""
    setting = render.MANAGED_EXTRA_ARGS[key]
    for version in ("0.33.0", "0.17.0"):
        entry = plan(
            "rtx4090-7b-decode",
            version=version,
            vllm_extra_args={key: WALK_VALUE},
            vllm_api_key="",
            vllm_shutdown_timeout=0,
        )
        mine = [e for e in entry["errors"] if e.startswith(f"h1: vllm_extra_args.{key}")]
        assert len(mine) == 1, entry["errors"]
        (message,) = mine
        assert setting in message and "fix:" in message, message
        if key == "api_key":
            assert WALK_VALUE not in message and "(value not shown)" in message and "ansible-vault" in message
        else:
            assert WALK_VALUE in message, message
        assert (
            entry["instances"] == []
            and planner.instances(
                "h1",
                {
                    "vllm_profile_name": "rtx4090-7b-decode",
                    "vllm_gpu": RTX4090,
                    "vllm_version": version,
                    "vllm_extra_args": {key: WALK_VALUE},
                },
            )
            == []
        )


def test_the_managed_list_holds_what_the_role_and_the_placement_set_and_every_profile_key():
    managed = set(render.MANAGED_EXTRA_ARGS)
    assert {
        "host",
        "port",
        "shutdown_timeout",
        "api_key",
        "served_model_name",
        "model",
        "tensor_parallel_size",
        "speculative_config",
        "speculative_model",
        "num_speculative_tokens",
        "speculative_draft_tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
        "device",
    } <= managed
    assert set(profiles.PROFILE_KEYS) <= managed
    assert {key for _, needs in placement.TP_NEEDS for key in needs["args"]} <= managed
    # What plan_host itself renders beyond the profile (an L40 pair: --disable-custom-all-reduce too) is managed.
    entry = plan(
        "l40-14b-awq-prefill",
        gpu=dict(L40, count=2),
        profile={"tensor_parallel_size": 2},
        vllm_bind_address="10.0.0.5",
        vllm_port=8100,
        vllm_shutdown_timeout=30,
    )
    assert entry["errors"] == [], entry["errors"]
    args = entry["instances"][0]["args"]
    profile_flags = set(render.render_args(entry["profile_effective"], "0.33.0").args)
    own = {a[2:].replace("-", "_") for a in args if a.startswith("--") and a not in profile_flags}
    assert own == {"host", "port", "shutdown_timeout", "disable_custom_all_reduce"} and own <= managed


@pytest.mark.parametrize(
    "extra", [{"shutdown_timeout": 20}, {"host": "0.0.0.0"}, {"port": 9000}, {"disable_custom_all_reduce": True}]
)
def test_a_key_the_role_also_sets_is_a_plan_error_not_a_crash(extra):
    """These raised a TypeError (dict() got multiple values) in plan_host and in instances()."""
    hostvars = {
        "vllm_profile_name": "l40-14b-awq-prefill",
        "vllm_gpu": dict(L40, count=2),
        "vllm_profile": {"tensor_parallel_size": 2},
        "vllm_version": "0.33.0",
        "vllm_bind_address": "0.0.0.0",
        "vllm_port": 8000,
        "vllm_shutdown_timeout": 30,
        "vllm_extra_args": extra,
    }
    entry = planner.plan_host("h1", hostvars)
    (key,) = extra
    (message,) = entry["errors"]
    assert message.startswith(f"h1: vllm_extra_args.{key}=") and render.MANAGED_EXTRA_ARGS[key] in message
    assert planner.instances("h1", hostvars) == []


def test_an_api_key_in_extra_args_is_refused_and_never_shown():
    secret = "sk-extra-0123456789"
    entry = plan("rtx4090-7b-decode", vllm_extra_args={"api_key": secret})
    (message,) = entry["errors"]
    assert message.startswith("h1: vllm_extra_args.api_key (value not shown)") and "vllm_api_key" in message
    assert secret not in json.dumps(entry) and "ansible-vault" in message


def test_a_flag_the_release_removed_is_an_error_when_the_operator_gives_it():
    """The profile's swap_space is dropped with a warning; vllm_extra_args.swap_space given on 0.33 is refused,
    with the table's reason (what is nearest now)."""
    entry = plan("rtx4090-7b-decode", profile={"swap_space": None}, vllm_extra_args={"swap_space": 4})
    (message,) = entry["errors"]
    assert message.startswith("h1: vllm_extra_args.swap_space=4: vLLM 0.33.0 no longer has --swap-space")
    assert "--kv-offloading-size" in message and "fix: remove vllm_extra_args.swap_space" in message
    (message,) = plan(
        "rtx4090-7b-decode", profile={"calculate_kv_scales": None}, vllm_extra_args={"calculate_kv_scales": True}
    )["errors"]
    assert "no longer has --calculate-kv-scales" in message and "nothing replacing it" in message
    # The profile's own swap_space stays a drop with its reason.
    kept = plan("rtx4090-7b-decode", profile={"swap_space": 4})
    assert kept["errors"] == [] and "--swap-space" in {d["flag"] for d in kept["dropped"]}


@pytest.mark.parametrize("character", ["\n", "\u2028", "\u2029", "\u0085", "\u200b", "\ufeff", "\x1b"])
def test_a_served_name_or_model_with_a_line_break_is_refused_in_the_plan(character):
    for key in ("served_model_name", "model"):
        entry = plan("rtx4090-7b-decode", profile={key: "tiny" + character + "qwen"})
        (message,) = entry["errors"]
        assert message.startswith(f"h1: {key}=") and "control or format character" in message
        assert f"U+{ord(character):04X}" in message and f"vllm_profile.{key}" in message and character not in message
        assert entry["instances"] == []
    (message,) = plan(
        "rtx4090-7b-decode",
        profile={"speculative": {"model": "Qwen/Qwen2.5-0.5B-Instruct" + character, "num_speculative_tokens": 3}},
    )["errors"]
    assert message.startswith("h1: speculative.model=") and "vllm_profile.speculative.model" in message


@pytest.mark.parametrize("value", ["eager\u2028", "x\u0085y", ["a", "b\n"], {"k": "v\u2029"}])
def test_an_extra_args_string_with_a_line_break_is_refused(value):
    (message,) = plan("rtx4090-7b-decode", vllm_extra_args={"chat_template": value})["errors"]
    assert message.startswith("h1: vllm_extra_args.chat_template=") and "control or format character" in message
    assert "fix: remove it" in message


@pytest.mark.parametrize("speculative", [[{"model": "Qwen/Qwen2.5-0.5B-Instruct"}], "Qwen/Qwen2.5-0.5B-Instruct", 5])
def test_speculative_that_is_not_a_mapping_names_the_host_and_the_setting(speculative):
    """A list raised an AttributeError in plan_host."""
    entry = plan("rtx4090-7b-decode", profile={"speculative": speculative})
    (message,) = entry["errors"]
    assert message.startswith("h1: speculative=") and "must be a mapping" in message
    assert "fix: give vllm_profile.speculative as a mapping" in message
    assert (
        planner.instances(
            "h1",
            {
                "vllm_profile_name": "rtx4090-7b-decode",
                "vllm_gpu": RTX4090,
                "vllm_version": "0.33.0",
                "vllm_profile": {"speculative": speculative},
            },
        )
        == []
    )


def test_speculative_model_in_extra_args_names_host_setting_value_and_fix():
    (message,) = plan("rtx4090-7b-decode", vllm_extra_args={"speculative_model": "Qwen/Qwen2.5-0.5B-Instruct"})[
        "errors"
    ]
    assert message.startswith("h1: vllm_extra_args.speculative_model='Qwen/Qwen2.5-0.5B-Instruct': ")
    assert "--speculative-config" in message and "fix: set vllm_profile.speculative.model instead" in message


@pytest.mark.parametrize(
    "hostvars,message",
    [
        ({"vllm_version": ["0.33.0"]}, "h1: vllm_version=['0.33.0'] is a list, not a string; fix: quote it"),
        ({"vllm_version": {"v": 1}}, "h1: vllm_version={'v': 1} is a dict, not a string"),
        ({"vllm_profile_name": ["rtx4090-7b-decode"]}, "h1: vllm_profile_name=['rtx4090-7b-decode'] is not a shipped"),
        ({"vllm_model_config": ["/x/config.json"]}, "h1: vllm_model_config=['/x/config.json'] is not a path; fix:"),
        ({"vllm_draft_model_config": 3.5}, "h1: vllm_draft_model_config=3.5 is not a path; fix:"),
        ({"vllm_extra_args": ["--enforce-eager"]}, "h1: vllm_extra_args=['--enforce-eager'] is not a dict; fix:"),
        (
            {"vllm_extra_args": {"enforce_eager\n": True}},
            "h1: vllm_extra_args key 'enforce_eager\\n' is not a snake_case",
        ),
        ({"vllm_extra_args": {"block_size": [{"a": 1}]}}, "h1: vllm_extra_args.block_size=[{'a': 1}] is not a value"),
        ({"vllm_environment_allow": [["PYTHONPATH"]]}, None),
    ],
)
def test_inputs_of_the_wrong_kind_are_messages_not_exceptions(hostvars, message):
    """Each of these raised a TypeError or AttributeError in plan_host or instances()."""
    base = {"vllm_profile_name": "rtx4090-7b-decode", "vllm_gpu": RTX4090, "vllm_version": "0.33.0"}
    entry = planner.plan_host("h1", {**base, **hostvars})
    if message is not None:
        assert any(e.startswith(message) for e in entry["errors"]), entry["errors"]
    assert all(e.startswith("h1: ") and "fix" in e for e in entry["errors"])
    planner.instances("h1", {**base, **hostvars})


def test_unplanned_names_the_host_and_where_but_not_the_exceptions_text():
    try:
        int("sk-secret-42")
    except ValueError as exc:
        entry = planner.unplanned("h1", {"vllm_profile_name": "rtx4090-7b-decode", "vllm_version": "0.33.0"}, exc)
    (message,) = entry["errors"]
    assert message.startswith("h1: the plan could not be made") and "ValueError" in message and "fix:" in message
    assert "sk-secret-42" not in message and entry["instances"] == [] and entry["profile"] == "rtx4090-7b-decode"
    assert set(entry) >= {"profile", "vllm_version", "instances", "dropped", "errors", "warnings", "capacity"}
