# Thin Ansible filters over vllm_fleet.gateway: what the vllm_gateway role and site.yml's drain use.
from __future__ import annotations

DOCUMENTATION = r"""
name: vllm_gateway_servers
short_description: The gateway's backend servers from the plan's instances, and the other vllm_gateway_* filters
description:
  - C(vllm_gateway_servers) turns C(hostvars | vllm_plan_instances(hosts)) into one backend server per instance
    (C(name), C(host), C(instance), C(address), C(port), C(retiring)); given C(hostvars | vllm_gateway_deployed(hosts))
    (the instances each host runs now, as site.yml read them), also one per instance a host still runs that its
    plan no longer has (C(retiring)). C(vllm_gateway_server_name) (host, instance) names one.
  - C(vllm_gateway_tenants) turns C(vllm_gateway_api_keys) into C({tenant, key_sha256, requests_per_minute}), since
    the gateway keeps only the keys' digests.
  - C(vllm_gateway_errors) (host) checks a gateway's settings; each message names the host, the setting and the fix,
    never a key.
  - C(hostvars | vllm_gateway_backend_key(gateway, backend hosts)) is the key the gateway sends vLLM, the one
    C(vllm_api_key) every backend host shares (empty when none has one); an error, naming the gateway and two hosts
    that differ but never a key, when they do not share one. C(vllm_gateway_backend_key_errors) (the same arguments)
    gives that error as a list, empty when they share one.
  - C(hostvars | vllm_gateway_clients(gateways, allowed, host, monitoring)) turns the gateways (their names, each by
    its C(vllm_gateway_source_address), by default its C(ansible_host)), the monitoring hosts (by their
    C(ansible_host)) and a host's C(vllm_allowed_clients) into the networks, by family (keys ipv4 and ipv6), that may
    reach that host's vLLM ports (its nftables rules).
  - C(vllm_gateway_sessions) (backend, server) reads a server's current sessions from the runtime API's C(show stat);
    C(vllm_gateway_requests_running) reads C(vllm:num_requests_running) from an instance's /metrics text.
options:
  _input:
    description:
      - The planned instances by host (C(vllm_plan_instances)'s output) for C(vllm_gateway_servers); hostvars for
        C(vllm_gateway_deployed), C(vllm_gateway_clients), C(vllm_gateway_backend_key) and
        C(vllm_gateway_backend_key_errors); a host's name for C(vllm_gateway_server_name).
      - The API keys for C(vllm_gateway_tenants); a gateway's settings for C(vllm_gateway_errors); the runtime API's
        C(show stat) CSV for C(vllm_gateway_sessions); an instance's /metrics text for C(vllm_gateway_requests_running).
    type: raw
    required: true
author:
  - vllm-fleet maintainers
"""

EXAMPLES = r"""
- name: One backend server per planned instance
  ansible.builtin.debug:
    msg: "{{ hostvars | vllm_plan_instances(groups['vllm_nodes']) | vllm_gateway_servers }}"

- name: The backend hosts share one vllm_api_key (the messages never show a key)
  ansible.builtin.assert:
    that: (hostvars | vllm_gateway_backend_key_errors(inventory_hostname, groups['vllm_nodes'])) | length == 0
"""

RETURN = r"""
_value:
  description:
    - C(vllm_gateway_servers), HAProxy's backend servers (name, address, port); C(vllm_gateway_deployed), what each
      host runs now; C(vllm_gateway_server_name), a server's name (host_instance).
    - C(vllm_gateway_tenants), the tenants with their keys' SHA-256; C(vllm_gateway_errors) and
      C(vllm_gateway_backend_key_errors), messages; C(vllm_gateway_backend_key), the backends' key (a secret);
      C(vllm_gateway_clients), networks by family (ipv4, ipv6).
    - C(vllm_gateway_sessions) and C(vllm_gateway_requests_running), numbers.
  type: raw
"""

import os
import sys
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

# The library of this checkout, beside the plugin (never another installed copy): every filter plugin loads it so.
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
from vllm_fleet import gateway, metrics


def vllm_gateway_servers(instances_by_host, deployed_by_host=None):
    for what, value in (
        ("vllm_plan_instances' {host: [instances]}", instances_by_host),
        ("vllm_gateway_deployed's {host: [instances]}", deployed_by_host or {}),
    ):
        if not isinstance(value, Mapping):
            raise AnsibleFilterError("vllm_gateway_servers: expected %s, got %s" % (what, type(value).__name__))
    return gateway.servers(instances_by_host, deployed_by_host)


