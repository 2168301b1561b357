"""vllm_fleet.sizing: what the sizing reads itself (the instance's sizing against measured vLLM starts is tested
through planner.plan_host in test_planner.py)."""

from __future__ import annotations

import pytest

from vllm_fleet import sizing

MIB = 1 << 20


@pytest.mark.parametrize(
    "text,value",
    [("1k", 1000), ("1K", 1024), ("25.6k", 25600), ("2M", 2 * MIB), ("1g", 10**9), (1073741824, 1073741824)],
)
def test_human_readable_bytes_as_vllm_reads_them(text, value):
    assert sizing.parse_bytes(text) == value


# --- LoRA slots (issue #53) -------------------------------------------------------------------------------------------
# Every figure below is vLLM 0.26.0's allocation by hand (sizing.lora_reserve's docstring names the files): per decoder
# layer and unit of rank, qkv_proj 3 x hidden + (q + 2 kv), o_proj q + hidden, gate_up_proj 2 x hidden + 2 x
# intermediate, down_proj intermediate + hidden, each split over tensor parallelism as vLLM splits it.
import json  # noqa: E402
from pathlib import Path  # noqa: E402

from conftest import H200, L40, LAB, RTX4090  # noqa: E402
from test_planner import plan as plan_with  # noqa: E402
from vllm_fleet import catalogue, profiles  # noqa: E402

GIB = 1 << 30
QWEN7B = catalogue.lookup("Qwen/Qwen2.5-7B-Instruct")  # hidden 3584, 28 heads / 4 KV heads of 128, inter 18944
ADAPTERS = [{"name": "legal", "url": "http://mirror.site/adapters/legal"}]


def adapters(count):
    """`count` adapters: the plan refuses more LoRA slots than a host serves adapters."""
    return [{"name": f"dept-{n}", "url": f"http://mirror.site/adapters/dept-{n}"} for n in range(count)]


# Llama 3.1 8B's config.json fields the planner reads (a fixture written by hand, fixtures/models/README.md): a model
# type whose vLLM class has LoRA embedding modules.
LLAMA_8B = json.loads((Path(__file__).parents[1] / "fixtures" / "models" / "llama-3.1-8b.json").read_text())


def plan(profile_name="rtx4090-7b-prefill", profile=None, gpu=RTX4090, version="0.26.0", **more):
    """test_planner.py's plan, on the 4090 7B profile and vLLM 0.26.0 (run 15's) unless told otherwise."""
    return plan_with(profile_name, profile, gpu, version, **more)


def test_lora_slots_of_a_qwen2_block_by_hand():
    per_layer = 9 * 3584 + 2 * 512 + 3 * 18944  # 90,112 elements per unit of rank
    assert sizing.lora_reserve(QWEN7B, 4, 16, 2) == 28 * per_layer * 4 * 16 * 2 == 322_961_408  # 0.30 GiB
    assert sizing.lora_reserve(QWEN7B, 8, 64, 2) == 28 * per_layer * 8 * 64 * 2 == 2_583_691_264  # 2.41 GiB
    # the profiling pass's float32 shrink buffer: 3 slices x 4 B per batched token and unit of rank
    assert sizing.lora_reserve(QWEN7B, 4, 16, 2, batched_tokens=8192, transient_bytes=12) == (
        322_961_408 + 12 * 8192 * 16
    )


