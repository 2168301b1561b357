# Thin Ansible filters over vllm_fleet.egress: what a fleet host may send out, and what its rules refused.
from __future__ import annotations

DOCUMENTATION = r"""
name: vllm_egress_rules
short_description: A fleet host's egress rules from the inventory, and the other vllm_egress_* filters
description:
  - >-
    C(hostvars | vllm_egress_rules(host, groups)) gives C({errors, rules, dns}) for one host, admitting the other
    fleet hosts (groups vllm_nodes, vllm_gateways, vllm_monitoring) by their C(ansible_host), the hosts of the URLs
    its roles reach (wheelhouse, models, alert receivers), C(vllm_egress_dns) and C(vllm_egress_allow). Each error
    names the host, the setting, the value and the fix (a URL whose host is a name needs its address in
    C(vllm_egress_allow)).
  - C(vllm_egress_comment) makes a rule's reason safe as an nftables comment.
  - C(vllm_egress_destination) says one of those destinations in words.
  - C(vllm_egress_denied) reads C(nft -j list table inet <table>) into C({packets, bytes, destinations}), what the
    rules refused since they were loaded, each destination with its own count.
options:
  _input:
    description: hostvars for C(vllm_egress_rules); a text for the other two.
    type: raw
    required: true
author:
  - vllm-fleet maintainers
"""

EXAMPLES = r"""
- name: The host's egress rules (errors stop the run)
  ansible.builtin.debug:
    msg: "{{ (hostvars | vllm_egress_rules(inventory_hostname, groups)).rules }}"
"""

RETURN = r"""
_value:
  description:
    - C(vllm_egress_rules), C({errors, rules, dns}) (each rule C({family, to, proto, ports, why})).
    - C(vllm_egress_comment), a string; C(vllm_egress_denied), C({packets, bytes, destinations}).
  type: raw
"""

import os
import sys
from collections.abc import Mapping

from ansible.errors import AnsibleError, AnsibleFilterError
from jinja2 import Undefined

# The library of this checkout, beside the plugin (never another installed copy): every filter plugin loads it so.
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
from vllm_fleet import egress, inputs


def vllm_egress_rules(hostvars, host, groups):
    if not isinstance(hostvars, Mapping) or not isinstance(groups, Mapping):
        raise AnsibleFilterError(
            "vllm_egress_rules expects hostvars | vllm_egress_rules(host, groups), got %s and %s"
            % (type(hostvars).__name__, type(groups).__name__)
        )
    fleet = egress.fleet_hosts(groups)
    settings, unresolved = _own_settings(hostvars[host])
    settings[egress.MONITORING_HOST] = str(host) in (groups.get("vllm_monitoring") or [])
    result = egress.rules(str(host), settings, {name: _peer(hostvars[name]) for name in fleet})
    result["errors"] = [
        "%s: %s cannot be resolved when the egress rules are made (%s); fix: define what it is built from in the "
        "inventory" % (host, name, reason)
        for name, reason in unresolved
    ] + result["errors"]
    return result


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


class FilterModule:
    """The vLLM fleet's egress filters."""

    def filters(self):
        return {
            "vllm_egress_rules": vllm_egress_rules,
            "vllm_egress_comment": vllm_egress_comment,
            "vllm_egress_denied": vllm_egress_denied,
            "vllm_egress_destination": vllm_egress_destination,
        }
