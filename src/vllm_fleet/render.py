"""Turn a resolved profile into the `vllm serve` arguments of one vLLM release.

What changed between releases is data (data/flag_changes.yml): for every key, the spelling of each
era and the release it came in. `render_args` picks the era of the deployed release, so older
releases keep the old spellings and newer ones get the new ones; keys a release removed are dropped
with the reason. The result is the argument list after `vllm serve` (the model first, positional).

vllm_extra_args goes through one gate first, `extra_args_errors`, at plan time: a key that a first-class setting
manages (MANAGED_EXTRA_ARGS: the role's own arguments, the placement's, the profile's) is refused with the setting
to use, so is a flag the release no longer has, a value with a control or format character, and a name that is not
an option of the release's serve parser (data/serve_options.yml, generated from each release's `vllm serve
--help=all`). `render_args` then renders the operator's arguments and the role's own through the same table.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any

from packaging.version import InvalidVersion, Version

from . import datafiles, inputs, placement, profiles

# Profile keys rendered as `--flag value`, in this order (model, booleans and speculative aside).
_VALUE_KEYS = (
    "dtype",
    "quantization",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "kv_cache_dtype",
    "tensor_parallel_size",
)
# Profile keys that are not vLLM arguments.
_NOT_ARGUMENTS = ("model_config",)
_EXTRA_NAME = re.compile(r"[a-z][a-z0-9_]*")  # fullmatch: `$` would let a trailing newline through


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
    changes: dict[str, Any] = datafiles.load("flag_changes.yml")
    return changes


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
            f'vllm_version={version!r} is a {type(version).__name__}, not a string; fix: quote it, e.g. "0.33.0"'
        )
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise ValueError(f'vllm_version={version!r} is not a release number; fix: use one like "0.33.0"') from None
    if len(parsed.release) != 3 or parsed.local or parsed.epoch:
        raise ValueError(
            f"vllm_version={version!r} is not a full release number (pip and the virtualenv name pin X.Y.Z); "
            f'fix: the release as PyPI lists it, e.g. "{".".join(map(str, (*parsed.release, 0, 0)[:3]))}"'
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
    eras: list[dict[str, Any]] = [e for e in table()["keys"][key] if Version(e["since"]) <= version]
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


def _speculative(spec: Mapping[str, Any], version: Version, draft_model_path: str | None, result: RenderResult) -> None:
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
        result.dropped.append(
            {
                "flag": f"speculative.method={method}",
                "reason": f"vLLM {version} has no --speculative-config; "
                f"method {method} cannot be expressed with its flags",
            }
        )
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
# Profile keys and the table's own entries that the profile renders: render_args refuses them in its extra_args.
_PROFILE_ONLY = ("model", "served_model_name", "speculative", "speculative_config")

# The vllm_extra_args keys that a first-class setting manages, and the setting to use instead: the plan refuses each
# (extra_args_errors) naming that setting, so that no second spelling fights the setting or slips past what the plan
# checks of it. The role's own arguments (planner.plan_host passes --host, --port, --shutdown-timeout and what the
# placement needs through render_args' extra_args) are among them, so that they never collide with the operator's.
MANAGED_EXTRA_ARGS: dict[str, str] = {
    # What the vllm role puts on the unit's command line, or in its environment file, from its own settings.
    "host": "vllm_bind_address",
    "port": "vllm_port",
    "uds": "vllm_bind_address and vllm_port",
    "shutdown_timeout": "vllm_shutdown_timeout",
    "api_key": "vllm_api_key",
    "device": "vllm_target_device",
    # What the plan's placement decides: the instances, their cards, and what the cards need.
    **{
        key: "the plan's placement (vllm_fleet.placement.TP_NEEDS)"
        for _, needs in placement.TP_NEEDS
        for key in needs["args"]
    },
    "pipeline_parallel_size": "vllm_gpus and vllm_profile.tensor_parallel_size",
    "data_parallel_size": "vllm_gpus",
    "data_parallel_size_local": "vllm_gpus",
    "device_ids": "vllm_gpus",
    # The profile's keys, their other spellings, and the speculative flags its `speculative` renders.
    **{key: f"vllm_profile.{key}" for key in profiles.PROFILE_KEYS},
    "device_memory_utilization": "vllm_profile.gpu_memory_utilization",
    "disable_chunked_prefill": "vllm_profile.enable_chunked_prefill",
    "no_enable_chunked_prefill": "vllm_profile.enable_chunked_prefill",
    "disable_prefix_caching": "vllm_profile.enable_prefix_caching",
    "no_enable_prefix_caching": "vllm_profile.enable_prefix_caching",
    "speculative_config": "vllm_profile.speculative",
    "speculative_model": "vllm_profile.speculative.model",
    "num_speculative_tokens": "vllm_profile.speculative.num_speculative_tokens",
    "speculative_draft_tensor_parallel_size": "vllm_profile.speculative.draft_tensor_parallel_size",
    "spec_model": "vllm_profile.speculative.model",
    "spec_method": "vllm_profile.speculative.method",
    "spec_tokens": "vllm_profile.speculative.num_speculative_tokens",
    # LoRA adapters beside the model (vllm_fleet.lora): the plan checks them and sizes the host with them.
    "enable_lora": "vllm_lora_adapters (LoRA is on where a host serves adapters)",
    "lora_modules": "vllm_lora_adapters",
    "max_loras": "vllm_lora_max_loras",
    "max_lora_rank": "vllm_lora_max_rank",
    "max_cpu_loras": "vllm_lora_max_cpu_loras",
    # A file of options that the plan can neither see nor check.
    "config": "vllm_profile and vllm_extra_args",
}
# Why, where the setting's name does not say it.
_MANAGED_WHY = {
    "host": "the unit passes --host from it, and the firewall, the gateway and the health checks use it",
    "port": "each instance's --port is vllm_port plus its place on the cards, and the firewall, the gateway and the "
    "health checks use it",
    "uds": "a socket makes vLLM ignore --host and --port, where the gateway and the health checks reach it",
    "shutdown_timeout": "the unit passes --shutdown-timeout from it, and its TimeoutStopSec must outlast it",
    "api_key": "a key on the command line is readable by every local user through ps and /proc, while the "
    "root-only environment file carries vllm_api_key",
    "device": "the environment file sets VLLM_TARGET_DEVICE from it",
    "pipeline_parallel_size": "the plan places one instance per card or tensor-parallel group and sizes it so; it "
    "does not plan pipeline parallelism",
    "data_parallel_size": "the plan runs one instance per card or tensor-parallel group, and the gateway balances them",
    "data_parallel_size_local": "the plan runs one instance per card or tensor-parallel group, and the gateway "
    "balances them",
    "device_ids": "each instance's cards are its CUDA_VISIBLE_DEVICES, from the placement",
    "disable_custom_all_reduce": "it is set for the cards whose tensor parallelism hangs without it; a card that "
    "needs it too belongs in TP_NEEDS",
    "config": "a --config file sets options that the plan can neither see nor check",
    "model": "or pick a shipped profile with vllm_profile_name",
}


def _shown(name: str, value: Any) -> str:
    """`=value` for a message, or that a secret's value is not shown (inputs.is_secret_argument: api_key, anything
    named key, token, password or secret; not num_speculative_tokens or tokenizer)."""
    return " (value not shown)" if inputs.is_secret_argument(name) else f"={inputs.short(value)}"


def _managed_problem(name: str, value: Any, version: Version | None, show: bool = True) -> str:
    """Why vllm_extra_args.NAME (a key of MANAGED_EXTRA_ARGS) is refused, naming the setting to use instead."""
    setting = MANAGED_EXTRA_ARGS[name]
    shown = _shown(name, value) if show else ""
    why = _MANAGED_WHY.get(name)
    if name in _LEGACY_SPECULATIVE and version is not None and era("speculative", version)["form"] == "json":
        return (
            f"vllm_extra_args.{name}{shown}: {' '.join(era('speculative', version)['reason'].split())}; fix: set "
            f"{setting} instead (vllm_profile.speculative, with its model and num_speculative_tokens, renders "
            f"--speculative-config) and remove vllm_extra_args.{name}"
        )
    if setting.startswith("vllm_profile."):
        given = (
            f"its {shown.removeprefix('=')} "
            if shown.startswith("=")
            else ("its value (not shown) " if shown else "it ")
        )
        return (
            f"vllm_extra_args.{name} duplicates a profile key: {given}would fight {setting}, which the profile "
            f"renders and the plan sizes the host with; fix: set it in vllm_profile instead, as {setting}"
            f"{' (' + why + ')' if why else ''}, and remove vllm_extra_args.{name}"
        )
    if not setting.startswith("vllm_"):
        return (
            f"vllm_extra_args.{name}{shown} is set by {setting}{' (' + why + ')' if why else ''}; fix: remove "
            f"vllm_extra_args.{name}"
        )
    vault = ", encrypted with ansible-vault" if name == "api_key" else ""
    return (
        f"vllm_extra_args.{name}{shown} is managed by {setting}{' (' + why + ')' if why else ''}; fix: remove "
        f"vllm_extra_args.{name} and set {setting} instead{vault}"
    )


def _gone(name: str, value: Any, version: Version, show: bool = True) -> str | None:
    """Why vllm_extra_args.NAME is not on this release when the table says the release removed it (or has it not
    yet)."""
    if name not in table()["keys"] or era(name, version)["form"] not in ("removed", "absent"):
        return None
    entry = era(name, version)
    setting = MANAGED_EXTRA_ARGS.get(name)
    had = "no longer has" if entry["form"] == "removed" else "does not have"
    return (
        f"vllm_extra_args.{name}{_shown(name, value) if show else ''}: vLLM {version} {had} {_flag(name)}: "
        f"{' '.join(entry['reason'].split())}; fix: remove vllm_extra_args.{name}"
        + (f" ({setting} is its setting, for the releases that have it)" if setting else "")
    )


def _unknown_option(name: str, version: Version, flags: list[str], shown: str = "") -> str | None:
    """Why `flags` (the rendering of vllm_extra_args.NAME) is not what the release's parser takes, or None."""
    release, known = release_options(version)
    missing = [f for f in flags if f not in known]
    if not missing:
        return None
    where = (
        f"vLLM {release}'s serve parser (data/serve_options.yml)"
        if release
        else f"the serve parser of any captured release ({', '.join(map(str, sorted(serve_options())))})"
    )
    near = difflib.get_close_matches(missing[0], sorted(known), n=3, cutoff=0.75)
    hint = f" (options with a like name: {', '.join(near)})" if near else ""
    others = [str(v) for v, options in sorted(serve_options().items()) if missing[0] in options]
    had = f" (vLLM {', '.join(others)} had it: the option was renamed or removed)" if release and others else ""
    return (
        f"vllm_extra_args.{name}{shown}: {' '.join(missing)} is not an option of {where}{had}{hint}; fix: use the "
        f"release's spelling (`vllm serve --help=all`), or remove it"
    )


