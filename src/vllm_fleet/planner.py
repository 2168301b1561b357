"""Capacity planner: will a host's profile fit its GPU, and what will it hold?

For one host (its inventory variables), `plan_host` resolves and validates the profile, renders the
arguments for the host's vLLM release, places its instances on the cards (:mod:`vllm_fleet.placement`), sizes
each the way vLLM does (:mod:`vllm_fleet.sizing`), then judges it: the tuning reference's rules become errors
(the host must not be deployed) and warnings (it will run, not as well as it could) (:mod:`vllm_fleet.rules`),
and its service levels are estimated beside them (:mod:`vllm_fleet.service_levels`). Every message names the
host, the numbers and a fix. `table` prints the plan.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from . import __version__, datafiles, inputs, lora, placement, profiles, render, tune
from .rules import ERROR_RULES, WARNING_RULES, known_failure
from .service_levels import GUIDE_TARGETS, match_card, misses_target, service_levels
from .sizing import KV_TOLERANCE, fit_hint, gib, kv_band, size_instance

DEFAULT_TYPICAL_PROMPT_TOKENS = 512
DEFAULT_TYPICAL_OUTPUT_TOKENS = 256
CAPACITY_KEYS = (
    "gpu_memory_bytes",
    "weights_bytes",
    "draft_weights_bytes",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "kv_cache_tokens",
    "kv_cache_tokens_warm",
    "max_concurrency_at_max_len",
    "decode_ceiling_tokens_per_s",
    "fits",
)


def _empty_capacity() -> dict[str, Any]:
    capacity: dict[str, Any] = dict.fromkeys(CAPACITY_KEYS)
    capacity["fits"] = False
    return capacity


def _validate_gpu(host: str, gpu: Any) -> list[str]:
    fix = "fix: set vllm_gpu to {name: ..., memory_mib: ..., bandwidth_gb_s: ..., count: ...} in group_vars"
    if not isinstance(gpu, Mapping):
        return [f"{host}: vllm_gpu={gpu!r} is not a mapping; {fix}"]
    errors = []
    cpu = str(gpu.get("name", "")).lower() == "cpu"
    for key, kind in (("name", "str"), ("memory_mib", "int"), ("bandwidth_gb_s", "number"), ("count", "int")):
        value = gpu.get(key)
        if value is None:
            errors.append(f"{host}: vllm_gpu.{key} is missing; {fix}")
        elif not profiles._kind(value, kind) or (
            kind != "str" and (value < 0 if cpu and key == "count" else value <= 0)
        ):
            wanted = {"str": "a name", "int": "a positive integer", "number": "a positive number"}[kind]
            errors.append(f"{host}: vllm_gpu.{key}={value!r} must be {wanted}; {fix}")
    cap = gpu.get("compute_cap")
    if cap not in (None, "") and (isinstance(cap, bool) or not re.fullmatch(r"\d+\.\d+", str(cap))):
        errors.append(
            f'{host}: vllm_gpu.compute_cap={cap!r} must be a compute capability such as "8.9" (a quoted '
            "string; nvidia-smi --query-gpu=compute_cap prints it), or be left out"
        )
    return errors


def detected_gpu(assumed: Any, detected: Mapping[str, Any]) -> dict[str, Any]:
    """The vllm_gpu to plan a host with once the nvidia_driver role has detected its cards (its fact
    nvidia_driver_gpus): the detected name, count, smallest memory and compute capability. The driver cannot
    measure bandwidth: the group's figure (`assumed`, its vllm_gpu) when it names the same card (by nvidia-smi
    name or catalog model), else the catalog's, else the group's whatever its card, else 0."""
    assumed = assumed if isinstance(assumed, Mapping) else {}
    same_card = assumed.get("name", "") in (detected.get("model"), detected.get("name"))
    if same_card and assumed.get("bandwidth_gb_s") is not None:
        bandwidth = assumed["bandwidth_gb_s"]
    elif detected.get("bandwidth_gb_s") is not None:
        bandwidth = detected["bandwidth_gb_s"]
    else:
        bandwidth = assumed.get("bandwidth_gb_s", 0)
    gpu = {
        "name": detected.get("name"),
        "memory_mib": detected.get("memory_mib"),
        "count": detected.get("count"),
        "compute_cap": detected.get("compute_cap", ""),
        "bandwidth_gb_s": bandwidth,
    }
    if isinstance(detected.get("gpus"), list) and detected["gpus"]:
        gpu["cards"] = detected["gpus"]  # each card (index, UUID, minor, NUMA node...): vllm_fleet.placement
    return gpu


def _positive_int(host: str, name: str, value: Any) -> list[str]:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return [f"{host}: {name}={value!r} must be a positive integer; fix: set it to a token count, e.g. 512"]
    return []


def plan_host(host: str, hostvars: Mapping[str, Any]) -> dict[str, Any]:
    """The plan of one host, in the shape of plan.json's per-host entry.

    hostvars: vllm_profile_name, vllm_profile, vllm_gpu, vllm_version, and optionally
    vllm_model_config, vllm_draft_model_config, vllm_extra_args, vllm_environment (its
    VLLM_CPU_KVCACHE_SPACE), vllm_typical_prompt_tokens, vllm_typical_output_tokens."""
    name = hostvars.get("vllm_profile_name") or None
    version = hostvars.get("vllm_version")
    entry: dict[str, Any] = {
        "profile": name or "custom",
        "vllm_version": version,
        "args": [],
        "dropped": [],
        "errors": [],
        "warnings": [],
        "notes": [],
        "instances": [],
        "capacity": _empty_capacity(),
    }
    errors, warnings = entry["errors"], entry["warnings"]

    # A profile a tune search measured on the site (vllm_profile_measured: the file tune.measured_profile makes): its
    # settings over the shipped profile it was measured for, vllm_profile over both.
    overrides = hostvars.get("vllm_profile")
    measured = hostvars.get("vllm_profile_measured")
    if measured in (None, "", {}):
        entry["profile_source"] = {"kind": "shipped"}
    else:
        found, cautions, settings, source = tune.taken_profile(host, measured, name, hostvars.get("vllm_gpu"), version)
        errors += found
        warnings += cautions
        entry["profile_source"] = source
        if isinstance(overrides, Mapping):
            overrides = {**settings, **overrides}
        elif overrides in (None, ""):
            overrides = settings
    try:
        profile = profiles.resolve(host, name, overrides)
    except profiles.ProfileError as exc:
        errors.append(str(exc))
        return entry
    entry["model"] = profile.get("model")
    errors += profiles.validate(host, profile)
    if not errors:
        # The one resolution of the profile: verify.yml and benchmark.yml take it from here even when the rest of
        # the host's plan has errors (what runs is verified all the same).
        entry["profile_effective"] = profile
        entry["served_model_name"] = render.served_model_name(profile)
    gpu = hostvars.get("vllm_gpu")
    errors += _validate_gpu(host, gpu)
    speculative = profile.get("speculative")
    spec = speculative if isinstance(speculative, Mapping) else {}
    unit_values = {name: hostvars[name] for name in inputs.UNIT_VARS if name in hostvars}
    unit_values["vllm_draft_model_source"] = deploy_inputs(hostvars)["vllm_draft_model_source"]
    errors += inputs.check(
        host, unit_values, draft=bool(spec.get("model")) and spec.get("method") not in profiles.MODEL_FREE_METHODS
    )
    release = None
    if version is None:
        errors.append(f'{host}: vllm_version is not set; fix: set it in group_vars, e.g. vllm_version: "0.33.0"')
    elif not isinstance(version, str):
        errors.append(
            f"{host}: vllm_version={inputs.short(version)} is a {type(version).__name__}, not a string; "
            'fix: quote it, e.g. "0.33.0"'
        )
    else:
        try:
            release = render.parse_version(version)
        except ValueError as exc:
            errors.append(f"{host}: {exc}")
    for config in ("vllm_model_config", "vllm_draft_model_config"):
        if hostvars.get(config) not in (None, "") and not isinstance(hostvars.get(config), str):
            errors.append(
                f"{host}: {config}={inputs.short(hostvars[config])} is not a path; fix: the controller path "
                "of the model's config.json (or of its folder), or leave it out for a catalogued model"
            )
    # The one gate of the operator's arguments: nothing a setting of its own manages (the role's below included).
    errors += render.extra_args_errors(host, hostvars.get("vllm_extra_args"), release)
    aliases, alias_errors = model_aliases(host, hostvars.get("vllm_model_aliases"))
    errors += alias_errors
    # LoRA adapters beside the model (vllm_fleet.lora): their settings, names, and what their adapter_config.json
    # says (read on the controller by the plan role: vllm_plan_lora_configs; not read, as by a gateway's own read of
    # a host it does not plan, nothing is said of them).
    state_dir = str(deploy_inputs(hostvars)["vllm_state_dir"] or "/var/lib/vllm")
    adapters, lora_errors = lora.settings(host, hostvars, state_dir)
    errors += lora_errors
    if adapters and "served_model_name" in entry:
        errors += lora.name_errors(host, adapters, entry["served_model_name"], aliases)
        configs = hostvars.get("vllm_plan_lora_configs")
        if isinstance(configs, Mapping):
            read, config_errors = lora.config_errors(host, adapters, configs, str(profile.get("model")))
            errors += config_errors
            ranks = {a["name"]: a for a in read}
            adapters = dict(adapters, adapters=[dict(a, **ranks.get(a["name"], {})) for a in adapters["adapters"]])
    entry["lora"] = adapters
    extra = hostvars.get("vllm_extra_args") or {}
    if adapters and adapters["runtime_updates"] and isinstance(extra, Mapping):
        servers = extra.get("api_server_count")
        if servers not in (None, "", 1, "1"):
            errors.append(
                f"{host}: vllm_lora_runtime_updates is on with vllm_extra_args.api_server_count="
                f"{inputs.short(servers)}: vLLM refuses runtime LoRA updates with more than one API server; fix: "
                "vllm_lora_runtime_updates: false (adapters change with a rolling restart), or one API server"
            )
    prompt_tokens = hostvars.get("vllm_typical_prompt_tokens", DEFAULT_TYPICAL_PROMPT_TOKENS)
    output_tokens = hostvars.get("vllm_typical_output_tokens", DEFAULT_TYPICAL_OUTPUT_TOKENS)
    errors += _positive_int(host, "vllm_typical_prompt_tokens", prompt_tokens)
    errors += _positive_int(host, "vllm_typical_output_tokens", output_tokens)
    # Without errors the checks above have seen a mapping for vllm_gpu and a string for vllm_version: the
    # isinstance tests never return here, they say so to the type checker.
    if errors or not isinstance(gpu, Mapping) or not isinstance(version, str):
        return entry

    deploy = deploy_inputs(hostvars)
    # Where the vllm role stages the model and its draft (model_path() is where the unit reads them).
    entry["model_dir"] = model_path(profile.get("model"), "staged", None, deploy["vllm_state_dir"])
    draft = (profile.get("speculative") or {}).get("model")
    entry["draft_model_dir"] = model_path(draft, "staged", None, deploy["vllm_state_dir"]) if draft else None
    entry["gpu"] = {key: gpu.get(key) for key in ("name", "count", "memory_mib", "compute_cap") if key in gpu}

    # Placement: how many instances, on which cards (vllm_fleet.placement); the tensor-parallel size decides it.
    device = "cpu" if str(gpu["name"]).lower() == "cpu" else "gpu"
    all_cards = placement.cards(gpu, gpu.get("cards"))
    host_cards, card_errors = placement.select(host, all_cards, deploy["vllm_gpus"])
    if card_errors:
        errors += card_errors
        return entry
    tp = _tensor_parallel_size(
        host, profile, gpu, extra, hostvars, prompt_tokens, output_tokens, len(host_cards), device
    )
    if tp != profile.get("tensor_parallel_size", 1):
        profile = dict(profile, tensor_parallel_size=tp)
        entry["profile_effective"] = profile
    entry["tensor_parallel_size"] = tp
    bind = deploy["vllm_bind_address"]
    laid = placement.place(
        host,
        host_cards,
        tp,
        device=device,
        base_name=str(deploy["vllm_instance"]),
        base_port=int(deploy["vllm_port"]),
        unit_format=str(deploy["vllm_unit_format"]),
        bind=bind,
        inventory_address=str(hostvars.get("ansible_host") or host),
        one_card=len(all_cards) == 1,
    )
    errors += laid["errors"]
    warnings += laid["warnings"]
    needs = placement.tp_needs(str(gpu["name"]), tp) if device == "gpu" else placement.tp_needs("", 1)
    if needs["why"]:
        entry["notes"].append(f"{host}: {needs['why']}")
    rendered = None
    for instance in laid["instances"]:
        # The role's own arguments: keys of render.MANAGED_EXTRA_ARGS, which the gate refused in `extra`.
        own = {
            key: value
            for key, value in (
                ("host", bind),
                ("port", instance["port"]),
                ("shutdown_timeout", deploy["vllm_shutdown_timeout"]),
            )
            if value not in (None, "", 0)
        }
        try:
            rendered = render.render_args(
                profile,
                version,
                model_path=model_path(
                    profile.get("model"),
                    deploy["vllm_model_source"],
                    deploy["vllm_model_src"],
                    deploy["vllm_state_dir"],
                ),
                draft_model_path=draft_model_path(profile, deploy),
                extra_args={**needs["args"], **extra, **own, **lora.args(adapters, render.served_model_name(profile))},
                aliases=aliases,
            )
        except ValueError as exc:
            errors.append(f"{host}: {exc}")
            return entry
        instance["args"] = rendered.args
        # What the gateways route by: the name clients ask for, and the weights behind it (one name, one model).
        instance["served_model_name"] = render.served_model_name(profile)
        instance["weights"] = str(profile.get("model") or "")
        # The adapters it serves beside the model, by name: the gateways send each name only to the instances that
        # load it, and the verification reads them back from the instance's own /v1/models.
        instance["adapters"] = [a["name"] for a in (adapters or {}).get("adapters", [])]
        if device == "gpu":
            instance["environment"] = dict(instance["environment"], **needs["environment"])
        if adapters and adapters["runtime_updates"]:
            instance["environment"] = dict(instance.get("environment") or {}, **{lora.RUNTIME_ENV: "True"})
    entry["instances"] = laid["instances"]
    if rendered is not None:
        entry["dropped"] = rendered.dropped
        warnings += [f"{host}: {w}" for w in rendered.warnings]

    _capacity(host, profile, gpu, extra, hostvars, prompt_tokens, output_tokens, entry)
    return entry


def _tensor_parallel_size(
    host: str,
    profile: Mapping[str, Any],
    gpu: Mapping[str, Any],
    extra: Mapping[str, Any],
    hostvars: Mapping[str, Any],
    prompt_tokens: int,
    output_tokens: int,
    cards: int,
    device: str,
) -> int:
    """The profile's tensor_parallel_size; where it sets none, the smallest of placement.TP_SIZES (within the host's
    cards, dividing the model's heads) at which the model fits one group of cards. When none fits, the largest
    of them: the plan then says why it does not fit, and the smallest placement that would."""
    if "tensor_parallel_size" in profile or device == "cpu":
        given: int = profile.get("tensor_parallel_size", 1)
        return given
    candidates = [tp for tp in placement.TP_SIZES if tp <= cards] or [1]
    for tp in candidates:
        scratch: list[str] = []
        size = size_instance(
            host,
            dict(profile, tensor_parallel_size=tp),
            dict(gpu, count=cards),
            extra,
            hostvars,
            prompt_tokens,
            output_tokens,
            scratch,
        )
        if size is None:
            continue  # a size that does not divide the heads: the next one
        if size.fits and not (size.max_len and size.kv_tokens < size.max_len):
            return tp
    return candidates[-1]


# Where the vllm role puts things and what it binds, read by the plan so that its arguments are the ones the
# unit runs. The values the role's defaults give (roles/vllm/defaults/main.yml) reach the planner through the
# filter plugin, which reads that file; a host's inventory overrides them.
DEPLOY_VARS = (
    "vllm_state_dir",
    "vllm_model_source",
    "vllm_model_src",
    "vllm_draft_model_source",
    "vllm_draft_model_src",
    "vllm_bind_address",
    "vllm_port",
    "vllm_instance",
    "vllm_unit_format",
    "vllm_shutdown_timeout",
    "vllm_gpus",
)


# An alias: a name tenants use for a served model (vllm_model_aliases), as the gateways and vLLM take it.
ALIAS_LENGTH = 256


def model_aliases(host: str, value: Any) -> tuple[dict[str, str], list[str]]:
    """({alias: the served name it points at}, errors) of vllm_model_aliases: a mapping of names, each a string of
    printable characters (256 at most), pointing at a served model's name. Whether that model is served, and that an
    alias is not itself a served name, are the gateways' checks (gateway.route_errors), which see every host."""
    fix = "fix: vllm_model_aliases: {ALIAS: SERVED NAME}, e.g. {chat: Qwen/Qwen2.5-14B-Instruct}, in group_vars/all"
    if value in (None, "", {}):
        return {}, []
    if not isinstance(value, Mapping):
        return {}, [f"{host}: vllm_model_aliases={inputs.short(value)} is not a mapping of alias to served name; {fix}"]
    aliases, errors = {}, []
    for alias, target in value.items():
        if not isinstance(alias, str) or not isinstance(target, str) or not alias.strip() or not target.strip():
            errors.append(
                f"{host}: vllm_model_aliases[{inputs.short(alias)}]={inputs.short(target)}: an alias and the served "
                f"name it points at must be non-empty strings; {fix}"
            )
        elif inputs.CONTROL.search(alias + target) or len(alias) > ALIAS_LENGTH or alias.startswith("-"):
            errors.append(
                f"{host}: vllm_model_aliases[{inputs.short(alias)}] holds a control or format character, starts "
                f"with -, or is longer than {ALIAS_LENGTH}; fix: a name of printable characters, {ALIAS_LENGTH} at most"
            )
        else:
            aliases[alias] = target
    return aliases, errors


