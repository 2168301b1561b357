"""Filters over vllm_fleet: resolve a host's profile, render its vLLM arguments, plan its capacity."""
import os
import sys
from collections.abc import Mapping
from functools import lru_cache

import yaml
from ansible.errors import AnsibleFilterError

try:
    from vllm_fleet import compat, inputs, planner, profiles, render
except ImportError:  # run from a checkout whose package is not installed in Ansible's Python
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
    from vllm_fleet import compat, inputs, planner, profiles, render

DOCUMENTATION = r"""
name: vllm_plan_host
short_description: Plan one host's vLLM instance (profile, arguments, capacity) on the controller
description:
  - Resolves the host's profile (C(vllm_profile_name) with C(vllm_profile) merged over it), validates it,
    renders the C(vllm serve) arguments for the host's C(vllm_version) and sizes the instance against C(vllm_gpu)
    the way vLLM does (C(gpu_memory_utilization) is a share of the GPU's total memory).
  - Returns the host's entry of C(plan.json); problems are in its C(errors) and C(warnings), never raised.
  - "C(hostvars | vllm_plan_hosts(ansible_play_hosts, typical_prompt_tokens, typical_output_tokens)) plans many hosts
    in one pass and returns the whole C(plan.json), a dict with one key C(hosts): host name to plan."
  - The same file holds C(vllm_profile_resolve) (name | vllm_profile_resolve(overrides, host=...)),
    C(vllm_render_args) (profile | vllm_render_args(version, model_path=, draft_model_path=, extra_args=))
    C(vllm_min_driver) (vllm_version | vllm_min_driver, the C({vllm, cuda, driver}) line of data/cuda_compat.yml)
    and C(vllm_plan_table) (plan | vllm_plan_table); those raise AnsibleFilterError naming the bad value.
options:
  _input:
    description:
      - The host's planning variables, C(vllm_profile_name), C(vllm_profile), C(vllm_gpu), C(vllm_version), and
        optionally C(vllm_model_config), C(vllm_draft_model_config), C(vllm_extra_args),
        C(vllm_typical_prompt_tokens), C(vllm_typical_output_tokens).
    type: dict
    required: true
  host:
    description: The host's name, used in every message.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Plan this host
  ansible.builtin.set_fact:
    __vllm_plan_host: >-
      {{ {'vllm_profile_name': vllm_profile_name, 'vllm_profile': vllm_profile | default({}),
          'vllm_gpu': vllm_gpu, 'vllm_version': vllm_version} | vllm_plan_host(inventory_hostname) }}

- name: Resolve a profile with one key overridden
  ansible.builtin.debug:
    msg: "{{ 'rtx4090-7b-decode' | vllm_profile_resolve({'max_num_seqs': 32}, host=inventory_hostname) }}"

- name: Render it for vLLM 0.33.0, the model staged at a local path
  ansible.builtin.debug:
    msg: "{{ profile | vllm_render_args('0.33.0', model_path='/var/lib/vllm/models/qwen') }}"
"""

RETURN = r"""
_value:
  description: The host's plan.
  type: dict
  contains:
    profile: {description: The shipped profile's name, or C(custom)., type: str}
    vllm_version: {description: The vLLM release planned for., type: str}
    args: {description: The C(vllm serve) arguments (model first, positional)., type: list, elements: str}
    dropped: {description: "Flags the release no longer has: C({flag, reason})", type: list, elements: dict}
    errors: {description: Problems that forbid deploying the host, each naming host, values and fix., type: list, elements: str}
    warnings: {description: Problems that make the host run worse than the guide intends., type: list, elements: str}
    capacity:
      description: >-
        gpu_memory_bytes, weights_bytes, draft_weights_bytes, kv_bytes_per_token, kv_cache_bytes, kv_cache_tokens,
        max_concurrency_at_max_len, decode_ceiling_tokens_per_s (integers, null when an error prevented sizing) and fits.
      type: dict
"""


# The vllm role's defaults are the one home of where it stages models and what it binds; the plan renders the
# unit's arguments with them wherever the inventory does not say otherwise.
ROLE_DEFAULTS = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "vllm", "defaults", "main.yml")


