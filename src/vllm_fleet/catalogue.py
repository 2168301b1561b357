"""Model architectures: the shipped catalogue (data/models.yml) and config.json files.

The capacity planner needs, for a checkpoint: its weight bytes (at the dtype vLLM loads it with, or
packed for AWQ/GPTQ) and its KV cache bytes per token. Both follow from a handful of config.json
fields for the dense decoder-only architectures the tuning reference uses (Qwen2, Qwen3, Llama, Mistral).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any, TypedDict

from . import datafiles


class _Traits(TypedDict):
    qkv_bias: bool | None
    qk_norm: bool


# model_type -> whether q/k/v projections carry a bias, and whether q/k have a per-head RMSNorm.
_ARCHITECTURES: dict[str, _Traits] = {
    "qwen2": {"qkv_bias": True, "qk_norm": False},
    "qwen3": {"qkv_bias": False, "qk_norm": True},
    "llama": {"qkv_bias": None, "qk_norm": False},  # None: read config's attention_bias
    "mistral": {"qkv_bias": False, "qk_norm": False},
}

# dtype names (config torch_dtype / profile dtype / kv_cache_dtype) -> bytes per element.
DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
}

_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


class ModelError(ValueError):
    """A model that the planner cannot size: unknown, unreadable or an unsupported architecture."""


@dataclass(frozen=True)
class Architecture:
    """The config.json fields the planner reads."""

    name: str
    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int | None
    tie_word_embeddings: bool
    torch_dtype: str
    qkv_bias: bool
    qk_norm: bool
    quant_method: str | None = None
    quant_bits: int | None = None
    quant_group_size: int | None = None

    # --- parameter counts ------------------------------------------------------------------
    def linear_params(self) -> int:
        """Weights of the projection matrices of all layers (what AWQ/GPTQ quantize)."""
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        attention = self.hidden_size * (q + 2 * kv) + q * self.hidden_size
        mlp = 3 * self.hidden_size * self.intermediate_size
        return self.num_hidden_layers * (attention + mlp)

    def other_params(self) -> int:
        """Embeddings, LM head, norms and biases: kept at the activation dtype by AWQ/GPTQ."""
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        per_layer = 2 * self.hidden_size  # input and post-attention RMSNorm
        if self.qkv_bias:
            per_layer += (self.num_attention_heads + 2 * self.num_key_value_heads) * self.head_dim
        if self.qk_norm:
            per_layer += 2 * self.head_dim
        return embeddings + self.num_hidden_layers * per_layer + self.hidden_size  # + final norm

    def parameters(self) -> int:
        return self.linear_params() + self.other_params()

    # --- bytes -----------------------------------------------------------------------------
    def weight_bytes(self, dtype_bytes: int) -> int:
        """Bytes of the weights as vLLM holds them: dense at dtype_bytes, or packed AWQ/GPTQ
        (bits/8 per weight, plus per group of group_size inputs one dtype scale and one packed
        zero point per output) with the unquantized tensors at dtype_bytes."""
        if self.quant_method in ("awq", "gptq"):
            bits, group = self.quant_bits or 4, self.quant_group_size or 128
            linear = self.linear_params()
            packed = linear * bits // 8
            groups = linear // group  # one scale and one zero point per (group, output)
            scales = groups * dtype_bytes
            zeros = groups * bits // 8
            return packed + scales + zeros + self.other_params() * dtype_bytes
        if self.quant_method == "fp8":
            return self.linear_params() + self.other_params() * dtype_bytes
        return self.parameters() * dtype_bytes

    def kv_bytes_per_token(self, kv_dtype_bytes: int, tensor_parallel_size: int = 1) -> int:
        """K and V, every layer, every KV head (replicated when there are fewer heads than GPUs)."""
        heads = max(self.num_key_value_heads, tensor_parallel_size)
        return 2 * heads * self.head_dim * self.num_hidden_layers * kv_dtype_bytes

    def activation_dtype_bytes(self, dtype: str | None) -> int:
        """Bytes per element of the dtype vLLM runs with: `auto` follows the checkpoint, except
        that float32 checkpoints run in 16 bits and AWQ/GPTQ checkpoints in float16."""
        if dtype in (None, "auto"):
            if self.quant_method in ("awq", "gptq"):
                return 2
            return min(DTYPE_BYTES.get(self.torch_dtype, 2), 2)
        return DTYPE_BYTES[dtype]


def _int(config: Mapping[str, Any], key: str, name: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelError(
            f"model {name}: config.json field {key}={value!r} is not a positive integer; "
            "fix: point at the model's own config.json"
        )
    return value


def architecture(name: str, config: Mapping[str, Any]) -> Architecture:
    """Read an Architecture from a config.json mapping (a nested text_config is not supported)."""
    model_type = config.get("model_type")
    if model_type not in _ARCHITECTURES:
        raise ModelError(
            f"model {name}: architecture model_type={model_type!r} is not one the planner can size "
            f"(supported: {', '.join(sorted(_ARCHITECTURES))}); fix: plan it by hand, or extend vllm_fleet.catalogue"
        )
    missing = [k for k in _REQUIRED if k not in config]
    if missing:
        raise ModelError(
            f"model {name}: config.json lacks {', '.join(missing)}; fix: point at the model's own config.json"
        )
    heads = _int(config, "num_attention_heads", name)
    hidden = _int(config, "hidden_size", name)
    kv_heads = _int(config, "num_key_value_heads", name) if "num_key_value_heads" in config else heads
    head_dim = config.get("head_dim") or hidden // heads
    traits = _ARCHITECTURES[model_type]
    qkv_bias = traits["qkv_bias"]
    if qkv_bias is None:
        qkv_bias = bool(config.get("attention_bias", False))
    quant = config.get("quantization_config") or {}
    method = quant.get("quant_method")
    return Architecture(
        name=name,
        model_type=model_type,
        hidden_size=hidden,
        intermediate_size=_int(config, "intermediate_size", name),
        num_hidden_layers=_int(config, "num_hidden_layers", name),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=int(head_dim),
        vocab_size=_int(config, "vocab_size", name),
        max_position_embeddings=config.get("max_position_embeddings"),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        torch_dtype=str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"),
        qkv_bias=bool(qkv_bias),
        qk_norm=traits["qk_norm"],
        quant_method=method,
        quant_bits=quant.get("bits") or quant.get("w_bit"),
        quant_group_size=quant.get("group_size") or quant.get("q_group_size"),
    )


@lru_cache(maxsize=1)
def catalogue() -> dict[str, dict[str, Any]]:
    """The shipped catalogue: model id -> entry (source, checked_against, unverified, config)."""
    models: dict[str, dict[str, Any]] = datafiles.load("models.yml")["models"]
    return models


@cache
def _catalogue_architecture(model_id: str) -> Architecture:
    return architecture(model_id, catalogue()[model_id]["config"])


@lru_cache(maxsize=64)
def _file_architecture(path: str, mtime: float) -> Architecture:
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read the model config {path}: {exc}; fix: give a JSON config.json") from exc
    if not isinstance(config, dict):
        raise ModelError(f"the model config {path} is not a JSON object; fix: give the model's config.json")
    return architecture(path, config)


def lookup(model_id: str, config_path: str | None = None) -> Architecture:
    """The architecture of model_id: from config_path (a config.json or its folder) when given,
    else from the catalogue. Raises ModelError naming the fix."""
    if config_path:
        path = os.path.join(config_path, "config.json") if os.path.isdir(config_path) else config_path
        try:
            mtime = os.stat(path).st_mtime
        except OSError as exc:
            raise ModelError(
                f"model config {config_path!r} cannot be read: {exc.strerror}; "
                "fix: point vllm_model_config at the model's config.json (or its folder) on the controller"
            ) from exc
        return _file_architecture(path, mtime)
    if model_id in catalogue():
        return _catalogue_architecture(model_id)
    raise ModelError(
        f"model {model_id!r} is not in the catalogue ({', '.join(sorted(catalogue()))}); "
        "fix: set vllm_model_config (or the profile's model_config) to the path of its config.json on the controller"
    )
