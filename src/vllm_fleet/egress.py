"""What a fleet host may send out (roles/vllm_firewall's ``egress`` entry point): everything else is denied.

A fleet host (a vLLM host, a gateway, a monitoring host) starts connections only to:

- the other fleet hosts (any port: the gateways reach the instances, Prometheus scrapes every host), each by its
  ``ansible_host`` where that is an address, and the networks the fleet's hosts are in
  (``vllm_egress_fleet_networks``), which cover the hosts an inventory knows by name; and the address the gateways
  share (``vllm_gateway_vip``), held by one of them at a time;
- the hosts of the URLs the roles fetch from or send to: ``vllm_wheelhouse_url``, ``vllm_model_url``,
  ``vllm_draft_model_url``, the monitoring receivers' ``webhook_url`` (with ``vllm_monitoring_smtp_smarthost``) and,
  on a monitoring host that checks the mirror (``vllm_monitoring_mirror_check``), ``vllm_signed_manifest_url``,
  each on its own port. A wheelhouse given as a local folder (an absolute path, or a ``file:`` URL of one: pip's
  ``--find-links`` and ``-r`` read both) needs no rule; any other value without a host and port is refused, a
  relative path included (the host's pip would read it from wherever it runs). The model URLs have no local form:
  the role fetches them over HTTP, and a model folder on the host is ``vllm_model_source: path``;
- ``vllm_egress_dns`` (port 53, UDP and TCP), and DHCP (UDP 67 and 547) and IPv6 neighbour discovery, without which
  a host loses its address;
- ``vllm_egress_allow``: ``{to: address or network, ports: [...] (none: any), proto: tcp|udp|any, why: text,
  name: DNS name}``, for what the roles cannot know (the OS package mirror, NTP, a proxy).

A URL whose host is a name cannot become a rule (rules hold addresses, and the rules load before DNS answers): it
must be covered by a ``vllm_egress_allow`` entry that gives that ``name`` and its address, or ``rules`` says so,
naming the host, the setting, the URL and the fix. Replies to connections made to the host (SSH, the gateways'
requests) are not egress: they pass.

``denied`` reads back what the rules refused: the ``denied`` counter and the destinations the rules recorded
(``nft -j list``), so a verification names every refused attempt.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from . import inputs, monitoring

PROTOS = ("tcp", "udp", "any")
PROTOCOL_NAMES = {"6": "tcp", "17": "udp"}
# Every setting of a host that its rules read.
SETTINGS = (
    "vllm_egress_allow",
    "vllm_egress_dns",
    "vllm_egress_fleet_networks",
    "vllm_wheelhouse_url",
    "vllm_model_url",
    "vllm_draft_model_url",
    "vllm_monitoring_receivers",
    "vllm_monitoring_smtp_smarthost",
    "vllm_monitoring_mirror_check",
    "vllm_signed_manifest_url",
    "vllm_lora_adapters",
)
# Set by the filter for a host of the group vllm_monitoring: its mirror's check reads the mirror
# (vllm_monitoring_mirror_check).
MONITORING_HOST = "_vllm_monitoring_host"
# The URL settings of a host whose destinations the rules admit by themselves (a host's own settings).
URL_SETTINGS = ("vllm_wheelhouse_url", "vllm_model_url", "vllm_draft_model_url")
# Those a local folder may give instead of a URL (roles/vllm/tasks/install.yml: pip's --find-links and -r take a path
# or a file: URL), and what the fix says for the others: the model staging fetches its URLs over HTTP
# (roles/vllm/tasks/stage_model.yml), and a model folder on the host is another source.
LOCAL_SETTINGS = ("vllm_wheelhouse_url",)
LOCAL_FIX = {
    "vllm_wheelhouse_url": ", or a local folder as an absolute path such as /opt/vllm-site/wheelhouse/vllm-0.33.0",
    "vllm_model_url": "; a model folder on the host is vllm_model_source: path with vllm_model_src",
    "vllm_draft_model_url": "; a model folder on the host is vllm_draft_model_source: path with vllm_draft_model_src",
}
DEFAULT_PORTS = {"http": 80, "https": 443}
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


FLEET_GROUPS = ("vllm_nodes", "vllm_gateways", "vllm_monitoring")


def fleet_hosts(groups: Mapping[str, Any]) -> list[str]:
    """Every host of the fleet's groups (the inventory's ``groups``), once, in the groups' order."""
    found: list[str] = []
    for group in FLEET_GROUPS:
        found += [str(h) for h in groups.get(group) or [] if str(h) not in found]
    return found


