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
