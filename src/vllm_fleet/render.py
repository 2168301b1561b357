"""Turn a resolved profile into the `vllm serve` arguments of one vLLM release.

What changed between releases is data (data/flag_changes.yml): for every key, the spelling of each
era and the release it came in. `render_args` picks the era of the deployed release, so older
releases keep the old spellings and newer ones get the new ones; keys a release removed are dropped
with the reason. The result is the argument list after `vllm serve` (the model first, positional).

vllm_extra_args goes through the same table, and every name must be an option of the release's serve
parser (data/serve_options.yml, generated from each release's `vllm serve --help=all`).
"""

from __future__ import annotations

import difflib
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


@lru_cache(maxsize=1)
def serve_options() -> dict[Version, frozenset[str]]:
    """Release -> the long options of its `vllm serve` parser (data/serve_options.yml)."""
    releases = datafiles.load("serve_options.yml")["releases"]
    return {Version(release): frozenset(entry["options"]) for release, entry in releases.items()}


@lru_cache(maxsize=256)
def parse_version(version: Any) -> Version:
    """A vLLM release as a Version; ValueError naming the value and the releases supported."""
    minimum, newest = Version(table()["min_version"]), table()["newest_series"]
    if not isinstance(version, str):
        raise ValueError(
            f"vllm_version={version!r} is a {type(version).__name__}, not a string; fix: quote it, e.g. \"0.33.0\""
        )
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise ValueError(f"vllm_version={version!r} is not a release number; fix: use one like \"0.33.0\"") from None
    if len(parsed.release) != 3 or parsed.local or parsed.epoch:
        raise ValueError(
            f"vllm_version={version!r} is not a full release number (pip and the virtualenv name pin X.Y.Z); "
            f"fix: the release as PyPI lists it, e.g. \"{'.'.join(map(str, (parsed.release + (0, 0))[:3]))}\""
        )
    if parsed < minimum:
        raise ValueError(
            f"vllm_version={version!r} is older than {minimum}, the oldest release whose flags the table knows; "
            f"fix: deploy vLLM >= {minimum}"
        )
    if parsed.release[:2] > Version(newest).release[:2]:
        raise ValueError(
            f"vllm_version={version!r} is newer than the {newest} series, the newest whose flag changes "
            "(data/flag_changes.yml) and serve options (data/serve_options.yml) the project knows; fix: pin a "
            f"release up to {newest}.x, or capture the new release's `vllm serve --help=all` "
            "(scripts/serve-options.py), record its flag changes and raise newest_series"
        )
    return parsed


def release_options(version: Version) -> tuple[Version | None, frozenset[str]]:
    """(the release whose serve options apply, those options) for `version`: the newest capture of the same
    X.Y series not newer than it; (None, every captured option) when that series has no capture."""
    same = [v for v in serve_options() if v.release[:2] == version.release[:2] and v <= version]
    if same:
        return max(same), serve_options()[max(same)]
    return None, frozenset().union(*serve_options().values())


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


# The separate speculative flags, replaced by --speculative-config (the profile's `speculative`).
_LEGACY_SPECULATIVE = ("speculative_model", "num_speculative_tokens", "speculative_draft_tensor_parallel_size")
# Profile keys and the table's own entries that vllm_extra_args may not set (the profile renders them).
_PROFILE_ONLY = ("model", "served_model_name", "speculative", "speculative_config")


def _unknown_option(name: str, version: Version, flags: list[str]) -> str | None:
    """Why `flags` (the rendering of vllm_extra_args.NAME) is not what the release's parser takes, or None."""
    release, known = release_options(version)
    missing = [f for f in flags if f not in known]
    if not missing:
        return None
    where = (f"vLLM {release}'s serve parser (data/serve_options.yml)" if release
             else f"the serve parser of any captured release ({', '.join(map(str, sorted(serve_options())))})")
    near = difflib.get_close_matches(missing[0], sorted(known), n=3, cutoff=0.75)
    hint = f" (options with a like name: {', '.join(near)})" if near else ""
    return (f"vllm_extra_args.{name}: {' '.join(missing)} is not an option of {where}{hint}; fix: use the "
            f"release's spelling (`vllm serve --help=all`), or remove it")


def _extra(extra_args: Mapping[str, Any], profile: Mapping[str, Any], version: Version,
           result: RenderResult) -> None:
    if not isinstance(extra_args, Mapping):
        raise ValueError(f"vllm_extra_args={extra_args!r} is not a dict; fix: give a mapping of argument: value")
    form = era("extra_boolean", version)["form"]
    for name in sorted(extra_args, key=str):
        value = extra_args[name]
        if not isinstance(name, str) or not _EXTRA_NAME.match(name):
            raise ValueError(
                f"vllm_extra_args key {name!r} is not a snake_case vLLM argument name; "
                "fix: write it like max_num_partial_prefills (no leading dashes)"
            )
        if name in _PROFILE_ONLY or name in profile:
            raise ValueError(
                f"vllm_extra_args.{name} duplicates a profile key; fix: set it in vllm_profile instead"
            )
        if name in _LEGACY_SPECULATIVE and era("speculative", version)["form"] == "json":
            raise ValueError(
                f"vllm_extra_args.{name}: {' '.join(era('speculative', version)['reason'].split())}; fix: set "
                "vllm_profile.speculative (model, num_speculative_tokens), which renders --speculative-config"
            )
        in_table = name in table()["keys"]  # the table is the evidence of its keys' spelling in each release
        if in_table and era(name, version)["form"] in ("removed", "absent"):
            gone = era(name, version)["form"] == "removed"
            result.dropped.append({"flag": _flag(name), "reason": " ".join(era(name, version)["reason"].split())})
            result.warnings.append(f"vllm_extra_args.{name} dropped: vLLM {version} "
                                   f"{'no longer has' if gone else 'does not have'} {_flag(name)}")
            continue
        if value is None:
            continue
        if isinstance(value, bool):
            spelled = era(name, version)["form"] if in_table else form
            flags = [_flag(name)] if value else _negative(name, spelled)
            problem = None if in_table else _unknown_option(name, version, [f.split("=", 1)[0] for f in flags])
            if problem and not value and not _unknown_option(name, version, [_flag(name)]):
                continue  # a store_true option has no negative form: false is its default, left out
            if problem:
                raise ValueError(problem)
            result.args += flags
            continue
        problem = None if in_table else _unknown_option(name, version, [_flag(name)])
        if problem:
            raise ValueError(problem)
        if isinstance(value, Mapping):
            result.args += [_flag(name), json.dumps(value, sort_keys=True, separators=(",", ":"))]
        elif isinstance(value, (list, tuple)):
            result.args += [_flag(name), *[str(v) for v in value]]
        else:
            result.args += [_flag(name), _number(value)]


def served_model_name(profile: Mapping[str, Any]) -> str:
    """The name the instance serves its model under: the profile's served_model_name, else its model id (the one
    rule; the plan entry carries it for the verification and the benchmark)."""
    return str(profile.get("served_model_name") or profile["model"])


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
    result.args += ["--served-model-name", served_model_name(profile)]

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
