# Thin Ansible filters over vllm_fleet.egress: what a fleet host may send out, and what its rules refused.
from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from ansible.errors import AnsibleError, AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.vars.hostvars import HostVarsVars
from jinja2 import Undefined

# The library of this checkout, beside the plugin (never another installed copy): every filter plugin loads it so.
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
from vllm_fleet import datafiles, egress, inputs

# vllm_egress where the inventory does not set it: the default every role reads (roles/vllm_defaults).
_DEFAULT_ON = datafiles.role_defaults().get("vllm_egress", True)


def _check_args(name, hostvars, groups):
    if not isinstance(hostvars, Mapping) or not isinstance(groups, Mapping):
        raise AnsibleFilterError(
            "%s expects hostvars | %s(..., groups), got %s and %s"
            % (name, name, type(hostvars).__name__, type(groups).__name__)
        )


def vllm_egress_rules(hostvars, host, groups, peers=None):
    _check_args("vllm_egress_rules", hostvars, groups)
    if peers is None:
        peers = vllm_egress_peers(hostvars, groups)
    elif not isinstance(peers, Mapping) or not all(isinstance(p, Mapping) for p in peers.values()):
        raise AnsibleFilterError(
            "vllm_egress_rules: peers must be vllm_egress_peers' output, got %s" % inputs.short(peers)
        )
    settings, unresolved = _settings(host, hostvars[host], groups)
    result = egress.rules(str(host), settings, peers)
    result["errors"] = unresolved + result["errors"]
    return result


def vllm_egress_peers(hostvars, groups, views=None):
    """What egress reads of every fleet host (its address, the gateways' shared address), each host's variables read
    once: given to vllm_egress_rules on each host, it spares each host reading all the others again."""
    _check_args("vllm_egress_peers", hostvars, groups)
    fleet = egress.fleet_hosts(groups)
    views = views or _views(hostvars, fleet)
    return {name: _peer(_variables(views[name], name)) for name in fleet}


def _settings(host, variables, groups):
    """(the host's settings egress reads, an error line for each that cannot be resolved yet)."""
    settings, unresolved = _own_settings(variables)
    settings[egress.MONITORING_HOST] = str(host) in (groups.get("vllm_monitoring") or [])
    return settings, [
        "%s: %s cannot be resolved when the egress rules are made (%s); fix: define what it is built from in the "
        "inventory" % (host, name, reason)
        for name, reason in unresolved
    ]


def _views(hostvars, names):
    """{host: its variables} for `names`, each host's read once (Ansible merges them on every hostvars[host]): its raw
    variables and the loader to template them with, or, for a plain mapping, the host's own."""
    raw_get = getattr(hostvars, "raw_get", None)
    if raw_get is None:
        return {name: hostvars[name] for name in names}
    loader = getattr(hostvars, "_loader", None)
    return {name: (raw_get(name), loader) for name in names}


def _variables(view, host, plan=None):
    """A host's variables from its view, templated on access as hostvars[host] is (Ansible's HostVarsVars), with its
    profile from the plan (vllm_profile_effective, which its model URLs may be built from) where the host has none yet:
    the vllm role's preflight takes it so, later in the run."""
    entry = (plan.get("hosts") or {}).get(host) if isinstance(plan, Mapping) else None
    profile = entry.get("profile_effective") if isinstance(entry, Mapping) else None
    variables = view[0] if isinstance(view, tuple) else view
    if profile is not None and "vllm_profile_effective" not in variables:
        variables = {**variables, "vllm_profile_effective": profile}
    return HostVarsVars(variables, loader=view[1], host=host) if isinstance(view, tuple) else variables


def vllm_egress_errors_hosts(hostvars, hosts, groups, plan=None):
    """The egress errors of each of `hosts` whose vllm_egress is on (vllm_defaults' default: on), in one pass; a vLLM
    host's settings see its profile from `plan` (the fact vllm_plan)."""
    _check_args("vllm_egress_errors_hosts", hostvars, groups)
    if isinstance(hosts, str) or not hasattr(hosts, "__iter__"):
        raise AnsibleFilterError(
            "vllm_egress_errors_hosts: expected a list of host names, got %s" % inputs.short(hosts)
        )
    views = _views(hostvars, dict.fromkeys([*egress.fleet_hosts(groups), *map(str, hosts)]))
    named = egress.named_peers(vllm_egress_peers(hostvars, groups, views))
    errors = []
    for host in map(str, hosts):
        variables = _variables(views[host], host, plan)
        try:
            enabled = variables.get("vllm_egress", _DEFAULT_ON)
            on = boolean(inputs.plain(enabled), strict=True) if not isinstance(enabled, Undefined) else None
        except (TypeError, AnsibleError):
            on = None
        if on is None:
            errors.append("%s: vllm_egress is not a boolean or cannot be resolved; fix: true or false" % host)
        elif on:
            settings, unresolved = _settings(host, variables, groups)
            errors += unresolved + egress.errors(host, settings, named)
    return errors


def _own_settings(variables):
    """The host's settings egress reads, as plain values; a setting whose template cannot be resolved yet (built
    from a fact a later play publishes) is named, not raised."""
    settings, unresolved = {}, []
    for name in egress.SETTINGS:
        try:
            value = variables.get(name)
            if isinstance(value, Undefined):
                unresolved.append((name, str(getattr(value, "_undefined_message", "undefined"))[:200]))
                continue
            settings[name] = inputs.plain(value)
        except AnsibleError as exc:
            unresolved.append((name, str(exc).splitlines()[0][:200]))
    return settings, unresolved


def _peer(variables):
    """What egress reads of another fleet host: its address, and the address the gateways share if it is one."""
    found = {}
    for name in ("ansible_host", "vllm_gateway_vip"):
        value = variables.get(name)
        if value is not None and not isinstance(value, Undefined):
            found[name] = inputs.plain(value)
    return found


def vllm_egress_comment(text):
    return egress.nft_comment(str(text))


def vllm_egress_denied(listing):
    try:
        return egress.denied(str(listing))
    except ValueError as exc:
        raise AnsibleFilterError("vllm_egress_denied: %s" % exc) from exc


def vllm_egress_destination(destination):
    if not isinstance(destination, Mapping):
        raise AnsibleFilterError("vllm_egress_destination expects one of vllm_egress_denied's destinations")
    return egress.describe(destination)


# Each filter is documented in plugins/filter/<filter>.yml, which ansible-doc -t filter reads.
class FilterModule:
    """The vLLM fleet's egress filters."""

    def filters(self):
        return {
            "vllm_egress_rules": vllm_egress_rules,
            "vllm_egress_errors_hosts": vllm_egress_errors_hosts,
            "vllm_egress_peers": vllm_egress_peers,
            "vllm_egress_comment": vllm_egress_comment,
            "vllm_egress_denied": vllm_egress_denied,
            "vllm_egress_destination": vllm_egress_destination,
        }
