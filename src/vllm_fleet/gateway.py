"""The fleet's front door (roles/vllm_gateway): its settings' checks, its tenants, its backend servers and the
numbers the rollout's drain waits on.

The backend servers are the plan's instances (planner.instances), so the gateway and the hosts agree on every
name, address and port. A key is only ever handled as its SHA-256: no message, map or diff shows one. The key the
gateway sends vLLM has one home, the backend hosts' own ``vllm_api_key`` (``backend_api_key``).

``check`` refuses at plan time what HAProxy would refuse only on the gateway (``haproxy -c``), or not at all: a
certificate chain, a private key or a pair that does not parse or match (read with ``cryptography``), an expired
certificate, a timeout of 0 (no timeout at all), a string that would add a line or an invisible character to
haproxy.cfg or its maps (``inputs.CONTROL``), a balance algorithm the gateway does not offer.

Behind the gateways, each vLLM host admits on its port only itself, the gateways and its vllm_allowed_clients (the
monitoring hosts): ``clients`` gives those addresses, by family, for the host's nftables rules (roles/vllm).

Two or more gateways may share a virtual address (``vllm_gateway_vip``) through keepalived: VRRPv2 between them,
unicast to each other's own address, with PASS authentication. ``vip_errors`` refuses at plan time what would
split the address between two gateways or leave it with none (a vip, router id or password that differs between
them, two with one priority, a gateway outside the vip's network), what keepalived would cut or refuse (a password
over 8 characters, an advertisement interval that is not whole seconds) and a password that does not come from
Ansible Vault; ``vrrp_interface`` finds, in a gateway's facts, the interface that holds its own address.
"""

from __future__ import annotations

import csv
import datetime
import hashlib
import io
import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from . import inputs, metrics

# cryptography is imported where a certificate or key is read: Ansible's filter plugins load this module in every
# worker process of every task (tests/unit/plugins/test_plugin_imports.py), and cryptography.x509 was 9 % of those
# workers' time in a py-spy of the vllm_verify role's test (2026-12-05).
if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes, PublicKeyTypes

TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# HAProxy server names: letters, digits and - _ . : only.
_SERVER_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")
# The longest served model name the gateway routes by.
MODEL_NAME_LENGTH = 256
# vllm_gateway_max_body_bytes: a request body is read whole, up to this, to find its model (HAProxy's buffer is sized
# to hold it); a larger one gets 413. From 64 KiB (a long chat's prompt) to 64 MiB.
MAX_BODY = (65536, 67108864)
MAX_BODY_DEFAULT = 1048576
MIN_KEY_LENGTH = 24
# An entry of vllm_gateway_api_keys: the tenant, its key (from Vault), its limits (0: none) and the served models it
# may use (left out: every one).
TENANT_KEYS = ("tenant", "key", "requests_per_minute", "max_concurrent", "models")
# One PEM block: its label and its body (headers such as an encrypted PKCS#1 key's Proc-Type included).
PEM = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----(.*?)-----END \1-----", re.DOTALL)
KEY_LABELS = ("PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY")
# What the gateway may balance with (vllm_gateway_balance; meta/argument_specs.yml lists the same): the algorithms
# of HAProxy that need no argument, and prefix. leastconn suits long streamed answers (the open connections are the
# load). prefix sends the requests whose bodies start alike (one system prompt, the first turns of one conversation)
# to one instance, where vLLM's prefix cache holds them: HAProxy's consistent hash of the body's first
# vllm_gateway_prefix_bytes bytes, bounded by its load (hash-balance-factor: no instance takes more than
# vllm_gateway_prefix_load_factor percent of the average); an instance drained or down leaves the ring, and its
# requests move to the next instance on it until it is back.
BALANCE = ("leastconn", "roundrobin", "static-rr", "first", "source", "random", "prefix")
# The body bytes prefix hashes: up to HAProxy's default buffer (16 KiB, tune.bufsize) less its headers' room.
PREFIX_BYTES = (16, 8192)
# hash-balance-factor: above 100 (HAProxy's rule: 100 or less would refuse every server at once).
PREFIX_LOAD_FACTOR = (101, 1000)
# Whole seconds of at least 1 (haproxy.cfg writes each as N followed by s): the default, as the fix, and what 0
# would do.
TIMEOUTS = {
    "vllm_gateway_timeout_connect": (5, "no timeout at all: a connection to a dead instance would wait forever"),
    "vllm_gateway_timeout_server": (900, "no timeout at all: a stuck instance would hold its clients forever"),
    "vllm_gateway_timeout_client": (900, "no timeout at all: an idle client would hold its connection forever"),
    "vllm_gateway_timeout_http_request": (
        30,
        "no timeout at all: a slow client could hold a connection by sending its headers a byte at a time",
    ),
    "vllm_gateway_timeout_queue": (60, "no timeout at all: a queued request would wait forever"),
    "vllm_gateway_hard_stop_after": (900, "an old worker's streams cut at once on every reload"),
    "vllm_gateway_drain_timeout": (600, "a drain that does not wait for the instance's requests to end"),
}
# Positive whole numbers, with the default as the fix.
COUNTS = {
    "vllm_gateway_health_interval_ms": 2000,
    "vllm_gateway_health_fall": 2,
    "vllm_gateway_health_rise": 2,
    "vllm_gateway_maxconn": 4096,
}
# The strings that reach haproxy.cfg (or name what does); each must hold no control or format character.
STRINGS = (
    "vllm_gateway_bind_address",
    "vllm_gateway_metrics_address",
    "vllm_gateway_backend_group",
    "vllm_gateway_balance",
    "vllm_gateway_source_address",
)
# keepalived's VRRP: a gateway's priority (255 is the address owner's, which a shared address has none of), the
# virtual router id (one byte, 0 reserved), the version (3 by default: adverts in hundredths of a second and no
# authentication, VRRP admitted only from the peers by the gateways' own rules; 2: whole seconds and the PASS password,
# which travels in clear text), the advertisement interval (v2: whole seconds, one byte; v3: hundredths, 12 bits) and
# v2's password (keepalived reads only its first 8 characters: a longer one would be cut silently). The defaults are
# the role's.
VRRP_PRIORITY = (1, 254)
VRRP_ROUTER_ID = (1, 255)
VRRP_ROUTER_ID_DEFAULT = 51
VRRP_VERSIONS = (2, 3)
VRRP_VERSION_DEFAULT = 3
VRRP_ADVERT = {2: (1, 255), 3: (0.01, 40.95)}
VRRP_ADVERT_DEFAULT = 0.5
VRRP_PASSWORD_LENGTH = 8
VRRP_PASSWORD = re.compile(r"[!-~]{1,%d}" % VRRP_PASSWORD_LENGTH)  # printable ASCII, no space
# A Linux interface name: 1 to 15 characters (IFNAMSIZ less its NUL), here letters, digits and _ . : - only.
INTERFACE = re.compile(r"[A-Za-z0-9_.:-]{1,15}")
VIP = re.compile(r"[0-9A-Fa-f.:]+/[0-9]{1,3}")
VRRP_PASSWORD_FIX = (
    "fix: one vllm_gateway_vrrp_password of 1 to 8 printable ASCII characters without spaces for every gateway, "
    "in the group_vars of vllm_gateways, from Ansible Vault (`ansible-vault encrypt_string --name "
    "vllm_gateway_vrrp_password`; an encrypted file read with the unvault lookup must hold no trailing newline)"
)
VAULT_FIX = (
    "fix: the one vllm_api_key of the group vllm_nodes, in its group_vars, from Ansible Vault (none in a "
    "host's own vars)"
)