def vllm_gateway_deployed(hostvars, hosts):
    """{host: the instances it runs now} for the hosts whose vllm_deployed_instances site.yml read in this run."""
    out = {}
    for host in hosts:
        try:
            variables = hostvars[host]
        except KeyError:
            continue
        deployed = variables.get("vllm_deployed_instances") if hasattr(variables, "get") else None
        if isinstance(deployed, (list, tuple)):
            out[str(host)] = [dict(i) for i in deployed]
    return out


def vllm_gateway_server_name(host, instance):
    return gateway.server_name(str(host), str(instance))


def vllm_gateway_tenants(api_keys):
    if not isinstance(api_keys, list) or not all(
        isinstance(e, Mapping) and "key" in e and "tenant" in e for e in api_keys
    ):
        raise AnsibleFilterError(
            "vllm_gateway_tenants: vllm_gateway_api_keys must be a list of {tenant, key, "
            "requests_per_minute} (values not shown)"
        )
    return gateway.tenants(api_keys)


def vllm_gateway_errors(values, host):
    return gateway.check(str(host), values)


def _backend_keys(what, hostvars, host, backends):
    """{backend host: its vllm_api_key, None where it sets none} from hostvars."""
    if (
        not isinstance(hostvars, Mapping)
        or isinstance(backends, (str, bytes, Mapping))
        or not hasattr(backends, "__iter__")
    ):
        raise AnsibleFilterError(
            f"{what} expects hostvars | {what}(gateway host, backend host names), got "
            f"{type(hostvars).__name__} and {type(backends).__name__}"
        )
    keys = {}
    for name in backends:
        try:
            variables = hostvars[name]
        except KeyError:
            raise AnsibleFilterError(f"{what}: {host}'s backend host {name!r} is not in the inventory") from None
        keys[str(name)] = variables.get("vllm_api_key") if hasattr(variables, "get") else None
    return keys


def vllm_gateway_backend_key(hostvars, host, backends):
    """The one vllm_api_key the backend hosts share ('' for none); an error naming two that differ, never a key."""
    key, errors = gateway.backend_api_key(
        str(host), _backend_keys("vllm_gateway_backend_key", hostvars, host, backends)
    )
    if errors:
        raise AnsibleFilterError(" | ".join(errors))
    return key


def vllm_gateway_backend_key_errors(hostvars, host, backends):
    return gateway.backend_api_key(
        str(host), _backend_keys("vllm_gateway_backend_key_errors", hostvars, host, backends)
    )[1]


def vllm_gateway_clients(hostvars, gateways, allowed, host, monitoring=()):
    if not isinstance(hostvars, Mapping) or any(
        isinstance(names, (str, bytes)) or not hasattr(names, "__iter__") for names in (gateways, monitoring)
    ):
        raise AnsibleFilterError(
            "vllm_gateway_clients expects hostvars | vllm_gateway_clients(gateway names, "
            "vllm_allowed_clients, host, monitoring host names), got %s and %s"
            % (type(hostvars).__name__, type(gateways).__name__)
        )
    try:
        return gateway.clients(
            {name: hostvars[name] for name in gateways},
            allowed,
            str(host),
            {name: hostvars[name] for name in monitoring},
        )
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def vllm_gateway_sessions(show_stat, backend, server):
    return gateway.server_sessions(str(show_stat), str(backend), str(server))


def vllm_gateway_requests_running(metrics_text):
    try:
        return gateway.requests_running(str(metrics_text))
    except metrics.MetricsParseError as exc:
        raise AnsibleFilterError(f"vllm_gateway_requests_running: {exc}") from exc


class FilterModule:
    """The vLLM fleet's gateway filters."""

    def filters(self):
        return {
            "vllm_gateway_servers": vllm_gateway_servers,
            "vllm_gateway_deployed": vllm_gateway_deployed,
            "vllm_gateway_server_name": vllm_gateway_server_name,
            "vllm_gateway_tenants": vllm_gateway_tenants,
            "vllm_gateway_errors": vllm_gateway_errors,
            "vllm_gateway_backend_key": vllm_gateway_backend_key,
            "vllm_gateway_backend_key_errors": vllm_gateway_backend_key_errors,
            "vllm_gateway_clients": vllm_gateway_clients,
            "vllm_gateway_sessions": vllm_gateway_sessions,
            "vllm_gateway_requests_running": vllm_gateway_requests_running,
        }