def instances(host: str, hostvars: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The host's vLLM instances as its plan places them (what the units bind and a gateway reaches): name,
    unit, port, `local_url` (from the host itself), `address` and `url` (from the host's network), its cards,
    arguments and environment. Empty when the host's plan has errors before its instances are rendered (bad
    vllm_extra_args among them): the host's own plan names them."""
    planned: list[dict[str, Any]] = plan_host(host, hostvars).get("instances", [])
    return planned


def unplanned(host: str, hostvars: Mapping[str, Any], exc: BaseException) -> dict[str, Any]:
    """The plan entry of a host whose planning raised what it should have refused with a message: its one error
    names the host, the exception's kind and where it came from (not its text, which may hold a secret's value)."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(f"{tb.tb_frame.f_globals.get('__name__', '?')}.{tb.tb_frame.f_code.co_name}")
        tb = tb.tb_next
    name = hostvars.get("vllm_profile_name") if isinstance(hostvars, Mapping) else None
    version = hostvars.get("vllm_version") if isinstance(hostvars, Mapping) else None
    return {
        "profile": name if isinstance(name, str) and name else "custom",
        "vllm_version": version if isinstance(version, str) else None,
        "args": [],
        "dropped": [],
        "warnings": [],
        "notes": [],
        "instances": [],
        "capacity": _empty_capacity(),
        "errors": [
            f"{host}: the plan could not be made from the host's settings ({type(exc).__name__} in "
            f"{frames[-1] if frames else '?'}): one of them has a kind or shape the plan did not expect; fix: "
            "check the host's vllm_* settings against the README's variables table, and report this message "
            "so that the plan names the setting"
        ],
    }


def deploy_inputs(hostvars: Mapping[str, Any]) -> dict[str, Any]:
    """The host's DEPLOY_VARS; the instance's name, port and unit from their one home (roles/vllm_defaults, through
    datafiles.role_defaults) where it sets none (the filter plugin passes every role default); the draft's source
    follows the model's unless set."""
    values = {name: hostvars.get(name) for name in DEPLOY_VARS}
    for name in ("vllm_instance", "vllm_port", "vllm_unit_format"):
        if values[name] is None:
            values[name] = datafiles.role_defaults()[name]
    if values["vllm_draft_model_source"] in (None, "") or "{{" in str(values["vllm_draft_model_source"]):
        values["vllm_draft_model_source"] = values["vllm_model_source"]
    return values


def model_dir_name(model: str) -> str:
    """The folder under <state_dir>/models that the vllm role stages a model in."""
    return re.sub(r"[^A-Za-z0-9._-]+", "--", str(model))


def model_path(model: str | None, source: str | None, src: str | None, state_dir: str | None) -> str | None:
    """Where the host has the model: its own path for source `path`, else the staged folder."""
    if not model or not state_dir:
        return None
    if source == "path" and src:
        return str(src)
    return f"{str(state_dir).rstrip('/')}/models/{model_dir_name(model)}"


def draft_model_path(profile: Mapping[str, Any], deploy: Mapping[str, Any]) -> str | None:
    spec = profile.get("speculative") or {}
    if not spec.get("model") or spec.get("method") in profiles.MODEL_FREE_METHODS:
        return None
    return model_path(
        spec["model"], deploy["vllm_draft_model_source"], deploy["vllm_draft_model_src"], deploy["vllm_state_dir"]
    )


def _capacity(
    host: str,
    profile: Mapping[str, Any],
    gpu: Mapping[str, Any],
    extra: Mapping[str, Any],
    hostvars: Mapping[str, Any],
    prompt_tokens: int,
    output_tokens: int,
    entry: dict[str, Any],
) -> None:
    """Size the host's instance (capacity, estimates), then judge it with ERROR_RULES and WARNING_RULES."""
    size = size_instance(host, profile, gpu, extra, hostvars, prompt_tokens, output_tokens, entry["errors"])
    if size is None:
        return
    if size.device == "gpu" and (not size.fits or (size.max_len and size.kv_tokens < size.max_len)):
        size.fit_hint = fit_hint(size, hostvars)
    bandwidth = gpu["bandwidth_gb_s"] * 1e9 * size.tp
    entry["capacity"].update(
        {
            "gpu_memory_bytes": size.gpu_bytes,
            "weights_bytes": size.weights,
            "draft_weights_bytes": size.draft_weights,
            "kv_bytes_per_token": size.kv_per_token,
            "kv_cache_bytes": size.kv_bytes,
            "kv_cache_tokens": size.kv_tokens,
            # What a restart that finds vLLM's torch.compile cache sizes (kv_cache_tokens: the first start's).
            "kv_cache_tokens_warm": size.kv_tokens_warm,
            "max_concurrency_at_max_len": size.kv_tokens // size.max_len if size.max_len else 0,
            "decode_ceiling_tokens_per_s": int(bandwidth // (size.weights + size.draft_weights)),
            "fits": size.fits,
        }
    )
    entry["estimates"] = {
        "activation_peak_bytes": size.activation,
        "runtime_reserve_bytes": size.runtime,
        "cuda_graph_reserve_bytes": size.graphs * size.tp,
    }
    if size.lora_bytes:  # LoRA adapters (issue #53): only then, so that every other host plans as before
        entry["estimates"]["lora_reserve_bytes"] = size.lora_bytes
        entry["notes"].append(size.lora_note)
    # What a warm restart estimates otherwise (the rest as `estimates`): a smaller activation peak, its larger cache
    # is capacity.kv_cache_tokens_warm. Apart, so that `estimates` stays the first start's (gpu/bench records it).
    entry["estimates_warm"] = {"activation_peak_bytes": size.activation_warm}
    # The engine's KV tokens that verification calls as planned: within KV_TOLERANCE of either start.
    low, high = kv_band(size.kv_tokens, size.kv_tokens_warm)
    entry["kv_cache_band"] = {"low_tokens": low, "high_tokens": high, "tolerance_pct": round(KV_TOLERANCE * 100, 2)}
    for rule in ERROR_RULES:
        entry["errors"] += rule(size)
    if size.device == "gpu":
        crash_errors, crash_warnings = known_failure(host, gpu, size.version, size.arch, profile, extra)
        entry["errors"] += crash_errors
        entry["warnings"] += crash_warnings
    for rule in WARNING_RULES:
        entry["warnings"] += rule(size)
    # Service levels: an estimate beside the plan, and the tuning reference's targets it misses (kept apart from
    # `warnings`, which the deployment's checks read, until the estimate has been checked on an Ada card).
    levels = service_levels(size)
    if levels is not None:
        target = match_card(GUIDE_TARGETS, gpu)
        entry["service_levels"] = dict(
            levels,
            guide=(service_levels(size, target["users"], target["prompt_tokens"]) if target else None),
            target=dict(target) if target else None,
            warnings=misses_target(size),
        )


def plan_hosts(hosts: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """plan.json: {"hosts": {host: plan_host(host, vars)}} for every host, sorted by name, and the vllm-fleet version
    that planned them ("vllm_fleet_version")."""
    return {
        "hosts": {host: plan_host(host, hosts[host]) for host in sorted(hosts)},
        "vllm_fleet_version": __version__,
    }


# Above this many hosts the table groups hosts that plan alike, and warnings that say the same (plan.json has
# every host's entry).
TABLE_MAX_ROWS = 40


def _num(capacity: Mapping[str, Any], key: str, fmt: Callable[[Any], str]) -> str:
    """A capacity figure for the table, or "-" when sizing left it out."""
    return "-" if capacity.get(key) is None else fmt(capacity[key])


def table(plan: Mapping[str, Any], max_rows: int = TABLE_MAX_ROWS) -> list[str]:
    """A readable table of plan.json, then the errors, the warnings and the tuning reference's service levels the
    estimate misses (``slo``: estimates, which do not stop a rollout). Up to ``max_rows`` hosts: one row each and
    each host's messages. A larger fleet: a summary first, one row per group of hosts that plan alike, every
    error, and each warning once with the hosts it concerns."""
    header = (
        "host",
        "profile",
        "vllm",
        "instances",
        "weights",
        "draft",
        "KV cache",
        "KV tokens",
        "conc@len",
        "decode t/s",
        "status",
    )
    hosts = plan["hosts"]
    grouped = len(hosts) > max_rows
    groups: dict[tuple[str, ...], list[str]] = {}
    errors: list[str] = []
    warnings: dict[str, list[str]] = {}
    dropped: dict[tuple[str, str], list[str]] = {}
    placed: dict[str, list[str]] = {}  # what the placement set for the cards, and why (once, with its hosts)
    # the tuning reference's service levels the estimate misses (not deployment warnings)
    levels: dict[str, list[str]] = {}
    for host, e in hosts.items():
        c = e["capacity"]
        status = "ERROR" if e["errors"] else ("warn" if e["warnings"] else "ok")
        source = e.get("profile_source") or {}
        row = (
            e["profile"] + (" (measured)" if source.get("kind") == "measured" else ""),
            str(e["vllm_version"]),
            _instances_cell(e),
            _num(c, "weights_bytes", gib),
            _num(c, "draft_weights_bytes", lambda v: gib(v) if v else "-"),
            _num(c, "kv_cache_bytes", gib),
            _num(c, "kv_cache_tokens", lambda v: f"{v:,}"),
            _num(c, "max_concurrency_at_max_len", str),
            _num(c, "decode_ceiling_tokens_per_s", str),
            f"{status} ({len(e['errors'])}E {len(e['warnings'])}W)" if status != "ok" else "ok",
        )
        groups.setdefault(row if grouped else (host, *row), []).append(host)
        errors += e["errors"]
        for message in e["warnings"]:
            text = message.removeprefix(f"{host}: ") if grouped else message
            warnings.setdefault(text, []).append(host)
        for message in (e.get("service_levels") or {}).get("warnings", []):
            text = message.removeprefix(f"{host}: ") if grouped else message
            levels.setdefault(text, []).append(host)
        for d in e["dropped"]:
            dropped.setdefault((d["flag"], d["reason"]), []).append(host)
        for message in e.get("notes") or []:
            placed.setdefault(message.removeprefix(f"{host}: "), []).append(host)
        if source.get("kind") == "measured":
            placed.setdefault(measured_note(source), []).append(host)
    rows: list[tuple[str, ...]] = [header]
    for key, members in groups.items():
        if grouped:
            rows.append((f"{members[0]}" + (f" (+{len(members) - 1} alike)" if len(members) > 1 else ""), *key))
        else:
            rows.append(key)
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if grouped:
        failed = sum(bool(e["errors"]) for e in hosts.values())
        warned = sum(bool(e["warnings"]) and not e["errors"] for e in hosts.values())
        lines[:0] = [
            f"{len(hosts)} hosts: {len(hosts) - failed - warned} ok, {warned} with warnings, {failed} with "
            f"errors; {len(groups)} groups of hosts that plan alike (every host's entry is in plan.json)",
            "",
        ]
    notes = [f"ERROR {m}" for m in errors]
    for tag, messages in (("warn ", warnings), ("slo  ", levels)):
        for text, members in messages.items():
            if grouped:
                names = ", ".join(members[:3]) + (f" and {len(members) - 3} more" if len(members) > 3 else "")
                notes.append(f"{tag} ({len(members)} host{'s' if len(members) > 1 else ''}: {names}) {text}")
            else:
                notes.append(f"{tag} {text}")
    for (flag, reason), members in dropped.items():
        notes.append(f"note  dropped {flag} ({len(members)} host{'s' if len(members) > 1 else ''}): {reason}")
    for text, members in placed.items():
        notes.append(
            f"note  ({len(members)} host{'s' if len(members) > 1 else ''}: {', '.join(members[:3])}"
            f"{f' and {len(members) - 3} more' if len(members) > 3 else ''}) {text}"
        )
    return lines + (["", *notes] if notes else [])


def measured_note(source: Mapping[str, Any]) -> str:
    """Where a host's measured profile comes from, as the plan's table says it."""
    load = source.get("load")
    if isinstance(load, Mapping):
        load = " ".join(str(v) for v in (load.get("source"), load.get("users") and f"{load['users']} users") if v)
    return (
        f"profile {source.get('name')} measured on {source.get('card')} on {source.get('date')} (vLLM "
        f"{source.get('vllm_version')}, driver {source.get('driver')}, {source.get('model')}, load: "
        f"{load}): {source.get('verdict') or 'no verdict recorded'}"
    )


def _instances_cell(entry: Mapping[str, Any]) -> str:
    """How the plan placed the host's instances: 4 x 1 GPU, 1 x 2 GPUs, 2 x cpu (KV columns are per instance)."""
    instances = entry.get("instances") or []
    if not instances:
        return "-"
    if str((entry.get("gpu") or {}).get("name", "")).lower() == "cpu":
        return f"{len(instances)} x cpu"
    tp = entry.get("tensor_parallel_size") or 1
    return f"{len(instances)} x {tp} GPU{'s' if tp > 1 else ''}"
