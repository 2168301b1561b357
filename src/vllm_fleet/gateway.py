"""The fleet's front door (roles/vllm_gateway): its settings' checks, its tenants, its backend servers and the
numbers the rollout's drain waits on.

The backend servers are the plan's instances (planner.instances), so the gateway and the hosts agree on every
name, address and port. A key is only ever handled as its SHA-256: no message, map or diff shows one.

Behind the gateways, each vLLM host admits on its port only itself, the gateways and its vllm_allowed_clients (the
monitoring hosts): ``clients`` gives those addresses, by family, for the host's nftables rules (roles/vllm).
"""
from __future__ import annotations

import csv
import hashlib
import io
import ipaddress
import re
from typing import Any, Iterable, Mapping

from . import inputs, metrics

TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# HAProxy server names: letters, digits and - _ . : only.
_SERVER_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")
MIN_KEY_LENGTH = 24
PEM = re.compile(r"-----BEGIN ([A-Z ]+)-----\s+[A-Za-z0-9+/=\s]+-----END \1-----")


def server_name(host: str, instance: str) -> str:
    """The backend server of a host's instance, as HAProxy's runtime API and its statistics name it."""
    return _SERVER_UNSAFE.sub("-", f"{host}_{instance}")


def servers(instances_by_host: Mapping[str, Iterable[Mapping[str, Any]]],
            deployed_by_host: Mapping[str, Iterable[Mapping[str, Any]]] | None = None) -> list[dict[str, Any]]:
    """One backend server per planned instance, sorted by host then instance; and one per instance a host runs now
    that its plan no longer has (``retiring``: it serves until the rollout drains and removes it)."""
    result = []
    deployed_by_host = deployed_by_host or {}
    for host in sorted(set(instances_by_host) | set(deployed_by_host)):
        planned = list(instances_by_host.get(host) or [])
        names = {instance["name"] for instance in planned}
        retiring = [dict(i, retiring=True) for i in deployed_by_host.get(host) or [] if i["name"] not in names]
        for instance in sorted(planned + retiring, key=lambda i: i["name"]):
            result.append({"name": server_name(host, instance["name"]), "host": host, "instance": instance["name"],
                           "address": instance["address"], "port": instance["port"],
                           "retiring": bool(instance.get("retiring"))})
    return result


