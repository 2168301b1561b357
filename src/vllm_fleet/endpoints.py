"""Where a host's vLLM answers: the one home of "a wildcard bind address is reached on loopback from the host
itself, and at the inventory's address from elsewhere", used by the plan's instances (the gateway's backends,
the health wait), the verification's probes and the benchmark."""

from __future__ import annotations

from typing import Any

WILDCARD_ADDRESSES = ("", "0.0.0.0", "::", "[::]")


def probe_url(address: Any, port: Any, scheme: str = "http") -> str:
    """The base URL of a host's vLLM as the host itself reaches it: a wildcard or empty bind address on
    127.0.0.1, an IPv6 address in brackets."""
    address = "" if address is None else str(address)
    if address in WILDCARD_ADDRESSES:
        address = "127.0.0.1"
    elif ":" in address and not address.startswith("["):
        address = f"[{address}]"
    return f"{scheme}://{address}:{port}"


def network_address(bind: Any, inventory_address: str) -> str:
    """The address other hosts (a gateway, the monitoring) reach the instance at: its bind address, or the
    inventory's address of the host when it binds every interface."""
    bind = "" if bind is None else str(bind)
    return inventory_address if bind in WILDCARD_ADDRESSES else bind


def deployed(name: str, args: Any, inventory_address: str, unit_format: str) -> dict[str, Any]:
    """An instance as a host runs it now, from the arguments its unit runs (the vllm role's <instance>.args.json):
    name, unit, port, and where it answers (as the plan's instances say it): what a gateway keeps sending to until
    the rollout has replaced it."""
    args = [str(a) for a in args] if isinstance(args, (list, tuple)) else []

    def value(flag: str, default: Any) -> Any:
        return args[args.index(flag) + 1] if flag in args[:-1] else default

    port = int(value("--port", 8000))
    bind = value("--host", "")
    address = network_address(bind, inventory_address)
    return {
        "name": str(name),
        "unit": unit_format.replace("{name}", str(name)),
        "port": port,
        "local_url": probe_url(bind, port),
        "address": address,
        "url": probe_url(address, port),
    }
