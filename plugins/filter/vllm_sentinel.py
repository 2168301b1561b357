# Thin Ansible filters over vllm_fleet.sentinel: the host sentinel's settings checked, and its instances.
from __future__ import annotations

DOCUMENTATION = r"""
name: vllm_sentinel_instances
short_description: The host sentinel's instances from the host's plan entry, and its settings' errors
description:
  - >-
    C(instances | vllm_sentinel_instances(served_model_name, vllm_unit_format, vllm_config_dir)) gives, for each
    planned instance, where the sentinel probes it, its unit, the vllm role's files of it and its GPUs.
  - >-
    C(settings | vllm_sentinel_errors(host, instance_ports)) gives each bad C(vllm_sentinel_*) setting of the host
    (C(settings): their names and values) with its value and the fix.
  - >-
    C(hostvars | vllm_sentinel_errors_hosts(hosts, plan)) gives the same for every host of C(hosts) in one pass (the
    plan's check, run once): each setting the inventory does not give takes its default (roles/vllm_defaults), and
    each host's instance ports come from C(plan) (the fact C(vllm_plan)).
options:
  _input:
    description: The plan entry's instances, or the host's variables.
    type: raw
    required: true
author:
  - vllm-fleet maintainers
"""

EXAMPLES = r"""
- name: The sentinel's settings hold
  ansible.builtin.assert:
    that: "(_settings | vllm_sentinel_errors(inventory_hostname, [8000])) | length == 0"
  vars:
    _settings: {vllm_sentinel_interval_s: 10}

- name: Every host's sentinel settings hold (once for the play)
  ansible.builtin.assert:
    that: (hostvars | vllm_sentinel_errors_hosts(ansible_play_hosts, vllm_plan)) | length == 0
  run_once: true
"""

RETURN = r"""
_value:
  description: A list of instances (dicts), or a list of error lines.
  type: list
"""

import os
import sys
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

# The library of this checkout, beside the plugin (never another installed copy): every filter plugin loads it so.
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
from vllm_fleet import datafiles, inputs, sentinel


def vllm_sentinel_instances(planned, served_model_name, unit_format, config_dir):
    if not isinstance(planned, (list, tuple)) or not all(isinstance(i, Mapping) and "name" in i for i in planned):
        raise AnsibleFilterError("vllm_sentinel_instances expects the plan entry's instances (a list of dicts)")
    return sentinel.instances(planned, str(served_model_name or ""), str(unit_format), str(config_dir))


def vllm_sentinel_errors(settings, host, instance_ports=()):
    if not isinstance(settings, Mapping):
        raise AnsibleFilterError("vllm_sentinel_errors expects {setting: value}, got %s" % type(settings).__name__)
    return sentinel.errors(str(host), settings, list(instance_ports or []))


def vllm_sentinel_errors_hosts(hostvars, hosts, plan):
    if not isinstance(hostvars, Mapping):
        raise AnsibleFilterError("vllm_sentinel_errors_hosts expects hostvars, got %s" % type(hostvars).__name__)
    if isinstance(hosts, str) or not hasattr(hosts, "__iter__"):
        raise AnsibleFilterError(
            "vllm_sentinel_errors_hosts: expected a list of host names, got %s" % inputs.short(hosts)
        )
    entries = plan.get("hosts") if isinstance(plan, Mapping) else None
    if not isinstance(entries, Mapping):
        raise AnsibleFilterError(
            "vllm_sentinel_errors_hosts: expected the plan (the fact vllm_plan), got %s" % inputs.short(plan)
        )
    defaults = datafiles.role_defaults()
    errors = []
    for host in hosts:
        variables = hostvars[host]
        settings = {name: variables.get(name, defaults.get(name)) for name in sentinel.SETTINGS}
        ports = [i.get("port") for i in (entries.get(host) or {}).get("instances") or [] if isinstance(i, Mapping)]
        errors += sentinel.errors(str(host), settings, ports)
    return errors


class FilterModule:
    def filters(self):
        return {
            "vllm_sentinel_instances": vllm_sentinel_instances,
            "vllm_sentinel_errors": vllm_sentinel_errors,
            "vllm_sentinel_errors_hosts": vllm_sentinel_errors_hosts,
        }
