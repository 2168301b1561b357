# Thin Ansible filters over vllm_fleet.monitoring: what the vllm_monitoring role and playbooks/diagnose.yml use.
from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from functools import lru_cache

import yaml
from ansible.errors import AnsibleFilterError

# The library of this checkout, beside the plugin (never another installed copy): every filter plugin loads it so.
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
from vllm_fleet import inputs, monitoring


def vllm_monitoring_targets(plan):
    if not isinstance(plan, Mapping) or not isinstance(plan.get("hosts"), Mapping):
        raise AnsibleFilterError(
            f"vllm_monitoring_targets: expected plan.json's {{'hosts': {{...}}}}, got {plan!r:.200}"
        )
    return monitoring.targets(plan["hosts"])


def vllm_monitoring_gateway_targets(gateways):
    if isinstance(gateways, (str, bytes, Mapping)) or not hasattr(gateways, "__iter__"):
        raise AnsibleFilterError("vllm_monitoring_gateway_targets: expected the gateways' hostvars, a list")
    return monitoring.gateway_targets(list(gateways))


def vllm_monitoring_rules(shipped, pending=None):
    if not isinstance(shipped, Mapping) or not isinstance(pending or {}, Mapping):
        raise AnsibleFilterError("vllm_monitoring_rules: expected the rules file's groups and {alert: for}")
    try:
        return monitoring.rules(shipped, pending)
    except ValueError as exc:
        raise AnsibleFilterError(f"vllm_monitoring_alert_pending: {exc}; fix: name shipped alerts only") from exc


def vllm_firewall_networks(entries, host, setting):
    try:
        found = inputs.networks(str(host), str(setting), entries)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc
    return {
        family: [str(n) for n in sorted({n for n in found if n.version == version})]
        for family, version in (("ipv4", 4), ("ipv6", 6))
    }


@lru_cache(maxsize=1)
def _defaults():
    """The role's literal defaults (a templated one, such as the templates' paths, is not a setting check reads)."""
    path = os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "roles", "vllm_monitoring", "defaults", "main.yml"
    )
    with open(path, encoding="utf-8") as handle:
        return {k: v for k, v in (yaml.safe_load(handle) or {}).items() if not (isinstance(v, str) and "{{" in v)}


def _plain(value):
    """Plain Python values; a Vault value (ansible-core's EncryptedString) as its plaintext."""
    if type(value).__name__ == "EncryptedString":
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return inputs.plain(value)


def vllm_monitoring_errors(variables, host):
    if not isinstance(variables, Mapping):
        raise AnsibleFilterError(
            "vllm_monitoring_errors expects hostvars[host] | vllm_monitoring_errors(host), got "
            f"{type(variables).__name__}"
        )
    defaults = _defaults()
    values = {
        name: _plain(variables[name]) if name in variables else defaults.get(name) for name in monitoring.SETTINGS
    }
    return monitoring.check(str(host), {k: v for k, v in values.items() if v is not None})


def vllm_monitoring_increases(results, names):
    """Prometheus' instant-query answers of sum by (instance) (increase(NAME_total[W])), one per name, as
    {instance: {name: increase}}."""
    return monitoring.increases_by_instance(list(results), list(names))


def vllm_monitoring_series(results, names):
    """Prometheus' range-query answers, one per name, as {name: {instance: [[time, value], ...]}}."""
    return monitoring.series_by_instance(list(results), list(names))


def vllm_monitoring_findings(increases, window, prefix_caching=None):
    if not isinstance(increases, Mapping):
        raise AnsibleFilterError(f"vllm_monitoring_findings: expected {{counter: increase}}, got {increases!r:.200}")
    return monitoring.window_findings(increases, str(window), prefix_caching)


# Each filter is documented in plugins/filter/<filter>.yml, which ansible-doc -t filter reads.
class FilterModule:
    """vLLM fleet monitoring filters."""

    def filters(self):
        return {
            "vllm_monitoring_targets": vllm_monitoring_targets,
            "vllm_monitoring_gateway_targets": vllm_monitoring_gateway_targets,
            "vllm_monitoring_rules": vllm_monitoring_rules,
            "vllm_firewall_networks": vllm_firewall_networks,
            "vllm_monitoring_findings": vllm_monitoring_findings,
            "vllm_monitoring_increases": vllm_monitoring_increases,
            "vllm_monitoring_series": vllm_monitoring_series,
            "vllm_monitoring_errors": vllm_monitoring_errors,
        }