def _rule(to: Network, proto: str, ports: Iterable[int], why: str) -> dict[str, Any]:
    return {
        "family": "ip" if to.version == 4 else "ip6",
        "to": str(to),
        "proto": proto,
        "ports": sorted(set(ports)),
        "why": why,
    }


def _ports(host: str, where: str, value: Any, errors: list[str]) -> list[int]:
    if value is None or value == []:
        return []
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, Mapping) or not isinstance(value, Iterable):
        errors.append(f"{host}: {where} ports={value!r} must be a list of ports; fix: for example [80, 443]")
        return []
    found = []
    for port in value:
        text = str(port).strip()
        if isinstance(port, bool) or not text.isdigit() or not 1 <= int(text) <= 65535:
            errors.append(f"{host}: {where} has the port {port!r}; fix: a port number from 1 to 65535")
            continue
        found.append(int(text))
    return found


def _allow(host: str, allow: Any, errors: list[str]) -> tuple[list[dict[str, Any]], dict[str, set[Network]]]:
    """The operator's entries as rules, and the names they cover: {DNS name: its networks}."""
    if allow is None:
        return [], {}
    if isinstance(allow, (str, bytes, Mapping)) or not isinstance(allow, Iterable):
        errors.append(
            f"{host}: vllm_egress_allow={inputs.short(allow)} must be a list of {{to, ports, proto, why}}; fix: for "
            "example [{to: 10.0.10.5, ports: [80], why: the package mirror}]"
        )
        return [], {}
    rules: list[dict[str, Any]] = []
    names: dict[str, set[Network]] = {}
    for index, entry in enumerate(allow):
        where = f"vllm_egress_allow[{index}]"
        if not isinstance(entry, Mapping) or "to" not in entry:
            errors.append(
                f"{host}: {where}={inputs.short(entry)} must be a mapping with at least `to` (an address or a "
                "network); fix: for example {to: 10.0.10.5, ports: [80], why: the package mirror}"
            )
            continue
        unknown = sorted(set(entry) - {"to", "ports", "proto", "why", "name"})
        if unknown:
            errors.append(f"{host}: {where} has unknown keys {unknown}; fix: only to, ports, proto, why and name")
        try:
            network = ipaddress.ip_network(str(entry["to"]).strip(), strict=False)
        except ValueError:
            errors.append(
                f"{host}: {where} to={inputs.short(entry['to'])} is not an address or a network (rules hold "
                "addresses, and load before DNS answers); fix: the address, e.g. 10.0.10.5 or 10.0.10.0/24, and the "
                "DNS name it serves in `name`"
            )
            continue
        proto = str(entry.get("proto", "tcp"))
        if proto not in PROTOS:
            errors.append(f"{host}: {where} proto={proto!r}; fix: one of {', '.join(PROTOS)}")
            continue
        ports = _ports(host, where, entry.get("ports"), errors)
        if ports and proto == "any":
            errors.append(f"{host}: {where} gives ports with proto=any; fix: proto tcp or udp, or no ports")
            continue
        why = str(entry.get("why") or entry.get("name") or where)
        rules.append(_rule(network, proto, ports, why))
        if entry.get("name"):
            names.setdefault(str(entry["name"]).strip().lower().rstrip("."), set()).add(network)
    return rules, names


