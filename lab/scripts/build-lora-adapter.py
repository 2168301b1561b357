#!/usr/bin/env python3
"""Build a LoRA adapter for a model from its config.json alone, locally (no hub, no training), with a checksum manifest.

    lab/scripts/build-lora-adapter.py MODEL_DIR OUTDIR --base NAME [--rank 8] [--seed 1] [--alpha 16]
                                      [--targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]

The adapter is in PEFT's own format, as a fine-tune writes it (adapter_config.json with peft_type LORA, and
adapter_model.safetensors with base_model.model.<module>.lora_A/lora_B.weight), so vLLM loads it as it loads any
adapter. Its weights are RANDOM and NON-ZERO, declared as such in its config (``revision``: "random-weights,
seed N"): an adapter fresh from training has B at zero and would answer as the base model does, which a test of
routing could not tell apart. Nothing here is learned; it is an adapter of the right shapes for the model, enough to
show that a request by its name reaches an instance that loads it and is answered differently.

``--base`` is what adapter_config.json says it was trained for (base_model_name_or_path): the plan refuses an
adapter whose base is not the profile's model. Deterministic: the same inputs give the same bytes and SHA256SUMS.
"""

import argparse
import hashlib
import json
import pathlib
import sys

import numpy as np
from safetensors.numpy import save_file

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def shapes(config: dict, target: str) -> tuple[int, int]:
    """(in_features, out_features) of one linear layer of a Llama/Qwen2-style decoder block."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv = config.get("num_key_value_heads", heads) * head_dim
    inter = config["intermediate_size"]
    return {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }[target]


def build(model_dir: pathlib.Path, out: pathlib.Path, base: str, rank: int, alpha: int, seed: int, targets: list[str]):
    config = json.loads((model_dir / "config.json").read_text())
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for target in targets:
            group = "self_attn" if target in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{group}.{target}"
            fan_in, fan_out = shapes(config, target)
            # Both halves non-zero (a trained B is): the product changes the layer's output by about as much as its
            # own random weights do, so the greedy answer differs from the base model's.
            tensors[f"{prefix}.lora_A.weight"] = (rng.standard_normal((rank, fan_in)) / np.sqrt(fan_in)).astype(
                np.float32
            )
            tensors[f"{prefix}.lora_B.weight"] = (rng.standard_normal((fan_out, rank)) * 0.05).astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "revision": f"random-weights, seed {seed}",
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "target_modules": sorted(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2, sort_keys=True) + "\n")
    lines = [
        f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}"
        for f in sorted(p for p in out.iterdir() if p.is_file() and p.name != "SHA256SUMS")
    ]
    (out / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=pathlib.Path, help="the base model's folder (its config.json is read)")
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--base", required=True, help="adapter_config.json's base_model_name_or_path")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--targets", default=",".join(TARGETS))
    args = parser.parse_args()
    targets = [t for t in args.targets.split(",") if t]
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        parser.error(f"--targets: {', '.join(unknown)} unknown; fix: a comma-separated subset of {','.join(TARGETS)}")
    build(args.model_dir, args.out, args.base, args.rank, args.alpha, args.seed, targets)
    print(f"built {args.out} ({sum(p.stat().st_size for p in args.out.iterdir()) // 1024} KiB, rank {args.rank})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
