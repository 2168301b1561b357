# Thin Ansible filters over vllm_fleet.gateway: what the vllm_gateway role and vllm_rollout's drain use.
from __future__ import annotations

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


def _servers_list(what, servers):
    if isinstance(servers, (str, bytes, Mapping)) or not hasattr(servers, "__iter__"):
        raise AnsibleFilterError(
            f"{what}: expected vllm_gateway_servers' list of servers, got {type(servers).__name__}"
        )
    return [dict(s) for s in servers]


def vllm_gateway_routes(servers, api_keys, aliases=None):
    if not isinstance(api_keys, list) or not all(isinstance(e, Mapping) and "tenant" in e for e in api_keys):
        raise AnsibleFilterError(
            "vllm_gateway_routes: vllm_gateway_api_keys must be a list of {tenant, key, ...} (values not shown)"
        )
    if aliases not in (None, "") and not isinstance(aliases, Mapping):
        raise AnsibleFilterError(
            f"vllm_gateway_routes: vllm_model_aliases must be a mapping, got {type(aliases).__name__}"
        )
    return gateway.routes(_servers_list("vllm_gateway_routes", servers), api_keys, aliases or {})


def vllm_gateway_route_errors(servers, host, api_keys, max_body=None, aliases=None):
    return gateway.route_errors(
        str(host), _servers_list("vllm_gateway_route_errors", servers), api_keys, max_body, aliases
    )


def _gateway_vars(what, usage, hostvars, names):
    """{gateway: its variables ({} where hostvars holds none)} for `names`, from hostvars; an error naming the filter
    (`what`, called as `usage`) when the arguments are not hostvars and a list of names, or a gateway is unknown."""
    if not isinstance(hostvars, Mapping) or isinstance(names, (str, bytes, Mapping)) or not hasattr(names, "__iter__"):
        raise AnsibleFilterError(
            f"{what} expects hostvars | {usage}, got {type(hostvars).__name__} and {type(names).__name__}"
        )
    found = {}
    for name in names:
        try:
            variables = hostvars[name]
        except KeyError:
            raise AnsibleFilterError(f"{what}: the gateway {name!r} is not in the inventory") from None
        found[str(name)] = variables if hasattr(variables, "get") else {}
    return found


def vllm_gateway_peers(hostvars, gateways):
    found = _gateway_vars("vllm_gateway_peers", "vllm_gateway_peers(gateway host names)", hostvars, gateways)
    keys = ("vllm_gateway_source_address", "ansible_host")
    return gateway.peers({name: {key: values.get(key) for key in keys} for name, values in found.items()})


def vllm_gateway_peer_name(host):
    return gateway.peer_name(str(host))


def vllm_gateway_backend_name(model):
    return gateway.backend_name(str(model))


def vllm_gateway_deployed(hostvars, hosts):
    """{host: the instances it runs now} for the hosts whose vllm_deployed_instances vllm_rollout read in this run."""
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


# Where a value's data tags cannot be read (an ansible-core before 2.19's data tagging): never taken as from Vault.
_NO_TAGS = "cannot tell whether it came from Vault (ansible-core without data tags)"
_VAULT_HEADER = "$ANSIBLE_VAULT;"