@lru_cache(maxsize=1)
def deploy_defaults():
    with open(ROLE_DEFAULTS) as handle:
        defaults = yaml.safe_load(handle) or {}
    return {name: defaults.get(name) for name in planner.DEPLOY_VARS + inputs.UNIT_VARS}


_PLAN_VARS = tuple(dict.fromkeys(("vllm_profile_name", "vllm_profile", "vllm_gpu", "vllm_version", "vllm_model_config",
                                  "vllm_draft_model_config", "vllm_extra_args") + planner.DEPLOY_VARS + inputs.UNIT_VARS))


def plan_inputs(variables):
    """The planning variables of one host (a dict, or Ansible's lazy hostvars), with the role's defaults."""
    inputs = {}
    defaults = deploy_defaults()
    for name in _PLAN_VARS:
        value = variables.get(name)
        inputs[name] = defaults.get(name) if value is None and name in defaults else value
    for name in ("vllm_typical_prompt_tokens", "vllm_typical_output_tokens"):
        if variables.get(name) is not None:
            inputs[name] = variables.get(name)
    return inputs


def vllm_plan_host(hostvars, host):
    if not isinstance(hostvars, Mapping):
        raise AnsibleFilterError(f"vllm_plan_host: expected a mapping of the host's variables, got {type(hostvars).__name__}")
    return planner.plan_host(str(host), plan_inputs(hostvars))


def vllm_plan_hosts(hostvars, hosts, typical_prompt_tokens=None, typical_output_tokens=None):
    """plan.json for `hosts`, reading each host's planning variables from `hostvars` in one pass."""
    if isinstance(hosts, str) or not hasattr(hosts, "__iter__"):
        raise AnsibleFilterError(f"vllm_plan_hosts: expected a list of host names, got {hosts!r}")
    inputs = {}
    for host in hosts:
        try:
            variables = hostvars[host]
        except KeyError:
            raise AnsibleFilterError(f"vllm_plan_hosts: host {host!r} is not in hostvars") from None
        inputs[str(host)] = plan_inputs(variables)
        if typical_prompt_tokens is not None:
            inputs[str(host)]["vllm_typical_prompt_tokens"] = typical_prompt_tokens
        if typical_output_tokens is not None:
            inputs[str(host)]["vllm_typical_output_tokens"] = typical_output_tokens
    return planner.plan_hosts(inputs)


def vllm_profile_resolve(name, overrides=None, host="host", validate=True):
    try:
        profile = profiles.resolve(str(host), name or None, overrides or {})
    except profiles.ProfileError as exc:
        raise AnsibleFilterError(f"vllm_profile_resolve: {exc}") from exc
    if validate:
        errors = profiles.validate(str(host), profile)
        if errors:
            raise AnsibleFilterError("vllm_profile_resolve: " + " | ".join(errors))
    return profile


def vllm_render_args(profile, version, model_path=None, draft_model_path=None, extra_args=None):
    if not isinstance(profile, dict):
        raise AnsibleFilterError(f"vllm_render_args: profile={profile!r} is not a dict")
    try:
        return render.render_args(profile, version, model_path=model_path or None,
                                  draft_model_path=draft_model_path or None, extra_args=extra_args or None).as_dict()
    except ValueError as exc:
        raise AnsibleFilterError(f"vllm_render_args: {exc}") from exc


def vllm_min_driver(vllm_version):
    """The {vllm, cuda, driver} line of data/cuda_compat.yml that applies to a vLLM release."""
    try:
        return compat.min_driver(vllm_version)
    except ValueError as exc:
        raise AnsibleFilterError(f"vllm_min_driver: {exc}") from exc


def vllm_plan_table(plan):
    if not isinstance(plan, dict) or not isinstance(plan.get("hosts"), dict):
        raise AnsibleFilterError(f"vllm_plan_table: expected plan.json's {{'hosts': {{...}}}}, got {plan!r}")
    return planner.table(plan)


class FilterModule:
    """vLLM fleet planning filters."""

    def filters(self):
        return {
            "vllm_plan_host": vllm_plan_host,
            "vllm_plan_hosts": vllm_plan_hosts,
            "vllm_profile_resolve": vllm_profile_resolve,
            "vllm_render_args": vllm_render_args,
            "vllm_plan_table": vllm_plan_table,
            "vllm_min_driver": vllm_min_driver,
        }
