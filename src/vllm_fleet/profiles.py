"""Host profiles: the shipped ones (data/profiles.yml), their resolution and their validation.

A profile is a dict of vLLM engine-argument names in snake_case (PROFILE_KEYS). A host names a
shipped profile (`vllm_profile_name`) and overrides single keys (`vllm_profile`); `resolve` merges
them, `validate` returns every problem as a message that names the host, the key, the value and
the fix. Cross-checks against the GPU and the model are the planner's (planner.py, sizing.py, rules.py).
"""

from __future__ import annotations

import copy
import numbers
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from . import datafiles, inputs

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
QUANTIZATIONS = ("awq", "awq_marlin", "gptq", "gptq_marlin", "fp8")
SPECULATIVE_METHODS = ("draft_model", "eagle", "eagle3", "medusa", "mlp_speculator", "mtp", "ngram", "suffix")
# Methods that run without a model of their own.
MODEL_FREE_METHODS = ("ngram", "suffix")


class ProfileError(ValueError):
    """A profile that cannot be resolved (unknown name, overrides that are not a dict)."""


def _kind(value: Any, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str) and value != ""
    if kind == "dict":
        return isinstance(value, Mapping)
    raise AssertionError(kind)


# key -> (type, one-line meaning used in messages). The order is the rendering order.
PROFILE_KEYS: dict[str, tuple[str, str]] = {
    "model": ("str", "the Hugging Face model id (or a local path on the host)"),
    "served_model_name": ("str", "the name clients ask for (default: the model id)"),
    "dtype": ("str", f"weights/activations dtype, one of {', '.join(DTYPES)}"),
    "quantization": ("str", f"weight quantization, one of {', '.join(QUANTIZATIONS)}"),
    "gpu_memory_utilization": ("number", "share of the GPU's total memory for the whole instance, 0 < x <= 1"),
    "max_model_len": ("int", "longest request in tokens (prompt + output)"),
    "max_num_seqs": ("int", "requests scheduled at once"),
    "max_num_batched_tokens": ("int", "tokens processed per scheduler step"),
    "enable_chunked_prefill": ("bool", "split long prompts into chunks of the token budget"),
    "enable_prefix_caching": ("bool", "reuse the KV cache of shared prompt prefixes"),
    "kv_cache_dtype": ("str", f"KV cache dtype, one of {', '.join(KV_CACHE_DTYPES)}"),
    "calculate_kv_scales": ("bool", "compute FP8 KV scales at start (removed in recent vLLM)"),
    "swap_space": ("number", "GiB of CPU swap for preempted requests (removed in recent vLLM)"),
    "tensor_parallel_size": ("int", "GPUs one instance spans"),
    "speculative": (
        "dict",
        "speculative decoding: model, method, num_speculative_tokens, draft_tensor_parallel_size, "
        "use_heterogeneous_vocab",
    ),
    "model_config": (
        "str",
        "controller path to the model's config.json (or its folder), for models outside the catalogue",
    ),
}
SPECULATIVE_KEYS: dict[str, tuple[str, str]] = {
    "model": ("str", "the draft model id (or EAGLE/Medusa head)"),
    "method": ("str", f"one of {', '.join(SPECULATIVE_METHODS)}"),
    "num_speculative_tokens": ("int", "tokens proposed per step"),
    "draft_tensor_parallel_size": ("int", "GPUs of the draft model"),
    "use_heterogeneous_vocab": (
        "bool",
        "the draft's vocab_size differs from the target's: vLLM maps the shared tokens (greedy drafts only)",
    ),
}
_CHOICES = {"dtype": DTYPES, "kv_cache_dtype": KV_CACHE_DTYPES, "quantization": QUANTIZATIONS}


@lru_cache(maxsize=1)
def _shipped() -> dict[str, dict[str, Any]]:
    profiles: dict[str, dict[str, Any]] = datafiles.load("profiles.yml")["profiles"]
    return profiles


def shipped() -> dict[str, dict[str, Any]]:
    """name -> {description, guide, settings} of every shipped profile (a copy)."""
    return copy.deepcopy(_shipped())


def names() -> list[str]:
    return sorted(_shipped())


