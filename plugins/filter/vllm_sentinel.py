# Thin Ansible filters over vllm_fleet.sentinel: the host sentinel's settings checked, and its instances.
from __future__ import annotations

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


# Each filter is documented in plugins/filter/<filter>.yml, which ansible-doc -t filter reads.
class FilterModule:
    def filters(self):
        return {
            "vllm_sentinel_instances": vllm_sentinel_instances,
            "vllm_sentinel_errors": vllm_sentinel_errors,
            "vllm_sentinel_errors_hosts": vllm_sentinel_errors_hosts,
        }