def server_name(host: str, instance: str) -> str:
    """The backend server of a host's instance, as HAProxy's runtime API and its statistics name it."""
    return _SERVER_UNSAFE.sub("-", f"{host}_{instance}")


def servers(
    instances_by_host: Mapping[str, Iterable[Mapping[str, Any]]],
    deployed_by_host: Mapping[str, Iterable[Mapping[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """One backend server per planned instance, sorted by host then instance; and one per instance a host runs now
    that its plan no longer has (``retiring``: it serves until the rollout drains and removes it)."""
    result = []
    deployed_by_host = deployed_by_host or {}
    for host in sorted(set(instances_by_host) | set(deployed_by_host)):
        planned = list(instances_by_host.get(host) or [])
        names = {instance["name"] for instance in planned}
        retiring: list[Mapping[str, Any]] = [
            dict(i, retiring=True) for i in deployed_by_host.get(host) or [] if i["name"] not in names
        ]
        # The model a retiring instance served is the one its host serves (a host serves one model); an instance
        # whose record names none and whose host plans none has no backend to be in.
        host_model = next((str(i["served_model_name"]) for i in planned if i.get("served_model_name")), "")
        host_weights = next((str(i.get("weights") or "") for i in planned if i.get("served_model_name")), "")
        for instance in sorted(planned + retiring, key=lambda i: i["name"]):
            model = str(instance.get("served_model_name") or host_model)
            result.append(
                {
                    "name": server_name(host, instance["name"]),
                    "host": host,
                    "instance": instance["name"],
                    "address": instance["address"],
                    "port": instance["port"],
                    "retiring": bool(instance.get("retiring")),
                    "model": model,
                    "weights": str(instance.get("weights") or (host_weights if model == host_model else "")),
                    "backend": backend_name(model) if model else "",
                    # The LoRA adapters it loads beside the model (its plan's; none for one the plan drops).
                    "adapters": [] if instance.get("retiring") else [str(a) for a in instance.get("adapters") or []],
                }
            )
    return result


def peer_name(host: str) -> str:
    """A gateway's name among HAProxy's peers (its inventory name, made safe as a server's)."""
    return _SERVER_UNSAFE.sub("-", host)


def peers(gateways: Mapping[str, Mapping[str, Any]]) -> list[dict[str, str]]:
    """The gateways that share the tenants' request rates, sorted by name: each one's peer name and own address (its
    vllm_gateway_source_address, else its ansible_host, else its name), as keepalived's VRRP reaches it."""
    return [
        {
            "name": peer_name(name),
            "address": str(values.get("vllm_gateway_source_address") or values.get("ansible_host") or name),
        }
        for name, values in sorted(gateways.items())
    ]


def backend_name(model: str) -> str:
    """The HAProxy backend of a served model: ``model-`` and its name where every character is one HAProxy allows
    in a proxy's name (letters, digits, - _ . :), else the name with each other character made ``-`` and the first
    10 hex digits of its SHA-256 after it, so that two names (``org/m`` and ``org-m``) never share a backend."""
    safe = _SERVER_UNSAFE.sub("-", model)
    if safe == model:
        return f"model-{model}"
    return f"model-{safe}-{hashlib.sha256(model.encode()).hexdigest()[:10]}"


def _digest(text: str) -> str:
    """A map key of the gateway for a name that may hold spaces: its SHA-256, hex (haproxy.cfg: digest(sha256),hex)."""
    return hashlib.sha256(text.encode()).hexdigest()


def routes(
    servers_list: Iterable[Mapping[str, Any]],
    api_keys: Iterable[Mapping[str, Any]],
    aliases: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """What the gateway routes by, from its servers (``servers``) and its tenants (vllm_gateway_api_keys, each with
    an optional ``models`` allow-list; none: every served model):

    - ``backends``: one per served model, sorted by name: {name, model, servers}; and one per LoRA adapter (a
      server's ``adapters``): {name, model: the adapter's name, parent: its model, servers: the instances that load
      it, each with ``tracks``: its server in the model's backend};
    - ``models``: {served name, adapter or alias: backend} (the map a request's ``model`` is looked up in): an alias
      (``aliases``, vllm_model_aliases: {alias: served name}) goes to its model's backend;
    - ``allowed``: the sorted ``tenant/name`` keys a tenant may ask for: the names in its list (an adapter only where
      it is named: a tenant allowed a model is not thereby allowed its adapters), and each alias of a model in it;
      a tenant without a list may use every model and adapter;
    - ``lists``: {tenant: the JSON of ``GET /v1/models`` for that tenant, in the OpenAI shape, on one line};
    - ``maps``: the lines of the gateway's maps (``models``, ``allowed``, ``lists``, ``concurrency``: each tenant's
      cap on requests in flight, 0 for none).

    The errors (an unknown model in an allow-list, a tenant left with none) are ``route_errors``'s; here an unknown
    name is left out."""
    backends: dict[str, dict[str, Any]] = {}
    for server in servers_list:
        if not server.get("backend"):
            continue
        entry = backends.setdefault(
            server["backend"], {"name": server["backend"], "model": server["model"], "servers": []}
        )
        entry["servers"].append(dict(server))
    # A LoRA adapter's backend holds the instances that load it, each tracking its server in the model's backend:
    # drained, in maintenance or down there, it is so here too (a rollout drains each instance once, by its model).
    lora: dict[str, dict[str, Any]] = {}
    for server in servers_list:
        for adapter in server.get("adapters") or []:
            if not server.get("backend") or adapter in {e["model"] for e in backends.values()}:
                continue  # a name clash the plan refuses (lora.name_errors, route_errors)
            entry = lora.setdefault(
                adapter,
                {"name": backend_name(adapter), "model": adapter, "parent": server["model"], "servers": []},
            )
            entry["servers"].append(dict(server, tracks=f"{server['backend']}/{server['name']}"))
    parents = {name: entry["parent"] for name, entry in lora.items()}
    backends.update({entry["name"]: entry for entry in lora.values()})
    served = {entry["model"]: name for name, entry in sorted(backends.items())}
    pointing = {
        str(alias): str(target)
        for alias, target in (aliases or {}).items()
        if target in served and alias not in served and target not in parents
    }
    models = {**served, **{alias: served[target] for alias, target in sorted(pointing.items())}}
    allowed: list[str] = []
    lists: dict[str, str] = {}
    for tenant_entry in api_keys:
        tenant = str(tenant_entry["tenant"])
        wanted = tenant_entry.get("models")
        if wanted in (None, ""):
            names = sorted(models)
        else:
            chosen = {str(m) for m in wanted if str(m) in models}
            names = sorted(chosen | {alias for alias, target in pointing.items() if target in chosen})
        allowed += [f"{tenant}/{name}" for name in names]
        lists[tenant] = json.dumps(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "vllm-fleet",
                        "root": pointing.get(name, name),
                        # An adapter's card names its model, as vLLM's own /v1/models does.
                        **({"parent": parents[name]} if name in parents else {}),
                    }
                    for name in names
                ],
            },
            separators=(",", ":"),
        )
    concurrency = {str(e["tenant"]): int(e.get("max_concurrent") or 0) for e in api_keys}
    return {
        "backends": [backends[name] for name in sorted(backends)],
        "models": models,
        "allowed": sorted(allowed),
        "lists": lists,
        # The gateway's maps, line by line. A map's key ends at its first space and a served name may hold spaces, so
        # the model maps are keyed by the SHA-256 (hex) of the name, or of "tenant/name", as haproxy.cfg looks them up,
        # each after a comment that names it; the rest of a line is the value.
        "maps": {
            "models": [
                line for name, backend in models.items() for line in (f"# {name}", f"{_digest(name)} {backend}")
            ],
            "allowed": [line for key in sorted(allowed) for line in (f"# {key}", f"{_digest(key)} 1")],
            "lists": [f"{tenant} {text}" for tenant, text in lists.items()],
            "concurrency": [f"{tenant} {cap}" for tenant, cap in concurrency.items()],
        },
    }


def route_errors(
    host: str,
    servers_list: Iterable[Mapping[str, Any]],
    api_keys: Any,
    max_body: Any = None,
    aliases: Any = None,
) -> list[str]:
    """The errors of what the gateway `host` routes by, each naming the host, the setting, the value and the fix:
    one served name given to two different models (weights); a served name the gateway cannot route by (a control
    or format character, or longer than 256); an allow-list (vllm_gateway_api_keys[N].models) that is not a list of
    names, names a model no backend host serves, or leaves its tenant with none; a body limit out of range."""
    errors: list[str] = []
    by_model: dict[str, dict[str, list[str]]] = {}
    for server in servers_list:
        if server.get("model") and not server.get("retiring"):
            held = str(server.get("weights") or "")
            by_model.setdefault(str(server["model"]), {}).setdefault(held, []).append(str(server["host"]))
    for model, weights in sorted(by_model.items()):
        if len(weights) > 1:
            shown = "; ".join(
                f"{w or 'unknown weights'} on {', '.join(sorted(set(h)))}" for w, h in sorted(weights.items())
            )
            errors.append(
                f"{host}: the served name {model!r} is given to {len(weights)} different models ({shown}): a request "
                "for it would get either; fix: give each model its own served_model_name in its hosts' profile "
                "(vllm_profile: {served_model_name: NAME}), the same on every host that serves the same weights"
            )
        if inputs.CONTROL.search(model) or len(model) > MODEL_NAME_LENGTH:
            on = ", ".join(sorted({h for hs in weights.values() for h in hs}))
            errors.append(
                f"{host}: the served name {inputs.short(model)} (on {on}) holds a control or format character, or is "
                f"longer than {MODEL_NAME_LENGTH}: the gateway routes by it; fix: a served_model_name of printable "
                f"characters, {MODEL_NAME_LENGTH} at most"
            )
    served = set(by_model)
    known = set(served)
    # LoRA adapters (each host's vllm_lora_adapters, on its instances): one name, one model's weights (served under
    # one name or several), and no name of a model.
    adapters: dict[str, dict[str, set[str]]] = {}
    for server in servers_list:
        for adapter in server.get("adapters") or []:
            held = str(server.get("weights") or server.get("model"))
            adapters.setdefault(str(adapter), {}).setdefault(held, set()).add(str(server["host"]))
    for adapter, models in sorted(adapters.items()):
        on = ", ".join(sorted({h for hs in models.values() for h in hs}))
        if adapter in served:
            errors.append(
                f"{host}: the adapter {adapter!r} (vllm_lora_adapters on {on}) has the name of a served model: a "
                "request for it could mean either; fix: another name for the adapter"
            )
        elif len(models) > 1:
            errors.append(
                f"{host}: the adapter {adapter!r} is served beside {len(models)} different models "
                f"({'; '.join(f'{m} on {chr(44).join(sorted(h))}' for m, h in sorted(models.items()))}): an adapter "
                "is trained for one model; fix: give each its own name"
            )
        else:
            known.add(adapter)
    if isinstance(aliases, Mapping):
        for alias in sorted(set(map(str, aliases)) & set(adapters)):
            errors.append(
                f"{host}: vllm_model_aliases[{inputs.short(alias)}] is also an adapter's name (vllm_lora_adapters): "
                "a request for it could mean either; fix: another alias, or another name for the adapter"
            )
    for alias, target in (aliases or {}).items() if isinstance(aliases, Mapping) else []:
        if alias in served:
            errors.append(
                f"{host}: vllm_model_aliases[{inputs.short(alias)}] is also a served model's name: a request for it "
                "could mean either; fix: another alias, or no alias for a name already served"
            )
        elif target not in served:
            errors.append(
                f"{host}: vllm_model_aliases[{inputs.short(alias)}]={inputs.short(target)} points at a model no "
                f"backend host serves (served: {', '.join(sorted(served)) or 'none'}); fix: a served name of the list"
            )
        else:
            known.add(str(alias))
    for index, entry in enumerate(api_keys if isinstance(api_keys, list) else []):
        if not isinstance(entry, Mapping) or "models" not in entry or entry.get("models") is None:
            continue
        where = f"{host}: vllm_gateway_api_keys[{index}].models (tenant {inputs.short(entry.get('tenant'))})"
        wanted = entry.get("models")
        if isinstance(wanted, (str, bytes, Mapping)) or not isinstance(wanted, Iterable):
            errors.append(
                f"{where}={inputs.short(wanted)} is not a list of served model names; fix: a list, e.g. "
                f"[{', '.join(sorted(served)[:2]) or 'NAME'}], or leave it out for every model"
            )
            continue
        names = [str(m) for m in wanted]
        unknown = [n for n in names if n not in known]
        if unknown:
            errors.append(
                f"{where} names {', '.join(repr(n) for n in unknown)}, which no backend host serves and no alias "
                f"names (served: {', '.join(sorted(served)) or 'none'}); fix: a served name of the list, or serve "
                "that model"
            )
        elif not names:
            errors.append(
                f"{where} is empty: the tenant could use no model and every request of its key would be refused; "
                "fix: name the models it may use, leave models out for every model, or remove the tenant"
            )
    if max_body is not None:
        number = inputs.whole(max_body)
        if number is None or not MAX_BODY[0] <= number <= MAX_BODY[1]:
            errors.append(
                f"{host}: vllm_gateway_max_body_bytes={inputs.short(max_body)} must be a whole number of bytes from "
                f"{MAX_BODY[0]} to {MAX_BODY[1]} (the largest request the gateway reads whole to find its model; "
                f"each request in flight holds a buffer of about that size); fix: e.g. {MAX_BODY_DEFAULT}"
            )
    return errors


def tenants(api_keys: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The tenants as the gateway keeps them: name, the key's SHA-256 (hex), the requests per minute and the requests
    in flight at once it may have (0: no limit)."""
    return [
        {
            "tenant": str(entry["tenant"]),
            "key_sha256": hashlib.sha256(str(entry["key"]).encode()).hexdigest(),
            "requests_per_minute": int(entry.get("requests_per_minute") or 0),
            "max_concurrent": int(entry.get("max_concurrent") or 0),
        }
        for entry in api_keys
    ]


def _text(value: Any) -> str | None:
    """A string setting as plain text (a Vault value as its plaintext); None for anything else."""
    if isinstance(value, str):
        return str(value)
    if type(value).__name__ == "EncryptedString":  # ansible-core's !vault value: a str in all but its type
        return str(value)
    return None


def _control(host: str, name: str, value: Any, secret: bool = False) -> list[str]:
    """A control or format character (a newline, U+2028, a zero-width space...) in a string that reaches haproxy.cfg
    or its maps: a newline would add a line of its own, an invisible character a name no one can type."""
    text = _text(value)
    if text is None or not inputs.CONTROL.search(text):
        return []
    shown = " (value not shown)" if secret else f"={inputs.short(text)}"
    return [
        f"{host}: {name}{shown} holds a control or format character (a line break, an invisible character); "
        "fix: remove it" + (" and encrypt the value again with ansible-vault" if secret else "")
    ]


def _certificates(host: str, value: Any) -> tuple[list[x509.Certificate], list[str]]:
    """The chain's certificates, leaf first, or the errors of vllm_gateway_tls_certificate."""
    name, fix = "vllm_gateway_tls_certificate", "fix: the gateway's certificate chain in PEM, leaf first"
    text = _text(value) or ""
    if not text.strip():
        return [], [f"{host}: {name} is empty; {fix}"]
    blocks = list(PEM.finditer(text))
    if not blocks:
        return [], [f"{host}: {name} is not a PEM CERTIFICATE (no -----BEGIN CERTIFICATE----- block); {fix}"]
    from cryptography import x509

    found, errors = [], []
    for number, block in enumerate(blocks, 1):
        if block.group(1) != "CERTIFICATE":
            what = (
                "a private key, which belongs in vllm_gateway_tls_key"
                if "PRIVATE KEY" in block.group(1)
                else f"a {block.group(1)}"
            )
            errors.append(
                f"{host}: {name} is not a PEM CERTIFICATE: its block {number} of {len(blocks)} is {what}; "
                f"{fix}, and nothing else"
            )
            continue
        try:
            found.append(x509.load_pem_x509_certificate(block.group(0).encode()))
        except ValueError as exc:
            errors.append(
                f"{host}: {name}'s certificate {number} of {len(blocks)} does not parse "
                f"({inputs.short(str(exc), 160, str)}); {fix}, each "
                "block as issued (`openssl x509 -in FILE -noout -text` reads each)"
            )
    return found, errors


def _private_key(host: str, value: Any) -> tuple[PrivateKeyTypes | None, list[str]]:
    """The private key, or the errors of vllm_gateway_tls_key (its value never shown)."""
    name = "vllm_gateway_tls_key"
    fix = "fix: the certificate's private key in PEM (PKCS#8, or PKCS#1 for RSA, or SEC1 for EC), from Ansible Vault"
    encrypted = (
        f"{host}: {name} (value not shown) is encrypted with a passphrase, which HAProxy cannot read without "
        "it; fix: store it decrypted (`openssl pkey -in KEY -out KEY.plain`), encrypted by Ansible Vault "
        "instead"
    )
    text = _text(value) or ""
    if not text.strip():
        return None, [f"{host}: {name} is empty; {fix}"]
    blocks = [b for b in PEM.finditer(text) if "PRIVATE KEY" in b.group(1)]
    if not blocks:
        return None, [f"{host}: {name} is not a PEM PRIVATE KEY (value not shown); {fix}"]
    if len(blocks) > 1:
        return None, [f"{host}: {name} (value not shown) holds {len(blocks)} private keys; {fix}, one key only"]
    block = blocks[0]
    if block.group(1) == "ENCRYPTED PRIVATE KEY":  # PKCS#8, encrypted; PKCS#1's Proc-Type header: TypeError below
        return None, [encrypted]
    if block.group(1) not in KEY_LABELS:
        return None, [f"{host}: {name} (value not shown) is a PEM {block.group(1)}, not a PEM PRIVATE KEY; {fix}"]
    from cryptography.hazmat.primitives import serialization

    try:
        return serialization.load_pem_private_key(block.group(0).encode(), password=None), []
    except TypeError:  # "Password was not given but private key is encrypted"
        return None, [encrypted]
    except (ValueError, NotImplementedError) as exc:
        # cryptography's messages name the format's fault, never the key's bytes.
        reason = inputs.short(str(exc), 160, str)
        return None, [f"{host}: {name} (value not shown) does not parse as a private key ({reason}); {fix}"]


def _public(key: PublicKeyTypes) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _tls(host: str, values: Mapping[str, Any], now: datetime.datetime | None) -> list[str]:
    """The certificate chain and its key: each parses, the leaf's public key is the key's, the leaf is not expired."""
    chain, errors = _certificates(host, values.get("vllm_gateway_tls_certificate"))
    key, key_errors = _private_key(host, values.get("vllm_gateway_tls_key"))
    errors += key_errors
    if chain:
        leaf = chain[0]
        subject = leaf.subject.rfc4514_string() or "no subject"
        expiry = leaf.not_valid_after_utc
        if expiry <= (now or datetime.datetime.now(datetime.UTC)):
            errors.append(
                f"{host}: vllm_gateway_tls_certificate's leaf ({subject}) expired on "
                f"{expiry:%Y-%m-%d %H:%M} UTC; fix: renew the gateway's certificate and give its new chain"
            )
        if key is not None and not errors:
            mine = _public(key.public_key())
            if _public(leaf.public_key()) != mine:
                later = [n for n, c in enumerate(chain[1:], 2) if _public(c.public_key()) == mine]
                hint = (
                    (f" (it is the key of certificate {later[0]} of the chain: put that one first, the leaf first)")
                    if later
                    else ""
                )
                errors.append(
                    f"{host}: vllm_gateway_tls_key (value not shown) is not the private key of "
                    f"vllm_gateway_tls_certificate's leaf ({subject}){hint}; fix: the key the certificate "
                    "was issued for, or a certificate issued for this key"
                )
    return errors


def _seconds(host: str, values: Mapping[str, Any]) -> list[str]:
    errors = []
    for name, (default, zero) in TIMEOUTS.items():
        value = values.get(name)
        number = inputs.whole(value)
        if value is not None and (number is None or number < 1):
            errors.append(
                f"{host}: {name}={inputs.short(value)} must be a positive number of seconds, a whole number "
                f"of at least 1 (0 would be {zero}); fix: e.g. {default}"
            )
    for name, default in COUNTS.items():
        value = values.get(name)
        number = inputs.whole(value)
        if value is not None and (number is None or number < 1):
            errors.append(f"{host}: {name}={inputs.short(value)} must be a positive whole number; fix: e.g. {default}")
    for name, (low, high), default, why in (
        (
            "vllm_gateway_prefix_bytes",
            PREFIX_BYTES,
            1024,
            "the start of a request body that a conversation's turns and a system prompt's users share",
        ),
        (
            "vllm_gateway_prefix_load_factor",
            PREFIX_LOAD_FACTOR,
            200,
            "the most an instance takes, in percent of the average load, before its requests go to the next one",
        ),
    ):
        value = values.get(name)
        number = inputs.whole(value)
        if value is not None and (number is None or not low <= number <= high):
            errors.append(
                f"{host}: {name}={inputs.short(value)} must be a whole number from {low} to {high} ({why}); "
                f"fix: e.g. {default}"
            )
    return errors


def backend_api_key(host: str, backends: Mapping[str, Any]) -> tuple[str, list[str]]:
    """The key the gateway `host` sends vLLM: the one ``vllm_api_key`` its backend hosts share (``backends``: {host
    name: its vllm_api_key, None or '' for none}), '' when none has one. When they differ, '' and the error, which
    names the gateway and two hosts that differ (one with a key and one without, else two with different keys),
    never a key."""
    keys = {str(name): _text(key) or ("" if key is None else str(key)) for name, key in backends.items()}
    if len(set(keys.values())) <= 1:
        return next(iter(keys.values()), ""), []
    names = sorted(keys)
    with_key = [n for n in names if keys[n]]
    without = [n for n in names if not keys[n]]
    if without:
        what = f"{with_key[0]} has a vllm_api_key and {without[0]} has none"
    else:
        other = next(n for n in with_key if keys[n] != keys[with_key[0]])
        what = f"{with_key[0]} and {other} have different vllm_api_key values"
    return "", [
        f"{host}: its backend hosts do not share the one vllm_api_key the gateway sends them: {what}; "
        f"{len(with_key)} of {len(names)} have a key, {len(set(keys.values()) - {''})} different one(s) "
        f"(no key is shown); {VAULT_FIX}"
    ]


def check(host: str, values: Mapping[str, Any], now: datetime.datetime | None = None) -> list[str]:
    """The errors of a gateway's settings, each naming the host, the setting, its value (never a key's) and the fix.
    ``now`` (UTC) is when the certificate must still be valid; by default, now."""
    errors: list[str] = _tls(host, values, now)
    old = values.get("vllm_gateway_backend_api_key")
    if old:
        errors.append(
            f"{host}: vllm_gateway_backend_api_key is set (value not shown), but the gateway no longer "
            "reads it: it sends its backend hosts their own vllm_api_key; fix: remove "
            "vllm_gateway_backend_api_key from the inventory (and its Vault entry), and give the group "
            "vllm_nodes one vllm_api_key"
        )
    unsafe = set()
    for name in STRINGS:
        found = _control(host, name, values.get(name))
        unsafe |= {name} if found else set()
        errors += found
    balance = values.get("vllm_gateway_balance")
    if balance is not None and "vllm_gateway_balance" not in unsafe and balance not in BALANCE:
        errors.append(
            f"{host}: vllm_gateway_balance={inputs.short(balance)} is not a balance algorithm the gateway "
            f"offers ({', '.join(BALANCE)}); fix: leastconn (a streamed answer holds its connection for its "
            "whole length, so the open connections are the load), or prefix to keep a conversation's prefix "
            "cache warm"
        )
    group = values.get("vllm_gateway_backend_group")
    if group is not None and "vllm_gateway_backend_group" not in unsafe and not (_text(group) or "").strip():
        errors.append(
            f"{host}: vllm_gateway_backend_group={inputs.short(group)} must name an inventory group; fix: vllm_nodes"
        )
    errors += _seconds(host, values)
    keys = values.get("vllm_gateway_api_keys")
    if not isinstance(keys, list) or not keys:
        errors.append(
            f"{host}: vllm_gateway_api_keys is empty: the gateway would refuse every request; fix: one "
            "entry per tenant, {tenant: NAME, key: from Vault, requests_per_minute: 0 or a limit}"
        )
        keys = []
    seen_tenants: set[str] = set()
    seen_keys: set[str] = set()
    for index, entry in enumerate(keys):
        where = f"{host}: vllm_gateway_api_keys[{index}]"
        if not isinstance(entry, Mapping):
            errors.append(f"{where} is not a mapping; fix: {{tenant: NAME, key: from Vault, requests_per_minute: N}}")
            continue
        tenant = entry.get("tenant")
        # The tenant's name is written into the gateway's maps and logs: letters, digits and _ . - only.
        if not (isinstance(tenant, str) and TENANT.fullmatch(tenant)):
            errors.append(
                f"{where}.tenant={inputs.short(tenant)} must be 1 to 64 letters, digits, _ . - (no space, "
                "control or format character); fix: for example team-a"
            )
        elif tenant in seen_tenants:
            errors.append(f"{where}.tenant={tenant!r} is given twice; fix: one entry per tenant")
        else:
            seen_tenants.add(tenant)
        key = _text(entry.get("key"))
        if key is not None and inputs.CONTROL.search(key):
            errors += _control(host, f"vllm_gateway_api_keys[{index}].key", key, secret=True)
        elif key is None or len(key) < MIN_KEY_LENGTH or any(c.isspace() for c in key):
            errors.append(
                f"{where}.key (value not shown) must be at least {MIN_KEY_LENGTH} characters without spaces; "
                "fix: a random key from Ansible Vault, e.g. `openssl rand -hex 24 | ansible-vault "
                "encrypt_string`"
            )
        elif key in seen_keys:
            errors.append(f"{where}.key (value not shown) is also another tenant's key; fix: one key per tenant")
        else:
            seen_keys.add(key)
        rate = entry.get("requests_per_minute", 0)
        if isinstance(rate, bool) or not isinstance(rate, int) or rate < 0:
            errors.append(f"{where}.requests_per_minute={rate!r} must be a whole number, 0 for no limit; fix: e.g. 600")
        cap = entry.get("max_concurrent", 0)
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            errors.append(
                f"{where}.max_concurrent={inputs.short(cap)} must be a whole number of requests in flight at once, "
                "0 for no limit; fix: e.g. 32"
            )
        unknown = sorted(set(entry) - set(TENANT_KEYS))
        if unknown:
            errors.append(f"{where} has unknown keys {unknown}; fix: only {', '.join(TENANT_KEYS)}")
    for name in ("vllm_gateway_port", "vllm_gateway_metrics_port"):
        port = values.get(name)
        if port is not None and not 1 <= (inputs.whole(port) or 0) <= 65535:
            errors.append(
                f"{host}: {name}={inputs.short(port)} must be a port number from 1 to 65535; fix: e.g. 443 and 8405"
            )
    for name in ("vllm_gateway_bind_address", "vllm_gateway_metrics_address"):
        address = values.get(name)
        if address is None or name in unsafe:
            continue
        try:
            ipaddress.ip_address(str(address))
        except ValueError:
            errors.append(
                f"{host}: {name}={inputs.short(address)} is not an IP address; fix: the gateway's address, or 0.0.0.0"
            )
    try:
        inputs.networks(host, "vllm_gateway_metrics_allow", values.get("vllm_gateway_metrics_allow") or [])
    except ValueError as exc:
        errors.append(str(exc))
    source = source_address(values.get("vllm_gateway_source_address"), values.get("ansible_host"), host)
    try:
        if "vllm_gateway_source_address" not in unsafe:
            ipaddress.ip_address(source)
    except ValueError:
        errors.append(
            f"{host}: vllm_gateway_source_address={inputs.short(source)} (by default its ansible_host, "
            "else its name) is not an IP address: the vLLM hosts admit the gateways by address "
            "(vllm_firewall); fix: set vllm_gateway_source_address to the address the gateway's connections "
            "to vLLM come from, or vllm_firewall: false on the vLLM hosts"
        )
    return errors


def _setting(values: Mapping[str, Any], name: str) -> str:
    """A setting as text for comparing and showing: '' when absent."""
    value = values.get(name)
    if value is None:
        return ""
    text = _text(value)
    return text if text is not None else str(value)


def _or_default(values: Mapping[str, Any], name: str, default: float) -> Any:
    """A setting the role defaults (absent or null: the default)."""
    value = values.get(name)
    return default if value is None else value


def _others(names: Iterable[str], shown: Mapping[str, str]) -> str:
    """Gateways and their values, for a message: gw-2 (10.0.0.9/24), gw-3 (not set)."""
    return ", ".join(f"{n} ({inputs.short(shown[n]) if shown[n] else 'not set'})" for n in names)


def _vip_addresses(host: str, vip: str, gateways: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The vip's errors: its form, an address no host may hold, and the gateways' own addresses against it."""
    name = "vllm_gateway_vip"
    fix = "fix: ADDRESS/PREFIX, a free address of the gateways' network and that network's prefix, e.g. 10.89.77.9/24"
    shown_vip = inputs.short(vip)
    control = _control(host, name, vip)
    if control:
        return control
    if not VIP.fullmatch(vip):
        return [f"{host}: {name}={shown_vip} is not ADDRESS/PREFIX; {fix}"]
    try:
        interface = ipaddress.ip_interface(vip)
    except ValueError as exc:
        return [f"{host}: {name}={shown_vip} does not parse ({inputs.short(str(exc), 120, str)}); {fix}"]
    errors = []
    network, address = interface.network, interface.ip
    if address == network.network_address and network.num_addresses > 2:
        errors.append(
            f"{host}: {name}={shown_vip} is the network address of {network}, which no host may hold; fix: a free "
            f"host address of {network}, with the prefix /{network.prefixlen}"
        )
    if network.version == 4 and network.num_addresses > 2 and address == network.broadcast_address:
        errors.append(
            f"{host}: {name}={shown_vip} is the broadcast address of {network}; fix: a free host address of "
            f"{network}, with the prefix /{network.prefixlen}"
        )
    for other, values in sorted(gateways.items()):
        source = source_address(values.get("vllm_gateway_source_address"), values.get("ansible_host"), other)
        try:
            own = ipaddress.ip_address(source)
        except ValueError:
            continue  # not an address: check()'s error, on that gateway
        whose = "its own" if other == host else f"the gateway {other}'s"
        if own == address:
            errors.append(
                f"{host}: {name}={shown_vip} is {whose} address (vllm_gateway_source_address, by default its "
                "ansible_host): keepalived would move a gateway's own address away from it; fix: a free address "
                f"of {network} that no host holds"
            )
        elif own.version != network.version or own not in network:
            errors.append(
                f"{host}: {name}={shown_vip}: {whose} address {own} (vllm_gateway_source_address, by default its "
                f"ansible_host) is not in the vip's network {network}; the vip must be an address of the gateways' "
                "network, since VRRP's advertisements and the gratuitous ARP that moves the address reach only "
                "one link; fix: a vip in the network of the gateways' own addresses, with that network's prefix "
                "(e.g. /24), or gateways on one network"
            )
    return errors


def _vrrp_numbers(host: str, gateways: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The priority (one per gateway), the router id (the same on all) and the advertisement interval."""
    values = gateways.get(host) or {}
    errors = []
    low, high = VRRP_PRIORITY
    name = "vllm_gateway_vrrp_priority"
    priority = inputs.whole(values.get(name))
    if values.get(name) is None:
        errors.append(
            f"{host}: {name} is not set, and every gateway that shares vllm_gateway_vip needs its own; fix: a "
            f"whole number from {low} to {high}, a different one on each gateway (the highest takes the address "
            "first), in its host_vars"
        )
    elif priority is None or not low <= priority <= high:
        errors.append(
            f"{host}: {name}={inputs.short(values.get(name))} must be a whole number from {low} to {high} "
            f"(255 is an address owner's, which a shared address has none of); fix: e.g. 150 on one gateway and "
            "100 on the next"
        )
    else:
        same = sorted(n for n, v in gateways.items() if n != host and inputs.whole(v.get(name)) == priority)
        if same:
            errors.append(
                f"{host}: {name}={priority} is also the priority of {', '.join(same)}: two gateways of one priority "
                "leave which holds the address to chance; fix: a different priority on each gateway"
            )
    name = "vllm_gateway_vrrp_router_id"
    low, high = VRRP_ROUTER_ID
    value = _or_default(values, name, VRRP_ROUTER_ID_DEFAULT)
    if not low <= (inputs.whole(value) or 0) <= high:
        errors.append(
            f"{host}: {name}={inputs.short(value)} must be a whole number from {low} to {high} (VRRP's "
            f"virtual_router_id); fix: e.g. {VRRP_ROUTER_ID_DEFAULT}, the same on every gateway and unused by other "
            "VRRP routers of the network"
        )
    errors += _vrrp_timing(host, gateways)
    router_id = inputs.whole(_or_default(values, name, VRRP_ROUTER_ID_DEFAULT))
    if router_id is not None and VRRP_ROUTER_ID[0] <= router_id <= VRRP_ROUTER_ID[1]:
        errors += _same_on_all(
            host,
            gateways,
            name,
            router_id,
            lambda v: inputs.whole(_or_default(v, name, VRRP_ROUTER_ID_DEFAULT)),
            VRRP_ROUTER_ID_DEFAULT,
            "gateways of different router ids are separate VRRP routers and each would take the address",
        )
    return errors


def _same_on_all(
    host: str,
    gateways: Mapping[str, Mapping[str, Any]],
    name: str,
    mine: Any,
    read: Callable[[Mapping[str, Any]], Any],
    default: float,
    why: str,
) -> list[str]:
    """A setting every gateway must share: an error naming the others' values (``read`` from each one's settings)
    where they differ from this gateway's ``mine``, and ``why`` it matters; [] where they agree."""
    differ = sorted(n for n, v in gateways.items() if n != host and read(v) != mine)
    if not differ:
        return []
    shown = {n: str(_or_default(gateways[n], name, default)) for n in differ}
    return [
        f"{host}: {name}={mine} differs from the other gateways': {_others(differ, shown)}; {why}; fix: one "
        f"{name} for all, in the group_vars of vllm_gateways"
    ]


def vrrp_version(values: Mapping[str, Any]) -> int | None:
    """A gateway's VRRP version (vllm_gateway_vrrp_version, by default 3); None when it is not 2 or 3."""
    version = inputs.whole(_or_default(values, "vllm_gateway_vrrp_version", VRRP_VERSION_DEFAULT))
    return version if version in VRRP_VERSIONS else None


def _interval(value: Any) -> float | None:
    """A number of seconds of the inventory (an int or a float, or its text: -e gives strings); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    text = _text(value)
    return float(text) if text is not None and re.fullmatch(r"[0-9]+(\.[0-9]+)?", text) else None


def _vrrp_timing(host: str, gateways: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The version (2 or 3, the same on every gateway: a v2 and a v3 router ignore each other's adverts) and the
    advertisement interval that version can carry (v2 whole seconds, v3 hundredths)."""
    values = gateways.get(host) or {}
    name = "vllm_gateway_vrrp_version"
    raw = _or_default(values, name, VRRP_VERSION_DEFAULT)
    version = vrrp_version(values)
    if version is None:
        return [
            f"{host}: {name}={inputs.short(raw)} must be 2 or 3; fix: 3 (the default: sub-second adverts, VRRP "
            "admitted only from the other gateways), or 2 (whole-second adverts with a password from Ansible Vault)"
        ]
    errors = _same_on_all(
        host,
        gateways,
        name,
        version,
        vrrp_version,
        VRRP_VERSION_DEFAULT,
        "a VRRPv2 and a VRRPv3 router ignore each other's adverts and each would take the address",
    )
    name = "vllm_gateway_vrrp_advert_s"
    value = _or_default(values, name, VRRP_ADVERT_DEFAULT if version == 3 else 1)
    seconds = _interval(value)
    low, high = VRRP_ADVERT[version]
    if version == 2 and (seconds is None or seconds != int(seconds) or not low <= seconds <= high):
        errors.append(
            f"{host}: {name}={inputs.short(value)} must be whole seconds from {low} to {high} with "
            "vllm_gateway_vrrp_version 2 (VRRPv2 advertises in whole seconds); fix: e.g. 1, or version 3 for "
            "sub-second adverts"
        )
    elif version == 3 and (
        seconds is None or abs(round(seconds * 100) - seconds * 100) > 1e-6 or not low <= seconds <= high
    ):
        errors.append(
            f"{host}: {name}={inputs.short(value)} must be seconds from {low} to {high} in hundredths with "
            f"vllm_gateway_vrrp_version 3 (VRRPv3 advertises in centiseconds); fix: e.g. {VRRP_ADVERT_DEFAULT} (a "
            "vanished holder is taken over after three missed adverts and a skew under one)"
        )
    return errors


def _vrrp_password(
    host: str, gateways: Mapping[str, Mapping[str, Any]], sources: Mapping[str, str | None]
) -> list[str]:
    """The PASS password: set, keepalived's 8 printable characters, the same on every gateway, from Vault. No message
    shows a password, nor its length."""
    name = "vllm_gateway_vrrp_password"
    password = _setting(gateways.get(host) or {}, name)
    if not password:
        return [f"{host}: {name} is not set or empty; {VRRP_PASSWORD_FIX}"]
    errors = []
    if len(password) > VRRP_PASSWORD_LENGTH:
        errors.append(
            f"{host}: {name} (value not shown) is longer than {VRRP_PASSWORD_LENGTH} characters, and keepalived's "
            f"PASS authentication reads only the first {VRRP_PASSWORD_LENGTH}; {VRRP_PASSWORD_FIX}"
        )
    elif not VRRP_PASSWORD.fullmatch(password):
        errors.append(
            f"{host}: {name} (value not shown) holds a character that is not printable ASCII, or a space, a line "
            f"break or another control character; {VRRP_PASSWORD_FIX}"
        )
    differ = sorted(n for n, v in gateways.items() if n != host and _setting(v, name) != password)
    if differ:
        errors.append(
            f"{host}: {name} (value not shown) differs from the one of {', '.join(differ)} (no value is shown): "
            f"keepalived ignores the advertisements of a gateway with another password, and both would take the "
            f"address; {VRRP_PASSWORD_FIX}"
        )
    source = sources.get(host, "nothing says where it came from")
    if source is not None:
        errors.append(
            f"{host}: {name} (value not shown) must come from Ansible Vault; where it came from: {source}; fix: "
            "encrypt it with `ansible-vault encrypt_string --name vllm_gateway_vrrp_password` (or keep it in a "
            "vars file encrypted with `ansible-vault encrypt`) and put it in the group_vars of vllm_gateways, "
            "none in a host's own vars or on the command line"
        )
    return errors


def vip_errors(host: str, gateways: Mapping[str, Mapping[str, Any]], sources: Mapping[str, str | None]) -> list[str]:
    """The errors of the virtual address the gateways share through keepalived, for the gateway `host`, each naming
    the host, the setting, its value (never a password's) and the fix; [] when no gateway sets vllm_gateway_vip.

    ``gateways``: {name: its variables} for every gateway of vllm_gateways, `host` included. ``sources``: {name:
    None when its vllm_gateway_vrrp_password came from Ansible Vault, else a short text saying where it came from};
    a gateway missing from it counts as not from Vault. A gateway's own address is its vllm_gateway_source_address,
    by default its ansible_host (``source_address``); one that is not an IP address is ``check``'s error."""
    shown = {name: _setting(values, "vllm_gateway_vip") for name, values in gateways.items()}
    shown.setdefault(host, "")
    if not any(shown.values()):
        return []
    vip = shown[host]
    shown_vip = inputs.short(vip)
    differ = sorted(n for n in shown if n != host and shown[n] != vip)
    fix = "fix: one vllm_gateway_vip for all the gateways, in the group_vars of vllm_gateways (or none on any)"
    if not vip:
        return [f"{host}: vllm_gateway_vip is not set, but other gateways set one: {_others(differ, shown)}; {fix}"]
    errors = []
    if differ:
        errors.append(
            f"{host}: vllm_gateway_vip={shown_vip} differs from the other gateways': {_others(differ, shown)}; {fix}"
        )
    errors += _vip_addresses(host, vip, gateways)
    values = gateways.get(host) or {}
    bind = _setting(values, "vllm_gateway_bind_address") or "0.0.0.0"
    if bind not in ("0.0.0.0", "::"):
        errors.append(
            f"{host}: vllm_gateway_bind_address={inputs.short(bind)} is a specific address, but with "
            f"vllm_gateway_vip={shown_vip} HAProxy must also answer on the vip when keepalived moves it here; fix: "
            "0.0.0.0 (or :: for IPv6 too)"
        )
    errors += _vrrp_numbers(host, {**gateways, host: values})
    if vrrp_version(values) == 2:
        errors += _vrrp_password(host, {**gateways, host: values}, sources)
    elif vrrp_version(values) == 3 and _setting(values, "vllm_gateway_vrrp_password"):
        errors.append(
            f"{host}: vllm_gateway_vrrp_password (value not shown) is set, but VRRPv3 (vllm_gateway_vrrp_version 3, "
            "the default) carries no authentication, so keepalived would ignore it; the gateways admit VRRP only "
            "from each other's addresses instead; fix: remove vllm_gateway_vrrp_password (and its vault entry), or "
            "set vllm_gateway_vrrp_version: 2 to keep VRRPv2's clear-text password and whole-second adverts"
        )
    interface = values.get("vllm_gateway_vrrp_interface")
    if interface:
        text = _text(interface)
        if text is None or not INTERFACE.fullmatch(text) or text in (".", ".."):
            errors.append(
                f"{host}: vllm_gateway_vrrp_interface={inputs.short(interface)} is not an interface name (1 to 15 "
                "letters, digits, _ . : -); fix: the interface that holds the gateway's own address, e.g. eth0, "
                "or '' to find it from the gateway's facts"
            )
    return errors


def vrrp_interface(interfaces: Mapping[str, Any], address: str) -> str:
    """The name of the interface that holds ``address`` (the gateway's own; IPv4 or IPv6), which keepalived's
    advertisements leave from.

    ``interfaces``: {interface name: its facts}, as Ansible's facts give them (the names of
    ``ansible_facts['interfaces']``, each with ``ansible_facts[name]``, '-' read as '_'), of which only these are
    read: ``{"ipv4": {"address": "10.0.0.5", ...}, "ipv4_secondaries": [{"address": ...}, ...], "ipv6":
    [{"address": "fd00::5", ...}, ...]}``, each part optional. ValueError names the address and the interfaces seen
    when none holds it, or the address when it is not one."""
    try:
        wanted = ipaddress.ip_address(str(address))
    except ValueError:
        raise ValueError(
            f"the gateway's own address {inputs.short(address)} (vllm_gateway_source_address, by default its "
            "ansible_host) is not an IP address, so no interface can be found for keepalived; fix: set "
            "vllm_gateway_vrrp_interface, or vllm_gateway_source_address to the gateway's address"
        ) from None
    for name in sorted(interfaces):
        facts = interfaces[name]
        if not isinstance(facts, Mapping):
            continue
        ipv4 = facts.get("ipv4")
        entries = [ipv4] if isinstance(ipv4, Mapping) else []
        for key in ("ipv4_secondaries", "ipv6"):
            found = facts.get(key)
            entries += [e for e in found if isinstance(e, Mapping)] if isinstance(found, list) else []
        for entry in entries:
            try:
                if ipaddress.ip_address(str(entry.get("address", "")).split("%")[0]) == wanted:
                    return str(name)
            except ValueError:
                continue
    seen = ", ".join(sorted(str(n) for n in interfaces)) or "none"
    raise ValueError(
        f"no interface holds the gateway's own address {wanted} (interfaces seen: {seen}), so keepalived has none "
        "to advertise from; fix: set vllm_gateway_vrrp_interface to the interface on the gateways' network, or "
        "vllm_gateway_source_address to an address this gateway holds (and gather its network facts)"
    )


def server_sessions(show_stat: str, backend: str, server: str) -> int | None:
    """Current sessions of `server` in `backend` from the runtime API's `show stat` (CSV), with those of the servers
    that track it (the same instance in its adapters' backends); None if absent."""
    text = show_stat.lstrip("# ")
    found = None
    for row in csv.DictReader(io.StringIO(text)):
        if row.get("svname") == server and (
            row.get("pxname") == backend or row.get("tracked") == f"{backend}/{server}"
        ):
            found = (found or 0) + int(row.get("scur") or 0)
    return found


def requests_running(metrics_text: str) -> float:
    """Requests an instance is still working on (vllm:num_requests_running, summed over its engines)."""
    total = metrics.parse(metrics_text).gauges.get("vllm:num_requests_running", {}).get("sum", 0.0)
    return 0.0 if total is None else total  # a gauge's sum is never None (its max is, without series)


def source_address(source: Any, ansible_host: Any, name: str) -> str:
    """The address a gateway's connections to vLLM come from: vllm_gateway_source_address, else its ansible_host,
    else its inventory name."""
    return str(source or ansible_host or name)


def clients(
    gateways: Mapping[str, Mapping[str, Any]],
    allowed: Any,
    host: str,
    monitoring: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, list[str]]:
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
    return {
        family: [str(n) for n in sorted({n for n in found if n.version == version})]
        for family, version in (("ipv4", 4), ("ipv6", 6))
    }