def test_lora_slots_under_tensor_parallelism_are_each_gpus_share():
    # tp 2: q (3584), kv (512) and intermediate (18944) halve where vLLM splits them; hidden stays whole
    tp2 = 3 * 3584 + (1792 + 2 * 256) + (1792 + 3584) + (2 * 3584 + 2 * 9472) + (9472 + 3584)
    assert sizing.lora_reserve(QWEN7B, 4, 16, 2, tp=2) == 28 * tp2 * 4 * 16 * 2
    # tp 8 over 4 KV heads: each GPU keeps one KV head (128), replicated
    tp8 = 3 * 3584 + (448 + 2 * 128) + (448 + 3584) + (2 * 3584 + 2 * 2368) + (2368 + 3584)
    assert sizing.lora_reserve(QWEN7B, 4, 16, 2, tp=8) == 28 * tp8 * 4 * 16 * 2
    # --fully-sharded-loras: also the column-parallel A stacks' rank and the row-parallel B stacks' outputs
    sharded = (5 * 3584 * 16 // 2) + ((1792 + 2 * 256) + 2 * 9472) * 16 + (1792 + 9472) * 16 + (2 * 3584 * 16 // 2)
    assert sizing.lora_reserve(QWEN7B, 4, 16, 2, tp=2, fully_sharded=True) == 28 * sharded * 4 * 2


def test_a_model_with_lora_embedding_modules_also_reserves_its_embedding_and_lm_head():
    llama = catalogue.architecture("meta-llama/Llama-3.1-8B", LLAMA_8B)
    layers = 32 * (9 * 4096 + 2 * 1024 + 3 * 14336)  # 81,920 per layer (docs/research: 10 MiB a layer at 4 x 16)
    embeddings = 2 * (128256 + 4096)  # embed_tokens (vocab x r, hidden x r) and the LM head's (r x hidden, vocab x r)
    assert sizing.lora_reserve(llama, 4, 16, 2) == (layers + embeddings) * 4 * 16 * 2
    # the same under tensor parallelism: vLLM does not split these slots
    assert (
        sizing.lora_reserve(llama, 4, 16, 2, tp=2)
        - sizing.lora_reserve(catalogue.architecture("m", dict(LLAMA_8B, model_type="mistral")), 4, 16, 2, tp=2)
        == embeddings * 4 * 16 * 2
    )


def test_lora_shrinks_the_kv_cache_by_exactly_its_slots():
    base = plan()
    lora = plan(vllm_lora_adapters=adapters(4), vllm_lora_max_loras=4)
    reserve = lora["estimates"]["lora_reserve_bytes"]
    assert reserve == sizing.lora_reserve(QWEN7B, 4, 16, 2, batched_tokens=8192, transient_bytes=12) == 324_534_272
    c0, c1 = base["capacity"], lora["capacity"]
    assert c0["kv_cache_bytes"] - c1["kv_cache_bytes"] == reserve
    assert c1["kv_cache_tokens"] == c1["kv_cache_bytes"] // 57_344 // 16 * 16 == 114_096
    assert c0["kv_cache_tokens"] - c1["kv_cache_tokens"] == 5_648
    # a warm restart gives up the same slots
    warm_gap = (c0["kv_cache_tokens_warm"] - c1["kv_cache_tokens_warm"]) * 57_344
    assert abs(warm_gap - reserve) < 16 * 57_344
    assert lora["notes"] == [
        "h1: LoRA: 4 slot(s) of rank 16 (vllm_lora_max_loras, vllm_lora_max_rank) take 0.30 GiB from the KV cache: "
        "114,096 tokens, 5,648 fewer than without"
    ]
    # the same other terms: only the slots differ
    assert {k: v for k, v in lora["estimates"].items() if k != "lora_reserve_bytes"} == base["estimates"]


def test_lora_defaults_are_vllms_one_slot_of_rank_16():
    entry = plan(vllm_lora_adapters=ADAPTERS)
    assert entry["estimates"]["lora_reserve_bytes"] == sizing.lora_reserve(
        QWEN7B, 1, 16, 2, batched_tokens=8192, transient_bytes=12
    )
    assert sizing.lora_settings({"vllm_lora_adapters": ADAPTERS}) == (1, 16)
    assert sizing.lora_settings({"vllm_lora_adapters": ADAPTERS, "vllm_lora_max_loras": "4"}) == (4, 16)


@pytest.mark.parametrize(
    "hostvars",
    [
        {"vllm_lora_adapters": ADAPTERS, "vllm_lora_max_loras": "four"},
        {"vllm_lora_adapters": ADAPTERS, "vllm_lora_max_rank": 0},
        {"vllm_lora_adapters": ADAPTERS, "vllm_lora_max_rank": True},
        {"vllm_lora_adapters": "legal"},
    ],
)
def test_settings_the_lora_checks_refuse_reserve_nothing_rather_than_fail(hostvars):
    assert sizing.lora_settings(hostvars) is None


def test_an_fp8_kv_cache_or_an_awq_model_takes_the_slots_in_the_models_dtype():
    fp8 = plan(profile={"kv_cache_dtype": "fp8"}, vllm_lora_adapters=adapters(4), vllm_lora_max_loras=4)
    assert fp8["estimates"]["lora_reserve_bytes"] == 324_534_272  # bf16, as without fp8
    awq = plan("rtx4090-7b-awq", vllm_lora_adapters=adapters(4), vllm_lora_max_loras=4)
    assert awq["estimates"]["lora_reserve_bytes"] == 324_534_272  # the AWQ model runs in float16: 2 B too


def test_lora_slots_that_leave_no_room_are_named_in_the_does_not_fit_message():
    entry = plan(vllm_lora_adapters=adapters(22), vllm_lora_max_loras=22, vllm_lora_max_rank=64)
    (message,) = entry["errors"]
    assert "runtime 0.35 GiB + LoRA slots 6.62 GiB leave -0.23 GiB for the KV cache" in message
    assert message.endswith(", or fewer or smaller LoRA slots (vllm_lora_max_loras=22, vllm_lora_max_rank=64)")
    short = plan(vllm_lora_adapters=adapters(21), vllm_lora_max_loras=21, vllm_lora_max_rank=64)
    (message,) = short["errors"]
    assert "holds 1,376 tokens" in message
    assert "fewer or smaller LoRA slots (vllm_lora_max_loras=21, vllm_lora_max_rank=64: 6.32 GiB per GPU)" in message


def test_on_a_cpu_host_lora_takes_host_memory_and_leaves_the_fixed_kv_cache_alone():
    hostvars = {"vllm_environment": {"VLLM_CPU_KVCACHE_SPACE": "1"}}
    base = plan(None, {"model": "Qwen/Qwen2.5-0.5B-Instruct"}, gpu=LAB, version="0.32.0", **hostvars)
    lora = plan(
        None,
        {"model": "Qwen/Qwen2.5-0.5B-Instruct"},
        gpu=LAB,
        version="0.32.0",
        vllm_lora_adapters=ADAPTERS,
        **hostvars,
    )
    assert lora["capacity"] == base["capacity"]
    assert lora["estimates"]["lora_reserve_bytes"] > 0
    assert lora["notes"][0].endswith(
        "of host memory beside the KV cache, whose size vllm-cpu fixes: it keeps its tokens"
    )


def test_without_adapters_every_shipped_profile_plans_byte_for_byte_as_before():
    """A host that serves no adapter: no reservation, no note, the same plan.json, whatever the other LoRA settings
    say (vllm_lora_max_loras alone enables nothing)."""
    for name in profiles.names():
        cpu = name.startswith("cpu-")
        for gpu in [LAB] if cpu else [dict(RTX4090, count=2), dict(L40, count=4), dict(H200, count=2)]:
            version = "0.32.0" if cpu else "0.26.0"
            before = plan(name, gpu=gpu, version=version)
            text = json.dumps(before, sort_keys=True)
            for more in ({"vllm_lora_adapters": []}, {"vllm_lora_adapters": None, "vllm_lora_max_loras": 4}):
                assert json.dumps(plan(name, gpu=gpu, version=version, **more), sort_keys=True) == text
            assert "lora_reserve_bytes" not in before.get("estimates", {}) and not any(
                "LoRA" in note for note in before["notes"]
            )
