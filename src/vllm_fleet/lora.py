"""LoRA adapters beside a host's base model: their settings, their plan-time checks and the arguments they render.

A site fine-tunes one base model per department or task and serves each adapter beside it, under its own name. The
inventory gives a host's adapters (``vllm_lora_adapters``: each a name and the site's mirror folder it is fetched from,
``url``, or a folder on the controller, ``src``) and vLLM's limits (``vllm_lora_max_loras``: adapters in one batch;
``vllm_lora_max_rank``: the largest rank a slot holds; ``vllm_lora_max_cpu_loras``: adapters kept in host memory, 0
for as many as the host serves). The plan then:

- refuses, naming the host, the setting, the value and the fix: a name that is not one the gateway can route by or
  that clashes with the served model, an alias or another adapter; a rank limit vLLM does not offer; more adapters
  than the instance holds (``max_cpu_loras``); an adapter whose ``adapter_config.json`` (read on the controller before
  any host changes, ``config_errors``) has a rank above ``vllm_lora_max_rank``, is not a LoRA, or was trained for
  another base model than the profile's (vLLM itself loads such an adapter without a word when the shapes agree);
- renders the adapters as the role's own arguments (``args``): ``--enable-lora --max-loras N --max-lora-rank R
  --max-cpu-loras C --lora-modules {"name", "path", "base_model_name"}...``, which the host's own vLLM parser checks
  before the instance starts (roles/vllm/files/vllm-launch.py), as every other argument;
- stages each adapter as it stages a model (roles/vllm/tasks/stage_model.yml: its SHA256SUMS, checked against the
  site's signed manifest, and every file against it) under ``<vllm_state_dir>/adapters/<name>``.

Adding or removing an adapter changes the instance's command line, so it rolls out host by host like any other
change (drained at the gateways first: no request fails). vLLM's runtime loading (VLLM_ALLOW_RUNTIME_LORA_UPDATING,
``/v1/load_lora_adapter``) is not used: vLLM calls it a development feature, it lets any key holder make the server
load a path of its choosing, it is refused with more than one API server, and what it loads lives only in that
process's memory (a restart or the sentinel's heal forgets it). See docs/adapters.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from . import inputs

# vLLM's --max-lora-rank choices (vllm/config/lora.py, MaxLoRARanks).
RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
DEFAULT_MAX_LORAS = 1
DEFAULT_MAX_RANK = 16
# An adapter's name: what clients send as `model` and the folder it is staged in (so no slash, no leading dot).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
ADAPTER_KEYS = ("name", "url", "src")
SETTINGS = ("vllm_lora_adapters", "vllm_lora_max_loras", "vllm_lora_max_rank", "vllm_lora_max_cpu_loras")
# vLLM's switch for its runtime LoRA endpoints (/v1/load_lora_adapter, /v1/unload_lora_adapter): the instance's
# environment carries it where vllm_lora_runtime_updates is on.
RUNTIME_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
MODULES_FLAG = "--lora-modules"
# With runtime updates and vllm_lora_max_cpu_loras 0, the adapters host memory holds, in steps of this many.
RUNTIME_CPU_STEP = 8
ADAPTERS_DIR = "adapters"
CONFIG_FILE = "adapter_config.json"
FIX_ADAPTERS = (
    "fix: vllm_lora_adapters: [{name: NAME, url: MIRROR FOLDER}] (a folder with the adapter's files and its "
    "SHA256SUMS), or {name: NAME, src: CONTROLLER FOLDER}"
)


def settings(
    host: str, hostvars: Mapping[str, Any], state_dir: str = "/var/lib/vllm"
) -> tuple[dict[str, Any] | None, list[str]]:
    """(the host's LoRA settings, errors). None when it serves no adapter. Otherwise {max_loras, max_lora_rank,
    max_cpu_loras, adapters: [{name, source ('url' or 'controller'), location, path}]}, ``path`` where the host
    stages it."""
    errors: list[str] = []
    given = hostvars.get("vllm_lora_adapters")
    if given in (None, "", []):
        for setting in SETTINGS[1:]:
            if hostvars.get(setting) not in (None, "", 0) and inputs.whole(hostvars.get(setting)) is None:
                errors.append(f"{host}: {setting}={inputs.short(hostvars[setting])} is not a whole number; fix: e.g. 4")
        return None, errors
    if not isinstance(given, list):
        return None, [f"{host}: vllm_lora_adapters={inputs.short(given)} is not a list; {FIX_ADAPTERS}"]
    adapters: list[dict[str, Any]] = []
    seen: set[str] = set()
    for index, entry in enumerate(given):
        where = f"{host}: vllm_lora_adapters[{index}]"
        if not isinstance(entry, Mapping):
            errors.append(f"{where}={inputs.short(entry)} is not a mapping; {FIX_ADAPTERS}")
            continue
        unknown = sorted(str(k) for k in entry if k not in ADAPTER_KEYS)
        if unknown:
            errors.append(
                f"{where} has {', '.join(unknown)}, which is not a key of an adapter ({', '.join(ADAPTER_KEYS)}); "
                f"{FIX_ADAPTERS}"
            )
            continue
        name = entry.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            errors.append(
                f"{where}.name={inputs.short(name)} is not an adapter name: 1 to 128 letters, digits and - _ . : "
                "starting with a letter or digit (clients ask for it by this name, and the host stages it in a "
                "folder of that name); fix: e.g. legal-summaries"
            )
            continue
        if name in seen:
            errors.append(f"{where}.name={name!r} is given twice; fix: one entry per adapter, each its own name")
            continue
        seen.add(name)
        url, src = entry.get("url"), entry.get("src")
        if bool(url) == bool(src):
            errors.append(
                f"{where} ({name}) gives {'both url and src' if url else 'neither url nor src'}; fix: url, the "
                "site's mirror folder of the adapter (with its SHA256SUMS), or src, a folder on the controller"
            )
            continue
        location = url or src
        if not isinstance(location, str) or inputs.CONTROL.search(location) or location.strip() != location:
            key = "url" if url else "src"
            errors.append(
                f"{where}.{key}={inputs.short(location)} is not a plain URL or path (a string without control, "
                "format or surrounding space characters); fix: e.g. http://mirror.site/adapters/NAME"
            )
            continue
        if url and not location.startswith(("http://", "https://")):
            errors.append(
                f"{where}.url={inputs.short(location)} is not an http(s) URL; fix: the site's mirror folder, e.g. "
                f"http://mirror.site/adapters/{name}, or src for a folder on the controller"
            )
            continue
        adapters.append(
            {
                "name": name,
                "source": "url" if url else "controller",
                "location": location.rstrip("/"),
                "path": f"{state_dir.rstrip('/')}/{ADAPTERS_DIR}/{name}",
            }
        )
    numbers: dict[str, int] = {}
    for setting, default in (
        ("vllm_lora_max_loras", DEFAULT_MAX_LORAS),
        ("vllm_lora_max_rank", DEFAULT_MAX_RANK),
        ("vllm_lora_max_cpu_loras", 0),
    ):
        raw = hostvars.get(setting)
        raw = default if raw in (None, "") else raw
        number = inputs.whole(raw)
        if number is None or number < (0 if setting == "vllm_lora_max_cpu_loras" else 1):
            errors.append(
                f"{host}: {setting}={inputs.short(raw)} is not a whole number of at least "
                f"{0 if setting == 'vllm_lora_max_cpu_loras' else 1}; fix: e.g. {default or len(adapters)}"
            )
            continue
        numbers[setting] = number
    rank = numbers.get("vllm_lora_max_rank")
    if rank is not None and rank not in RANKS:
        above = [r for r in RANKS if r >= rank]
        errors.append(
            f"{host}: vllm_lora_max_rank={rank} is not a rank vLLM offers ({', '.join(map(str, RANKS))}); fix: "
            f"{above[0] if above else RANKS[-1]}, the next one up (a slot of rank R holds any adapter up to rank R)"
        )
    max_loras = numbers.get("vllm_lora_max_loras")
    cpu = numbers.get("vllm_lora_max_cpu_loras")
    if max_loras is not None and cpu is not None and adapters:
        held = cpu or max(len(adapters), max_loras)
        if cpu and cpu < max_loras:
            errors.append(
                f"{host}: vllm_lora_max_cpu_loras={cpu} is below vllm_lora_max_loras={max_loras}: vLLM refuses to "
                f"start (every adapter of a batch must be in host memory too); fix: vllm_lora_max_cpu_loras: 0 (as "
                f"many as the host serves, {len(adapters)}) or at least {max_loras}"
            )
        elif len(adapters) > held:
            errors.append(
                f"{host}: vllm_lora_adapters lists {len(adapters)} adapters but vllm_lora_max_cpu_loras={cpu} holds "
                f"{held}: vLLM loads every listed adapter at start, and the ones over the limit would push each "
                f"other out of memory and be read from disk again on every turn; fix: vllm_lora_max_cpu_loras: 0 "
                f"(as many as it serves) or at least {len(adapters)}, or serve fewer adapters on this host"
            )
        if max_loras > len(adapters):
            errors.append(
                f"{host}: vllm_lora_max_loras={max_loras} is more than the {len(adapters)} adapter(s) the host serves: "
                f"each slot reserves GPU memory the KV cache then lacks; fix: vllm_lora_max_loras: {len(adapters)}"
            )
    runtime = hostvars.get("vllm_lora_runtime_updates")
    if runtime not in (None, "", True, False):
        errors.append(
            f"{host}: vllm_lora_runtime_updates={inputs.short(runtime)} is not true or false; fix: false (the default: "
            "adapters change with a rolling restart) or true (added and removed at runtime, docs/adapters.md)"
        )
    if errors:
        return None, errors
    assert max_loras is not None and rank is not None and cpu is not None  # no errors: all three are set
    held = cpu or max(len(adapters), max_loras)
    if runtime is True and not cpu:
        # Adapters added at runtime need room in host memory, and a command line that does not change with their
        # count (it would restart the instances): as many as it serves, in steps of RUNTIME_CPU_STEP.
        held = -(-held // RUNTIME_CPU_STEP) * RUNTIME_CPU_STEP
    return {
        "max_loras": max_loras,
        "max_lora_rank": rank,
        "max_cpu_loras": held,
        "runtime_updates": runtime is True,
        "adapters": adapters,
    }, []


def name_errors(host: str, lora: Mapping[str, Any] | None, served: str, aliases: Iterable[str]) -> list[str]:
    """An adapter named as the host's served model or as an alias: a request for it could mean either."""
    errors = []
    taken = {served: "the served model's name (vllm_profile.served_model_name)"}
    taken.update({str(a): "an alias (vllm_model_aliases)" for a in aliases})
    for adapter in (lora or {}).get("adapters", []):
        if adapter["name"] in taken:
            errors.append(
                f"{host}: vllm_lora_adapters name {adapter['name']!r} is also {taken[adapter['name']]}: a request "
                "for it could mean either; fix: another name for the adapter"
            )
    return errors


