"""The fleet's front door (roles/vllm_gateway): its settings' checks, its tenants, its backend servers and the
numbers the rollout's drain waits on.

The backend servers are the plan's instances (planner.instances), so the gateway and the hosts agree on every
name, address and port. A key is only ever handled as its SHA-256: no message, map or diff shows one.
"""
from __future__ import annotations

import csv
import hashlib
import io
import ipaddress
import re
from typing import Any, Iterable, Mapping

from . import metrics

TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# HAProxy server names: letters, digits and - _ . : only.
_SERVER_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")
MIN_KEY_LENGTH = 24
PEM = re.compile(r"-----BEGIN ([A-Z ]+)-----\s+[A-Za-z0-9+/=\s]+-----END \1-----")


def server_name(host: str, instance: str) -> str:
    """The backend server of a host's instance, as HAProxy's runtime API and its statistics name it."""
    return _SERVER_UNSAFE.sub("-", f"{host}_{instance}")


def servers(instances_by_host: Mapping[str, Iterable[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """One backend server per planned instance, sorted by host then instance."""
    result = []
    for host in sorted(instances_by_host):
        for instance in instances_by_host[host]:
            result.append({"name": server_name(host, instance["name"]), "host": host,
                           "instance": instance["name"], "address": instance["address"], "port": instance["port"]})
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
    allow = values.get("vllm_gateway_metrics_allow") or []
    for net in allow if isinstance(allow, list) else [allow]:
        try:
            ipaddress.ip_network(str(net), strict=False)
        except ValueError:
            errors.append(f"{host}: vllm_gateway_metrics_allow has {net!r}, not an address or network; fix: the "
                          "monitoring hosts' addresses, e.g. 10.0.0.5 or 10.0.0.0/24")
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