def _merge(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overrides.items():
        if key == "speculative" and isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    if isinstance(merged.get("speculative"), Mapping):
        merged["speculative"] = {k: v for k, v in merged["speculative"].items() if v is not None}
    return {k: v for k, v in merged.items() if v is not None}


def resolve(host: str, name: str | None, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The host's effective profile: shipped profile `name` (none: start empty) with `overrides`
    merged over it, key by key (inside `speculative` too); a key set to None is removed."""
    if overrides is None:
        overrides = {}
    if not isinstance(overrides, Mapping):
        raise ProfileError(
            f"{host}: vllm_profile={overrides!r} is a {type(overrides).__name__}, not a dict; "
            "fix: give vllm_profile as a mapping of profile keys, e.g. {max_num_seqs: 32}"
        )
    if name:
        if not isinstance(name, str) or name not in _shipped():
            raise ProfileError(
                f"{host}: vllm_profile_name={name!r} is not a shipped profile; "
                f"fix: use one of {', '.join(names())}, or leave it empty and give every key in vllm_profile"
            )
        base = copy.deepcopy(_shipped()[name]["settings"])
    else:
        base = {}
    return _merge(base, copy.deepcopy(dict(overrides)))


def _type_error(host: str, key: str, value: Any, kind: str, meaning: str) -> str:
    wanted = {
        "int": "an integer",
        "number": "a number",
        "bool": "true or false",
        "str": "a non-empty string",
        "dict": "a mapping",
    }[kind]
    if key == "speculative":
        return (
            f"{host}: {key}={inputs.short(value)} must be {wanted} ({meaning}); fix: give vllm_profile.speculative "
            "as a mapping, e.g. {model: Qwen/Qwen2.5-0.5B-Instruct, num_speculative_tokens: 5}, or set it to null "
            "to turn speculative decoding off"
        )
    return f"{host}: {key}={value!r} must be {wanted} ({meaning}); fix: set {key} to {wanted}"


def _control_error(host: str, key: str, value: str) -> list[str]:
    """A profile string reaches the unit's command line (the model, its served name, the draft): refuse what would
    end its line or hide what it says."""
    if not inputs.CONTROL.search(value):
        return []
    return [
        f"{host}: {key}={inputs.short(value)} holds {inputs.CONTROL_WHAT}, {inputs.control_character(value)}, "
        f"which would end the unit's command line or hide what it says; fix: remove it from vllm_profile.{key}"
    ]


def validate(host: str, profile: Mapping[str, Any]) -> list[str]:
    """Every problem of a resolved profile, each naming host, key, value and fix (empty: valid)."""
    errors: list[str] = []
    for key, value in profile.items():
        if key not in PROFILE_KEYS:
            errors.append(
                f"{host}: unknown profile key {key}={value!r}; fix: remove it, or use one of "
                f"{', '.join(PROFILE_KEYS)} (further vLLM arguments go in vllm_extra_args)"
            )
            continue
        kind, meaning = PROFILE_KEYS[key]
        if not _kind(value, kind):
            errors.append(_type_error(host, key, value, kind, meaning))
            continue
        control = _control_error(host, key, value) if kind == "str" else []
        if control:
            errors += control
            continue
        if key in _CHOICES and value not in _CHOICES[key]:
            errors.append(f"{host}: {key}={value!r} is not supported; fix: use one of {', '.join(_CHOICES[key])}")
    if "model" not in profile:
        errors.append(
            f"{host}: the profile has no model; fix: set vllm_profile_name to a shipped profile "
            f"({', '.join(names())}) or give vllm_profile.model"
        )
    if errors:
        return errors

    util = profile.get("gpu_memory_utilization")
    if util is not None and not 0 < util <= 1:
        errors.append(
            f"{host}: gpu_memory_utilization={util} is impossible: it is a share of the GPU's total memory; "
            "fix: use a value in (0, 1], 0.90-0.95 on a dedicated GPU"
        )
    for key in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size"):
        if key in profile and profile[key] < 1:
            errors.append(f"{host}: {key}={profile[key]} is impossible; fix: use a positive integer")
    if "swap_space" in profile and profile["swap_space"] < 0:
        errors.append(f"{host}: swap_space={profile['swap_space']} is negative; fix: use 0 (no swapping) or GiB > 0")
    seqs, budget = profile.get("max_num_seqs"), profile.get("max_num_batched_tokens")
    if seqs and budget and 0 < budget < seqs:
        errors.append(
            f"{host}: max_num_batched_tokens={budget} is below max_num_seqs={seqs}: vLLM refuses it "
            f"(each running request needs a token per step); fix: max_num_batched_tokens >= {seqs}"
        )
    if profile.get("calculate_kv_scales") and profile.get("kv_cache_dtype", "auto") in ("auto", "bfloat16", "float16"):
        errors.append(
            f"{host}: calculate_kv_scales=true with kv_cache_dtype={profile.get('kv_cache_dtype', 'auto')!r}: "
            "scales only exist for an FP8 KV cache; fix: set kv_cache_dtype: fp8 or drop calculate_kv_scales"
        )
    quant = profile.get("quantization")
    if quant in ("awq", "awq_marlin", "gptq", "gptq_marlin") and profile.get("dtype") in (
        "bfloat16",
        "float",
        "float32",
    ):
        errors.append(
            f"{host}: dtype={profile['dtype']!r} with quantization={quant!r}: vLLM's {quant} kernels run in "
            "float16; fix: set dtype: auto (or float16)"
        )
    if "speculative" in profile:
        errors.extend(_validate_speculative(host, profile["speculative"]))
    return errors


def _validate_speculative(host: str, spec: Mapping[str, Any]) -> list[str]:
    errors = []
    for key, value in spec.items():
        if key not in SPECULATIVE_KEYS:
            errors.append(f"{host}: unknown key speculative.{key}={value!r}; fix: use {', '.join(SPECULATIVE_KEYS)}")
            continue
        kind, meaning = SPECULATIVE_KEYS[key]
        if not _kind(value, kind):
            errors.append(_type_error(host, f"speculative.{key}", value, kind, meaning))
        elif kind == "str":
            errors += _control_error(host, f"speculative.{key}", value)
    if errors:
        return errors
    method = spec.get("method")
    if method is not None and method not in SPECULATIVE_METHODS:
        errors.append(
            f"{host}: speculative.method={method!r} is not supported; fix: use one of {', '.join(SPECULATIVE_METHODS)}"
        )
    if "model" not in spec and method not in MODEL_FREE_METHODS:
        errors.append(
            f"{host}: speculative has no model (method={method!r}); fix: set speculative.model to the draft "
            f"model, or speculative.method to {' or '.join(MODEL_FREE_METHODS)}, or speculative: null to turn it off"
        )
    tokens = spec.get("num_speculative_tokens")
    if tokens is None:
        errors.append(
            f"{host}: speculative.num_speculative_tokens is missing; fix: set it (the tuning reference uses 5)"
        )
    elif not 1 <= tokens <= 16:
        errors.append(
            f"{host}: speculative.num_speculative_tokens={tokens} is outside 1-16; fix: use 3-6 for a draft model"
        )
    tp = spec.get("draft_tensor_parallel_size")
    if tp is not None and tp < 1:
        errors.append(f"{host}: speculative.draft_tensor_parallel_size={tp} is impossible; fix: use 1")
    return errors