def _urls(settings: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(setting, URL) of every destination the host's roles reach by URL."""
    found = [(name, str(settings[name])) for name in URL_SETTINGS if settings.get(name)]
    adapters = settings.get("vllm_lora_adapters")
    if isinstance(adapters, list):
        for index, adapter in enumerate(adapters):
            if isinstance(adapter, Mapping) and adapter.get("url"):
                found.append((f"vllm_lora_adapters[{index}].url", str(adapter["url"])))
    receivers = settings.get("vllm_monitoring_receivers")
    if isinstance(receivers, list):
        for index, receiver in enumerate(receivers):
            if isinstance(receiver, Mapping) and receiver.get("webhook_url"):
                found.append((f"vllm_monitoring_receivers[{index}].webhook_url", str(receiver["webhook_url"])))
    if (
        settings.get(MONITORING_HOST)
        and monitoring.mirror_check_on(settings)
        and settings.get("vllm_signed_manifest_url")
    ):
        found.append(("vllm_signed_manifest_url", str(settings["vllm_signed_manifest_url"])))
    smarthost = settings.get("vllm_monitoring_smtp_smarthost")
    if smarthost and any(isinstance(r, Mapping) and r.get("email_to") for r in receivers or []):
        found.append(("vllm_monitoring_smtp_smarthost", "smtp://" + str(smarthost)))
    return found


def local_folder(url: str) -> bool:
    """Whether `url` names a folder on the host itself: an absolute path (``/srv/wheelhouse``), or a ``file:`` URL of
    one with no host or ``localhost`` (``file:///srv/wheelhouse``). A relative path is not one: where it leads
    depends on where the reader runs."""
    try:
        parts = urlsplit(url)
        if not parts.scheme and not parts.netloc:
            return url.startswith("/")
        return parts.scheme == "file" and parts.hostname in (None, "localhost") and parts.path.startswith("/")
    except ValueError:
        return False


def _url_rules(
    host: str, settings: Mapping[str, Any], names: Mapping[str, set[Network]], errors: list[str]
) -> list[dict[str, Any]]:
    rules = []
    for setting, url in _urls(settings):
        if setting in LOCAL_SETTINGS and local_folder(url):
            continue  # read on the host itself: nothing to send out
        try:
            parts = urlsplit(url)
            port = parts.port or DEFAULT_PORTS.get(parts.scheme) or (25 if parts.scheme == "smtp" else None)
        except ValueError:
            parts, port = None, None
        if parts is None or not parts.hostname or port is None:
            errors.append(
                f"{host}: {setting}={inputs.short(url)} has no host and port egress could admit; fix: a URL such "
                f"as http://10.0.10.5:8080/path{LOCAL_FIX.get(setting, '')}"
            )
            continue
        try:
            address = ipaddress.ip_address(parts.hostname)
        except ValueError:
            name = parts.hostname.lower().rstrip(".")
            if name in ("localhost",):
                continue
            if name not in names:
                errors.append(
                    f"{host}: {setting}={inputs.short(url)} reaches {parts.hostname}, a name, and egress rules hold "
                    f"addresses; fix: add {{to: <its address>, ports: [{port}], name: {parts.hostname}, why: ...}} "
                    "to vllm_egress_allow, or vllm_egress: false"
                )
            continue
        if address.is_loopback:
            continue
        rules.append(_rule(ipaddress.ip_network(address), "tcp", [port], setting))
    return rules


def named_peers(peers: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The fleet hosts known by a name rather than an address ({host: its ansible_host}): the only peers a host's
    settings can fail on (:func:`errors`)."""
    named = {}
    for name, values in peers.items():
        address = values.get("ansible_host") or name
        try:
            ipaddress.ip_network(str(address), strict=False)
        except ValueError:
            named[name] = address
    return named


def _named_peer_errors(host: str, named: Mapping[str, Any], names: Mapping[str, Any], fleet_networks: Any) -> list[str]:
    return [
        f"{host}: the fleet host {name} has ansible_host={inputs.short(address)}, not an address, and egress rules "
        "hold addresses; fix: the networks the fleet's hosts are in as vllm_egress_fleet_networks (e.g. "
        "[10.0.0.0/16]), or its address as ansible_host"
        for name, address in sorted(named.items())
        if name != host and not (names.get(str(address).lower().rstrip(".")) or fleet_networks)
    ]


def errors(host: str, settings: Mapping[str, Any], named: Mapping[str, Any]) -> list[str]:
    """:func:`rules`' errors alone, the same in the same order, without making the rules: ``named`` is
    :func:`named_peers` of the fleet, found once for all its hosts (the rules admit every other fleet host, so making
    them for every host costs the square of the fleet's size)."""
    out: list[str] = []
    _, names = _allow(host, settings.get("vllm_egress_allow"), out)
    fleet_networks = settings.get("vllm_egress_fleet_networks") or []
    try:
        inputs.networks(host, "vllm_egress_fleet_networks", fleet_networks)
    except ValueError as exc:
        out.append(str(exc))
    out += _named_peer_errors(host, named, names, fleet_networks)
    _url_rules(host, settings, names, out)
    try:
        inputs.networks(host, "vllm_egress_dns", settings.get("vllm_egress_dns") or [])
    except ValueError as exc:
        out.append(str(exc))
    return out


def rules(host: str, settings: Mapping[str, Any], peers: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A host's egress: ``{"errors": [...], "rules": [{family, to, proto, ports, why}...], "dns": [...]}``.

    ``settings`` are the host's variables; ``peers`` every fleet host's ({name: its variables}), the host itself
    among them or not. Every error names the host, the setting, the value and the fix."""
    errors: list[str] = []
    found, names = _allow(host, settings.get("vllm_egress_allow"), errors)
    fleet_networks = settings.get("vllm_egress_fleet_networks") or []
    try:
        for network in inputs.networks(host, "vllm_egress_fleet_networks", fleet_networks):
            found.append(_rule(network, "any", [], "the fleet's networks (vllm_egress_fleet_networks)"))
    except ValueError as exc:
        errors.append(str(exc))
    for name, values in sorted(peers.items()):
        if name == host:
            continue
        address = values.get("ansible_host") or name
        try:
            network = ipaddress.ip_network(str(address), strict=False)
        except ValueError:
            errors += _named_peer_errors(host, {name: address}, names, fleet_networks)
            continue
        found.append(_rule(network, "any", [], f"the fleet host {name}"))
    # The gateways' shared address (vllm_gateway_vip), which one gateway holds at a time: the others' checks reach
    # the front door there. One that does not parse is the gateways' own plan error (gateway.vip_errors).
    for values in {host: settings, **peers}.values():
        try:
            vip = ipaddress.ip_interface(str(values.get("vllm_gateway_vip") or "")).ip
        except ValueError:
            continue
        found.append(_rule(ipaddress.ip_network(vip), "any", [], "the gateways' shared address (vllm_gateway_vip)"))
    found += _url_rules(host, settings, names, errors)
    dns = []
    try:
        dns = [str(n) for n in inputs.networks(host, "vllm_egress_dns", settings.get("vllm_egress_dns") or [])]
    except ValueError as exc:
        errors.append(str(exc))
    for resolver in dns:
        network = ipaddress.ip_network(resolver)
        found += [_rule(network, proto, [53], "vllm_egress_dns") for proto in ("udp", "tcp")]
    # One rule per destination, protocol and ports; the reasons of duplicates joined.
    merged: dict[tuple[str, str, tuple[int, ...]], dict[str, Any]] = {}
    for rule in found:
        key = (rule["to"], rule["proto"], tuple(rule["ports"]))
        if key in merged:
            if rule["why"] not in merged[key]["why"].split("; "):
                merged[key]["why"] += "; " + rule["why"]
        else:
            merged[key] = dict(rule)
    ordered = sorted(merged.values(), key=lambda r: (r["family"], r["to"], r["proto"], r["ports"]))
    return {"errors": errors, "rules": ordered, "dns": dns}


def nft_comment(text: str) -> str:
    """A rule's reason as an nftables comment: printable ASCII, no quotes, at most 120 characters."""
    cleaned = "".join(c if c.isprintable() and c.isascii() and c not in '"\\' else "?" for c in str(text))
    return cleaned[:120]


def denied(listing: str) -> dict[str, Any]:
    """What the rules refused, from ``nft -j list table inet <table>``: ``{"packets", "bytes", "destinations":
    [{"to", "proto", "port", "packets"}...]}``. ValueError when the text is not nft's JSON or lacks the counter."""
    try:
        document = json.loads(listing)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not nft's JSON output: {exc}") from None
    counter = None
    destinations = []
    for item in document.get("nftables", []) if isinstance(document, Mapping) else []:
        if "counter" in item and item["counter"].get("name") == "denied":
            counter = item["counter"]
        elif "set" in item and str(item["set"].get("name", "")).startswith("denied_"):
            for element in item["set"].get("elem") or []:
                destinations.append(_destination(element))
    if counter is None:
        raise ValueError("the listing has no counter named denied: the egress rules are not loaded")
    destinations.sort(key=lambda d: (-d["packets"], d["to"], d["proto"], d["port"]))
    return {
        "packets": int(counter.get("packets", 0)),
        "bytes": int(counter.get("bytes", 0)),
        "destinations": destinations,
    }


def describe(destination: Mapping[str, Any]) -> str:
    """One refused destination in words: ``10.0.0.9 tcp/443 (3 packets)``."""
    packets = int(destination.get("packets") or 0)
    return "%s %s/%s (%d packet%s)" % (
        destination.get("to"),
        destination.get("proto"),
        destination.get("port"),
        packets,
        "" if packets == 1 else "s",
    )


def _destination(element: Any) -> dict[str, Any]:
    """One element of a denied_ set: {"elem": {"val": {"concat": [address, proto, port]}, "counter": {...}}}."""
    packets = 0
    value = element
    if isinstance(element, Mapping) and "elem" in element:
        packets = int((element["elem"].get("counter") or {}).get("packets", 0))
        value = element["elem"].get("val")
    parts = value.get("concat") if isinstance(value, Mapping) else None
    if not isinstance(parts, list) or len(parts) != 3:
        return {"to": json.dumps(value), "proto": "?", "port": 0, "packets": packets}
    to, proto, port = parts
    # nft names the protocol ("tcp") or gives its number ("6"), by build: one spelling here.
    name = PROTOCOL_NAMES.get(str(proto), str(proto))
    return {"to": str(to), "proto": name, "port": int(port), "packets": packets}
