#!/usr/bin/env python3
"""Build the lab's tiny Qwen2-architecture model locally (no hub), with a checksum manifest.

    lab/scripts/build-tiny-model.py [OUTDIR]      (default: .cache/connected/models/lab/tiny-qwen2)

The model is real in every way vLLM cares about (a Qwen2 config.json, a byte-level BPE tokenizer
trained here with the `tokenizers` library, a chat template, random bf16 safetensors weights), only
small: 2 layers, hidden 256, 4 heads of 64, 2 KV heads, vocabulary 2048. It answers with nonsense text,
which is all a smoke test needs. Deterministic: same seed, same bytes, same SHA256SUMS.
"""

import hashlib
import json
import pathlib
import sys

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB, MAX_POS = 256, 2, 4, 2, 64, 512, 2048, 4096
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "vLLM serves large language models with paged attention and continuous batching.",
    "The prefill phase processes the prompt; the decode phase generates one token at a time.",
    "Chunked prefill mixes prompt chunks with decode steps to keep inter-token latency low.",
    "Prefix caching reuses the KV cache of a shared system prompt across requests.",
    "An RTX 4090 has 24 GB of memory and an L40 has 48 GB; both are Ada Lovelace cards.",
    "Hello, how are you today? I am fine, thank you. What can I do for you?",
    "The quick brown fox jumps over the lazy dog. 0123456789",
] * 50


def build_tokenizer(out: pathlib.Path) -> None:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "model_max_length": MAX_POS,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
        + "\n"
    )


def build_weights(out: pathlib.Path) -> None:
    rng = np.random.default_rng(20261129)

    def w(*shape):
        # bf16 is not a numpy dtype: keep the upper half of float32's bits (what bf16 is).
        f32 = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
        return (f32.view(np.uint32) >> 16).astype(np.uint16)

    tensors = {"model.embed_tokens.weight": w(VOCAB, HIDDEN), "model.norm.weight": None}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors.update(
            {
                p + "self_attn.q_proj.weight": w(HEADS * HEAD_DIM, HIDDEN),
                p + "self_attn.q_proj.bias": w(HEADS * HEAD_DIM),
                p + "self_attn.k_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
                p + "self_attn.k_proj.bias": w(KV_HEADS * HEAD_DIM),
                p + "self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
                p + "self_attn.v_proj.bias": w(KV_HEADS * HEAD_DIM),
                p + "self_attn.o_proj.weight": w(HIDDEN, HEADS * HEAD_DIM),
                p + "mlp.gate_proj.weight": w(INTER, HIDDEN),
                p + "mlp.up_proj.weight": w(INTER, HIDDEN),
                p + "mlp.down_proj.weight": w(HIDDEN, INTER),
                p + "input_layernorm.weight": None,
                p + "post_attention_layernorm.weight": None,
            }
        )
    ones = (np.ones(HIDDEN, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    tensors = {k: (ones if v is None else v) for k, v in tensors.items()}
    # safetensors.numpy writes uint16 as U16; write the header by hand with dtype BF16 instead.
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        data = np.ascontiguousarray(tensors[name]).tobytes()
        header[name] = {
            "dtype": "BF16",
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
        blobs.append(data)
    header["__metadata__"] = {"format": "pt"}
    hbytes = json.dumps(header, separators=(",", ":")).encode()
    hbytes += b" " * (-len(hbytes) % 8)
    with open(out / "model.safetensors", "wb") as f:
        f.write(len(hbytes).to_bytes(8, "little"))
        f.write(hbytes)
        for blob in blobs:
            f.write(blob)


def build_config(out: pathlib.Path) -> None:
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "torch_dtype": "bfloat16",
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "vocab_size": VOCAB,
        "max_position_embeddings": MAX_POS,
        "max_window_layers": LAYERS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "bos_token_id": None,
        "eos_token_id": 2,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 2, "max_new_tokens": 64}) + "\n")


def write_manifest(out: pathlib.Path) -> None:
    lines = []
    for f in sorted(p for p in out.iterdir() if p.is_file() and p.name != "SHA256SUMS"):
        lines.append(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}")
    (out / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def main() -> int:
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".cache/connected/models/lab/tiny-qwen2")
    out.mkdir(parents=True, exist_ok=True)
    build_config(out)
    build_tokenizer(out)
    build_weights(out)
    write_manifest(out)
    print(f"built {out} ({sum(p.stat().st_size for p in out.iterdir()) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