def tenants(api_keys: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The tenants as the gateway keeps them: name, the key's SHA-256 (hex) and the requests per minute."""
    return [{"tenant": str(entry["tenant"]),
             "key_sha256": hashlib.sha256(str(entry["key"]).encode()).hexdigest(),
             "requests_per_minute": int(entry.get("requests_per_minute") or 0)} for entry in api_keys]


def _pem(host: str, name: str, value: Any, kinds: tuple[str, ...], fix: str) -> list[str]:
    text = value if isinstance(value, str) else ""
    found = [m.group(1) for m in PEM.finditer(text)]
    if not found or found[0] not in kinds:
        shown = "is empty" if not text.strip() else "is not a PEM " + " or ".join(kinds)
        return [f"{host}: {name} {shown}; fix: {fix}"]
    return []


def check(host: str, values: Mapping[str, Any]) -> list[str]:
    """The errors of a gateway's settings, each naming the host, the setting and the fix (never a key)."""
    errors: list[str] = []
    errors += _pem(host, "vllm_gateway_tls_certificate", values.get("vllm_gateway_tls_certificate"),
                   ("CERTIFICATE",), "the gateway's certificate chain in PEM, leaf first")
    errors += _pem(host, "vllm_gateway_tls_key", values.get("vllm_gateway_tls_key"),
                   ("PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"),
                   "the certificate's private key in PEM, from Ansible Vault (value not shown)")
    keys = values.get("vllm_gateway_api_keys")
    if not isinstance(keys, list) or not keys:
        errors.append(f"{host}: vllm_gateway_api_keys is empty: the gateway would refuse every request; fix: one "
                      "entry per tenant, {tenant: NAME, key: from Vault, requests_per_minute: 0 or a limit}")
        keys = []
    seen_tenants: set[str] = set()
    seen_keys: set[str] = set()
    for index, entry in enumerate(keys):
        where = f"{host}: vllm_gateway_api_keys[{index}]"
        if not isinstance(entry, Mapping):
            errors.append(f"{where} is not a mapping; fix: {{tenant: NAME, key: from Vault, requests_per_minute: N}}")
            continue
        tenant = entry.get("tenant")
        if not (isinstance(tenant, str) and TENANT.fullmatch(tenant)):
            errors.append(f"{where}.tenant={tenant!r} must be 1 to 64 letters, digits, _ . -; fix: for example team-a")
        elif tenant in seen_tenants:
            errors.append(f"{where}.tenant={tenant!r} is given twice; fix: one entry per tenant")
        else:
            seen_tenants.add(tenant)
        key = entry.get("key")
        if not isinstance(key, str) or len(key) < MIN_KEY_LENGTH or any(c.isspace() for c in key):
            errors.append(f"{where}.key (value not shown) must be at least {MIN_KEY_LENGTH} characters without spaces; "
                          "fix: a random key from Ansible Vault, e.g. `openssl rand -hex 24 | ansible-vault "
                          "encrypt_string`")
        elif key in seen_keys:
            errors.append(f"{where}.key (value not shown) is also another tenant's key; fix: one key per tenant")
        else:
            seen_keys.add(key)
        rate = entry.get("requests_per_minute", 0)
        if isinstance(rate, bool) or not isinstance(rate, int) or rate < 0:
            errors.append(f"{where}.requests_per_minute={rate!r} must be a whole number, 0 for no limit; fix: e.g. 600")
        unknown = sorted(set(entry) - {"tenant", "key", "requests_per_minute"})
        if unknown:
            errors.append(f"{where} has unknown keys {unknown}; fix: only tenant, key and requests_per_minute")
    for name in ("vllm_gateway_port", "vllm_gateway_metrics_port"):
        port = values.get(name)
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535):
            errors.append(f"{host}: {name}={port!r} must be a port number from 1 to 65535; fix: e.g. 443 and 8405")
    for name in ("vllm_gateway_bind_address", "vllm_gateway_metrics_address"):
        address = values.get(name)
        if address is None:
            continue
        try:
            ipaddress.ip_address(str(address))
        except ValueError:
            errors.append(f"{host}: {name}={address!r} is not an IP address; fix: the gateway's address, or 0.0.0.0")
    try:
        inputs.networks(host, "vllm_gateway_metrics_allow", values.get("vllm_gateway_metrics_allow") or [])
    except ValueError as exc:
        errors.append(str(exc))
    source = source_address(values.get("vllm_gateway_source_address"), values.get("ansible_host"), host)
    try:
        ipaddress.ip_address(source)
    except ValueError:
        errors.append(f"{host}: vllm_gateway_source_address={source!r} (by default its ansible_host, else its name) is "
                      "not an IP address: the vLLM hosts admit the gateways by address (vllm_firewall); fix: set "
                      "vllm_gateway_source_address to the address the gateway's connections to vLLM come from, or "
                      "vllm_firewall: false on the vLLM hosts")
    stop = values.get("vllm_gateway_drain_timeout")
    if stop is not None and (isinstance(stop, bool) or not isinstance(stop, int) or stop < 1):
        errors.append(f"{host}: vllm_gateway_drain_timeout={stop!r} must be a positive number of seconds; fix: e.g. 600")
    return errors


def server_sessions(show_stat: str, backend: str, server: str) -> int | None:
    """Current sessions of `server` in `backend` from the runtime API's `show stat` (CSV); None if absent."""
    text = show_stat.lstrip("# ")
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("pxname") == backend and row.get("svname") == server:
            return int(row.get("scur") or 0)
    return None


def requests_running(metrics_text: str) -> float:
    """Requests an instance is still working on (vllm:num_requests_running, summed over its engines)."""
    return metrics.parse(metrics_text).gauges.get("vllm:num_requests_running", {}).get("sum", 0.0)


def source_address(source: Any, ansible_host: Any, name: str) -> str:
    """The address a gateway's connections to vLLM come from: vllm_gateway_source_address, else its ansible_host,
    else its inventory name."""
    return str(source or ansible_host or name)


def clients(gateways: Mapping[str, Mapping[str, Any]], allowed: Any, host: str,
            monitoring: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, list[str]]:
    """Who may reach a vLLM host's port besides the host itself: the gateways ({name: its settings}, each by its
    source address), the monitoring hosts (likewise, by their ansible_host) and ``allowed`` (vllm_allowed_clients:
    addresses or networks), as {"ipv4": [...], "ipv6": [...]} of normalised networks, sorted and unique. ValueError
    names the host, the setting, the value and the fix."""
    found = inputs.networks(host, "vllm_allowed_clients", allowed)
    for name, values in sorted(gateways.items()):
        source = source_address(values.get("vllm_gateway_source_address"), values.get("ansible_host"), name)
        found += inputs.networks(host, f"the gateway {name}'s vllm_gateway_source_address", [source])
    for name, values in sorted((monitoring or {}).items()):
        source = source_address(None, values.get("ansible_host"), name)
        found += inputs.networks(host, f"the monitoring host {name}'s ansible_host", [source])
    return {family: [str(n) for n in sorted({n for n in found if n.version == version})]
            for family, version in (("ipv4", 4), ("ipv6", 6))}
