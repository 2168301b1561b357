"""Turn a resolved profile into the `vllm serve` arguments of one vLLM release.

What changed between releases is data (data/flag_changes.yml): for every key, the spelling of each
era and the release it came in. `render_args` picks the era of the deployed release, so older
releases keep the old spellings and newer ones get the new ones; keys a release removed are dropped
with the reason. The result is the argument list after `vllm serve` (the model first, positional).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Mapping

from packaging.version import InvalidVersion, Version

from . import datafiles

# Profile keys rendered as `--flag value`, in this order (model, booleans and speculative aside).
_VALUE_KEYS = (
    "dtype", "quantization", "gpu_memory_utilization", "max_model_len", "max_num_seqs",
    "max_num_batched_tokens", "kv_cache_dtype", "tensor_parallel_size",
)
# Profile keys that are not vLLM arguments.
_NOT_ARGUMENTS = ("model_config",)
_EXTRA_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass
class RenderResult:
    """args: after `vllm serve`; dropped: [{flag, reason}]; warnings: human-readable notes."""

    args: list[str] = field(default_factory=list)
    dropped: list[dict[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    """The flag-change table (data/flag_changes.yml)."""
    return datafiles.load("flag_changes.yml")


@lru_cache(maxsize=256)
def parse_version(version: Any) -> Version:
    """A vLLM release as a Version; ValueError naming the value and the oldest release supported."""
    minimum = Version(table()["min_version"])
    if not isinstance(version, str):
        raise ValueError(
            f"vllm_version={version!r} is a {type(version).__name__}, not a string; fix: quote it, e.g. \"0.33.0\""
        )
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise ValueError(f"vllm_version={version!r} is not a release number; fix: use one like \"0.33.0\"") from None
    if parsed < minimum:
        raise ValueError(
            f"vllm_version={version!r} is older than {minimum}, the oldest release whose flags the table knows; "
            f"fix: deploy vLLM >= {minimum}"
        )
    return parsed


@lru_cache(maxsize=1024)
def _era_cached(key: str, version: Version) -> dict[str, Any]:
    eras = [e for e in table()["keys"][key] if Version(e["since"]) <= version]
    return eras[-1]


def era(key: str, version: str | Version) -> dict[str, Any]:
    """The table entry for `key` that applies to `version` (the last one whose `since` <= version)."""
    return _era_cached(key, version if isinstance(version, Version) else parse_version(version))


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _number(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _negative(name: str, form: str) -> list[str]:
    """How a boolean engine argument `name` (snake_case) is set to false in the given form."""
    if form == "value":
        return [f"{_flag(name)}=False"]
    if form == "disable" or (form == "disable_enable" and name.startswith("enable_")):
        return ["--disable-" + name.removeprefix("enable_").replace("_", "-")]
    return ["--no-" + name.replace("_", "-")]


def _speculative(spec: Mapping[str, Any], version: Version, draft_model_path: str | None,
                 result: RenderResult) -> None:
    entry = era("speculative", version)
    model = draft_model_path or spec.get("model")
    if entry["form"] == "json":
        config = {k: v for k, v in spec.items() if v is not None}
        if model:
            config["model"] = model
        result.args += ["--speculative-config", json.dumps(config, sort_keys=True, separators=(",", ":"))]
        return
    # Before --speculative-config: separate flags; n-gram is the model "[ngram]".
    method = spec.get("method")
    if method == "ngram":
        model = "[ngram]"
    elif method not in (None, "draft_model", "eagle", "medusa", "mlp_speculator"):
        result.dropped.append({
            "flag": f"speculative.method={method}",
            "reason": f"vLLM {version} has no --speculative-config; method {method} cannot be expressed with its flags",
        })
        return
    if method in ("eagle", "medusa", "mlp_speculator"):
        result.warnings.append(
            f"vLLM {version}: speculative method {method} is implied by the draft checkpoint "
            "(--speculative-model) on this release"
        )
    result.args += ["--speculative-model", str(model), "--num-speculative-tokens", str(spec["num_speculative_tokens"])]
    if spec.get("draft_tensor_parallel_size") is not None:
        result.args += ["--speculative-draft-tensor-parallel-size", str(spec["draft_tensor_parallel_size"])]


def _extra(extra_args: Mapping[str, Any], profile: Mapping[str, Any], version: Version,
           result: RenderResult) -> None:
    if not isinstance(extra_args, Mapping):
        raise ValueError(f"vllm_extra_args={extra_args!r} is not a dict; fix: give a mapping of argument: value")
    form = era("extra_boolean", version)["form"]
    for name in sorted(extra_args):
        value = extra_args[name]
        if not isinstance(name, str) or not _EXTRA_NAME.match(name):
            raise ValueError(
                f"vllm_extra_args key {name!r} is not a snake_case vLLM argument name; "
                "fix: write it like max_num_partial_prefills (no leading dashes)"
            )
        if name == "model" or name in profile or name == "served_model_name" or name == "speculative_config":
            raise ValueError(
                f"vllm_extra_args.{name} duplicates a profile key; fix: set it in vllm_profile instead"
            )
        if value is None:
            continue
        if isinstance(value, bool):
            result.args += [_flag(name)] if value else _negative(name, form)
        elif isinstance(value, Mapping):
            result.args += [_flag(name), json.dumps(value, sort_keys=True, separators=(",", ":"))]
        elif isinstance(value, (list, tuple)):
            result.args += [_flag(name), *[str(v) for v in value]]
        else:
            result.args += [_flag(name), _number(value)]


def render_args(profile: Mapping[str, Any], version: str, model_path: str | None = None,
                draft_model_path: str | None = None, extra_args: Mapping[str, Any] | None = None) -> RenderResult:
    """The `vllm serve` arguments of a resolved, valid profile for vLLM `version`.

    model_path / draft_model_path: where the host has the (draft) model; the model argument is then
    that path and the served name stays the model id. extra_args: further engine arguments
    (snake_case), rendered sorted after the profile's. Raises ValueError for a bad version or
    extra argument."""
    parsed = parse_version(version)
    if "model" not in profile:
        raise ValueError("the profile has no model; fix: set model")
    result = RenderResult()
    result.args.append(str(model_path or profile["model"]))  # era('model'): positional throughout
    result.args += ["--served-model-name", str(profile.get("served_model_name") or profile["model"])]

    for key in _VALUE_KEYS:
        if key in profile:
            result.args += [_flag(key), _number(profile[key])]

    for key in ("enable_chunked_prefill", "enable_prefix_caching"):
        if key in profile:
            result.args += [_flag(key)] if profile[key] else _negative(key, era(key, parsed)["form"])

    for key in ("calculate_kv_scales", "swap_space"):
        if key not in profile:
            continue
        entry = era(key, parsed)
        if entry["form"] == "removed":
            result.dropped.append({"flag": _flag(key), "reason": " ".join(entry["reason"].split())})
            if key == "swap_space" and profile[key]:
                result.warnings.append(
                    f"swap_space={profile[key]} GiB asks for CPU swap, which vLLM {parsed} no longer has; "
                    "preempted requests are recomputed instead"
                )
        elif key == "swap_space":
            result.args += ["--swap-space", _number(profile[key])]
        elif profile[key]:
            result.args.append("--calculate-kv-scales")

    if "speculative" in profile:
        _speculative(profile["speculative"], parsed, draft_model_path, result)
    unknown = set(profile) - set(_VALUE_KEYS) - {
        "model", "served_model_name", "enable_chunked_prefill", "enable_prefix_caching",
        "calculate_kv_scales", "swap_space", "speculative", *_NOT_ARGUMENTS}
    if unknown:
        raise ValueError(f"profile keys {sorted(unknown)} are not profile keys; fix: validate the profile first")
    if extra_args:
        _extra(extra_args, profile, parsed, result)
    return result