def sources(lora_by_host: Mapping[str, Mapping[str, Any] | None]) -> list[dict[str, str]]:
    """The adapters' folders whose adapter_config.json the plan reads on the controller, each once: {source,
    location}, sorted."""
    found = {(a["source"], a["location"]) for lora in lora_by_host.values() if lora for a in lora.get("adapters", [])}
    return [{"source": source, "location": location} for source, location in sorted(found)]


def _same_model(trained_for: str, model: str) -> bool:
    """An adapter's base_model_name_or_path names the profile's model: the same id, or a folder of that name (a
    fine-tune often records the local folder it loaded the base from)."""

    def norm(text: str) -> str:
        return text.strip().rstrip("/").lower()

    a, b = norm(trained_for), norm(model)
    return a == b or a.rsplit("/", 1)[-1] == b.rsplit("/", 1)[-1]


def config_errors(
    host: str, lora: Mapping[str, Any] | None, configs: Mapping[str, Any], base_model: str
) -> tuple[list[dict[str, Any]], list[str]]:
    """(each adapter's rank and base model, errors) from the adapter_config.json the plan read
    (``configs``: {location: the file's text, or {"error": why it could not be read}})."""
    errors: list[str] = []
    found: list[dict[str, Any]] = []
    for index, adapter in enumerate((lora or {}).get("adapters", [])):
        where = f"{host}: vllm_lora_adapters[{index}] ({adapter['name']}, {adapter['location']}/{CONFIG_FILE})"
        raw = configs.get(adapter["location"])
        if isinstance(raw, Mapping) and "error" in raw:
            errors.append(
                f"{where} could not be read on the controller: {inputs.short(raw['error'], 200, str)}; fix: serve the "
                f"adapter's folder with its {CONFIG_FILE} and SHA256SUMS at that location"
            )
            continue
        try:
            config = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
        except ValueError as exc:
            errors.append(f"{where} is not JSON ({exc}); fix: the adapter's own {CONFIG_FILE}, as training wrote it")
            continue
        if not isinstance(config, Mapping):
            errors.append(
                f"{where} holds no adapter configuration; fix: the adapter's own {CONFIG_FILE}, as training wrote it"
            )
            continue
        peft_type = str(config.get("peft_type") or "")
        if peft_type.upper() != "LORA":
            errors.append(
                f"{where} says peft_type={inputs.short(config.get('peft_type'))}: vLLM serves LoRA adapters only; "
                "fix: a LoRA adapter (peft_type LORA), or remove this entry"
            )
            continue
        rank = inputs.whole(config.get("r"))
        if rank is None or rank < 1:
            errors.append(f"{where} gives no rank (r={inputs.short(config.get('r'))}); fix: the adapter's own file")
            continue
        if config.get("use_dora"):
            errors.append(f"{where} is a DoRA adapter (use_dora: true), which vLLM refuses; fix: a plain LoRA adapter")
        if config.get("modules_to_save"):
            errors.append(
                f"{where} saves whole modules (modules_to_save={inputs.short(config.get('modules_to_save'))}), which "
                "vLLM refuses to load; fix: train it without modules_to_save"
            )
        limit = lora["max_lora_rank"] if lora else 0
        if rank > limit:
            above = [r for r in RANKS if r >= rank]
            errors.append(
                f"{where} has rank {rank}, above vllm_lora_max_rank={limit}: vLLM would refuse to start the "
                f"instance; fix: vllm_lora_max_rank: {above[0] if above else 'none offered, retrain with a lower rank'}"
                " (it reserves that rank for every slot: GPU memory the KV cache then lacks)"
            )
        trained_for = config.get("base_model_name_or_path")
        if not isinstance(trained_for, str) or not trained_for:
            errors.append(
                f"{where} names no base model (base_model_name_or_path): the plan cannot tell it was trained for "
                f"{base_model}; fix: set base_model_name_or_path: {base_model} in its {CONFIG_FILE} if it was"
            )
        elif not _same_model(trained_for, base_model):
            errors.append(
                f"{where} was trained for {inputs.short(trained_for)}, not for this host's model {base_model!r} "
                "(vllm_profile.model): vLLM would load it without a word where the shapes agree, and answer "
                "nonsense; fix: an adapter trained for this model, or serve it on the hosts of its own model"
            )
        found.append({"name": adapter["name"], "rank": rank, "base_model": str(trained_for or "")})
    return found, errors