def _encrypted_file(path):
    """Whether a file is encrypted whole by ansible-vault: its first line, and only that, is read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.readline(256).startswith(_VAULT_HEADER)
    except OSError:
        return False


def _vault_source(value):
    """None when `value` came from Ansible Vault, else where it came from, for the message (never the value).

    Read from ansible-core's data tags (2.19): an inline !vault value, and a template that is only a reference to
    one, carry VaultedValue; the unvault lookup's value carries SourceWasEncrypted (the file lookup's does not: it
    strips the text, which drops the tags); a value of a vars file encrypted whole carries only the Origin of that
    file, whose first line is then the Vault header. A value with none of these is not from Vault."""
    if value is None or type(value).__name__ == "EncryptedString":  # not set (vip_errors says so), or still sealed
        return None
    try:
        from ansible._internal._datatag._tags import Origin, SourceWasEncrypted, TrustedAsTemplate, VaultedValue
        from ansible.module_utils._internal._datatag import AnsibleTagHelper

        tags = list(AnsibleTagHelper.tags(value))
    except (ImportError, AttributeError):
        return _NO_TAGS
    if any(isinstance(tag, (VaultedValue, SourceWasEncrypted)) for tag in tags):
        return None
    origin = next((tag for tag in tags if isinstance(tag, Origin)), None)
    if origin is None:
        return "no record of where it came from, and no mark of Ansible Vault"
    if origin.path:
        if _encrypted_file(origin.path):
            return None
        where = os.path.relpath(origin.path) if origin.path.startswith(os.getcwd() + os.sep) else origin.path
        where += f" line {origin.line_num}" if origin.line_num else ""
        if any(isinstance(tag, TrustedAsTemplate) for tag in tags):
            return f"written in plain text in {where}"
        return (
            f"the result of a template in {where} that keeps no mark of Ansible Vault (one that changes a "
            "vaulted value, or a lookup other than unvault)"
        )
    if "'-e'" in str(origin.description):
        return "given on the command line (-e)"
    return f"given in plain text ({origin.description})"


def vllm_gateway_vip_errors(hostvars, host, gateways):
    """The errors of the gateways' shared virtual address for the gateway `host` (vllm_fleet.gateway.vip_errors),
    with where each gateway's vllm_gateway_vrrp_password came from."""
    listed = not isinstance(gateways, (str, bytes, Mapping)) and hasattr(gateways, "__iter__")
    # The gateway checked, always; a value that is no list of names is refused below, with its type.
    names = [*gateways, *([] if host in gateways else [host])] if listed else gateways
    found = _gateway_vars(
        "vllm_gateway_vip_errors",
        "vllm_gateway_vip_errors(gateway host, gateway host names)",
        hostvars,
        names,
    )
    # The password is read only where a gateway shares an address: without one it is never templated.
    if not any(values.get("vllm_gateway_vip") for values in found.values()):
        return []
    sources = {name: _vault_source(values.get("vllm_gateway_vrrp_password")) for name, values in found.items()}
    return gateway.vip_errors(str(host), found, sources)


def vllm_gateway_vrrp_interface(ansible_facts, address):
    """The interface of a gateway's facts that holds `address`."""
    names = ansible_facts.get("interfaces") if isinstance(ansible_facts, Mapping) else None
    if not isinstance(names, (list, tuple)):
        raise AnsibleFilterError(
            "vllm_gateway_vrrp_interface expects ansible_facts with the network facts (ansible_facts['interfaces']: "
            f"gather facts, with the network subset), got {type(ansible_facts).__name__}"
        )
    interfaces = {}
    for name in names:
        facts = ansible_facts.get(name, ansible_facts.get(str(name).replace("-", "_")))
        interfaces[str(name)] = facts if isinstance(facts, Mapping) else {}
    try:
        return gateway.vrrp_interface(interfaces, address)
    except ValueError as exc:
        raise AnsibleFilterError(f"vllm_gateway_vrrp_interface: {exc}") from exc


def vllm_gateway_sessions(show_stat, backend, server):
    return gateway.server_sessions(str(show_stat), str(backend), str(server))


def vllm_gateway_requests_running(metrics_text):
    try:
        return gateway.requests_running(str(metrics_text))
    except metrics.MetricsParseError as exc:
        raise AnsibleFilterError(f"vllm_gateway_requests_running: {exc}") from exc


# Each filter is documented in plugins/filter/<filter>.yml, which ansible-doc -t filter reads.
class FilterModule:
    """The vLLM fleet's gateway filters."""

    def filters(self):
        return {
            "vllm_gateway_servers": vllm_gateway_servers,
            "vllm_gateway_deployed": vllm_gateway_deployed,
            "vllm_gateway_server_name": vllm_gateway_server_name,
            "vllm_gateway_routes": vllm_gateway_routes,
            "vllm_gateway_route_errors": vllm_gateway_route_errors,
            "vllm_gateway_backend_name": vllm_gateway_backend_name,
            "vllm_gateway_peers": vllm_gateway_peers,
            "vllm_gateway_peer_name": vllm_gateway_peer_name,
            "vllm_gateway_tenants": vllm_gateway_tenants,
            "vllm_gateway_errors": vllm_gateway_errors,
            "vllm_gateway_backend_key": vllm_gateway_backend_key,
            "vllm_gateway_backend_key_errors": vllm_gateway_backend_key_errors,
            "vllm_gateway_clients": vllm_gateway_clients,
            "vllm_gateway_vip_errors": vllm_gateway_vip_errors,
            "vllm_gateway_vrrp_interface": vllm_gateway_vrrp_interface,
            "vllm_gateway_sessions": vllm_gateway_sessions,
            "vllm_gateway_requests_running": vllm_gateway_requests_running,
        }