def _extra_flags(name: str, value: Any, version: Version, shown: str = "") -> tuple[list[str], str | None]:
    """The flags of vllm_extra_args.NAME=value on `version` (none for a value left out), and why the release's serve
    parser would refuse them (None when it takes them; `shown`: the value as the message shows it). The table's
    keys are spelled as the table says."""
    in_table = name in table()["keys"]  # the table is the evidence of its keys' spelling in each release
    if value is None:
        return [], None
    if isinstance(value, bool):
        spelled = era(name, version)["form"] if in_table else era("extra_boolean", version)["form"]
        flags = [_flag(name)] if value else _negative(name, spelled)
        problem = None if in_table else _unknown_option(name, version, [f.split("=", 1)[0] for f in flags], shown)
        if problem and not value and not _unknown_option(name, version, [_flag(name)]):
            return [], None  # a store_true option has no negative form: false is its default, left out
        return flags, problem
    problem = None if in_table else _unknown_option(name, version, [_flag(name)], shown)
    if isinstance(value, Mapping):
        return [_flag(name), json.dumps(value, sort_keys=True, separators=(",", ":"))], problem
    if isinstance(value, (list, tuple)):
        return [_flag(name), *[str(v) for v in value]], problem
    return [_flag(name), _number(value)], problem


def _strings(value: Any) -> Iterator[str]:
    """Every string in an argument's value, nested lists and mappings (their keys too) included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _strings(key)
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def _value_problem(name: str, value: Any) -> str | None:
    """What the unit's command line cannot carry of vllm_extra_args.NAME's value: a type that has no flag spelling
    (a date, a list of mappings, a mapping that is not JSON), or a control or format character."""
    shown = _shown(name, value)
    scalar = (str, int, float, type(None))
    fits = isinstance(value, scalar) or (
        isinstance(value, (list, tuple)) and all(isinstance(v, scalar) and v is not None for v in value)
    )
    if isinstance(value, Mapping):
        try:
            json.dumps(value, sort_keys=True, allow_nan=False)
            fits = True
        except (TypeError, ValueError):
            fits = False
    if not fits:
        return (
            f"vllm_extra_args.{name}{shown} is not a value a vLLM argument takes; fix: a string, a number, "
            "true or false, a list of strings or numbers, or a mapping with string keys (a JSON object); quote "
            "a date or a version"
        )
    for text in _strings(value):
        if inputs.CONTROL.search(text):
            which = "" if shown.startswith(" (value not shown)") else f", {inputs.control_character(text)},"
            return (
                f"vllm_extra_args.{name}{shown} holds {inputs.CONTROL_WHAT}{which} which would end the unit's "
                f"command line or hide what it says; fix: remove it"
            )
    return None


def extra_args_errors(host: str, extra_args: Any, version: Version | None) -> list[str]:
    """The one gate of a host's vllm_extra_args, at plan time and before the plan adds the role's own arguments: each
    key a snake_case name that no first-class setting manages (MANAGED_EXTRA_ARGS), that the release has (the
    table's removed flags), whose value the unit's command line can carry, and that the release's serve parser
    takes. `version`: the parsed vllm_version (None when it is bad: the release's checks wait for it). Every error
    names the host, the key, its value (never a secret's) and the fix."""
    if extra_args is None:
        return []
    if not isinstance(extra_args, Mapping):
        return [
            f"{host}: vllm_extra_args={inputs.short(extra_args)} is not a dict; fix: give a mapping of argument: "
            "value, e.g. {enforce_eager: true}"
        ]
    errors = []
    for name in sorted(extra_args, key=str):
        value = extra_args[name]
        if not isinstance(name, str) or not _EXTRA_NAME.fullmatch(name):
            errors.append(
                f"{host}: vllm_extra_args key {inputs.short(name)} is not a snake_case vLLM argument name; "
                "fix: write it like max_num_partial_prefills (no leading dashes)"
            )
            continue
        problem = _gone(name, value, version) if version is not None else None
        if problem is None and name in MANAGED_EXTRA_ARGS:
            problem = _managed_problem(name, value, version)
        if problem is None:
            problem = _value_problem(name, value)
        if problem is None and version is not None:
            problem = _extra_flags(name, value, version, _shown(name, value))[1]
        if problem:
            errors.append(f"{host}: {problem}")
    return errors


def _extra(extra_args: Mapping[str, Any], profile: Mapping[str, Any], version: Version, result: RenderResult) -> None:
    """Render the plan's further arguments (the operator's, through extra_args_errors first, and the role's own)."""
    if not isinstance(extra_args, Mapping):
        raise ValueError(f"vllm_extra_args={extra_args!r} is not a dict; fix: give a mapping of argument: value")
    for name in sorted(extra_args, key=str):
        value = extra_args[name]
        if not isinstance(name, str) or not _EXTRA_NAME.fullmatch(name):
            raise ValueError(
                f"vllm_extra_args key {name!r} is not a snake_case vLLM argument name; "
                "fix: write it like max_num_partial_prefills (no leading dashes)"
            )
        if name in _PROFILE_ONLY or name in profile or name in _LEGACY_SPECULATIVE:
            raise ValueError(_managed_problem(name, value, version, show=False))
        if _gone(name, value, version):
            entry = era(name, version)
            result.dropped.append({"flag": _flag(name), "reason": " ".join(entry["reason"].split())})
            result.warnings.append(
                f"vllm_extra_args.{name} dropped: vLLM {version} "
                f"{'no longer has' if entry['form'] == 'removed' else 'does not have'} {_flag(name)}"
            )
            continue
        flags, problem = _extra_flags(name, value, version)
        if problem:
            raise ValueError(problem)
        result.args += flags


def served_model_name(profile: Mapping[str, Any]) -> str:
    """The name the instance serves its model under: the profile's served_model_name, else its model id (the one
    rule; the plan entry carries it for the verification and the benchmark)."""
    return str(profile.get("served_model_name") or profile["model"])


def render_args(
    profile: Mapping[str, Any],
    version: str,
    model_path: str | None = None,
    draft_model_path: str | None = None,
    extra_args: Mapping[str, Any] | None = None,
    aliases: Iterable[str] = (),
) -> RenderResult:
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
    # The fleet's aliases (vllm_model_aliases) after the model's own name, which vLLM reports: every instance answers to
    # each, and the gateways send an alias only to the instances of its model, so that moving one restarts nothing.
    result.args += ["--served-model-name", served_model_name(profile), *sorted(set(aliases))]

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
    unknown = (
        set(profile)
        - set(_VALUE_KEYS)
        - {
            "model",
            "served_model_name",
            "enable_chunked_prefill",
            "enable_prefix_caching",
            "calculate_kv_scales",
            "swap_space",
            "speculative",
            *_NOT_ARGUMENTS,
        }
    )
    if unknown:
        raise ValueError(f"profile keys {sorted(unknown)} are not profile keys; fix: validate the profile first")
    if extra_args:
        _extra(extra_args, profile, parsed, result)
    return result