def args(lora: Mapping[str, Any] | None, served: str) -> dict[str, Any]:
    """The role's own vLLM arguments for the host's adapters (snake_case: value, rendered with the others)."""
    if not lora:
        return {}
    return {
        "enable_lora": True,
        "max_loras": lora["max_loras"],
        "max_lora_rank": lora["max_lora_rank"],
        "max_cpu_loras": lora["max_cpu_loras"],
        "lora_modules": [
            json.dumps(
                {"name": a["name"], "path": a["path"], "base_model_name": served}, sort_keys=True, separators=(",", ":")
            )
            for a in lora["adapters"]
        ],
    }


def modules_in_args(args: Any) -> list[dict[str, str]] | None:
    """The adapters a `vllm serve` command line loads (its --lora-modules values: JSON objects, or name=path), each
    {name, path}; None when `args` is no list."""
    if not isinstance(args, (list, tuple)):
        return None
    found: list[dict[str, str]] = []
    taking = False
    for arg in map(str, args):
        if arg.startswith("--"):
            taking = arg == MODULES_FLAG
            continue
        if not taking:
            continue
        try:
            module = json.loads(arg)
        except ValueError:
            module = None
        if isinstance(module, Mapping) and module.get("name"):
            found.append({"name": str(module["name"]), "path": str(module.get("path") or "")})
        elif "=" in arg:
            name, path = arg.split("=", 1)
            found.append({"name": name, "path": path})
    return found


def without_modules(args: Iterable[Any]) -> list[str]:
    """A command line less its --lora-modules and their values."""
    kept: list[str] = []
    taking = False
    for arg in map(str, args):
        if arg.startswith("--"):
            taking = arg == MODULES_FLAG
            if taking:
                continue
        elif taking:
            continue
        kept.append(arg)
    return kept


def runtime_change(before: Any, after: Any) -> dict[str, Any]:
    """What vLLM's runtime endpoints must do for an instance to serve the adapters of `after` (its new command line)
    when `before` (the one it runs) differs from it in its adapters only: {load: [{name, path}], unload: [name]};
    {} when anything else differs (a restart then applies it), when nothing does, or when either is no list. An
    adapter of one name whose path changed is unloaded and loaded again."""
    old, new = modules_in_args(before), modules_in_args(after)
    if old is None or new is None or without_modules(before) != without_modules(after):
        return {}
    old_paths = {m["name"]: m["path"] for m in old}
    new_paths = {m["name"]: m["path"] for m in new}
    unload = sorted(n for n, path in old_paths.items() if new_paths.get(n) != path)
    load = [m for m in new if old_paths.get(m["name"]) != m["path"]]
    if not load and not unload:
        return {}
    return {"load": load, "unload": unload}
