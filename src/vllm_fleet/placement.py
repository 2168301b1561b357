"""Placement: a host's GPUs into vLLM instances, one per GPU or one per tensor-parallel group.

The planner sizes one instance (:mod:`vllm_fleet.planner`); this module decides how many run on the host and on
which cards, and what each needs of its own so that instances never share a card, a port or a folder:

- the cards: the nvidia_driver role's detected list (``nvidia_driver_gpus.gpus``: index, UUID, device minor,
  NUMA node and local CPUs), else ``vllm_gpu.count`` cards of the group's assumed kind;
- the groups: consecutive cards, ``tensor_parallel_size`` at a time (the planner picks the size when the
  profile does not: the smallest of 1, 2, 4, 8 at which the model fits one group's cards); cards left over
  when the count is not a multiple stay idle, with a warning;
- the cards it may use: all, or those ``vllm_gpus`` names (the others are left to other work);
- per instance: its name (the host's ``vllm_instance`` on a host with one card, else ``gpu<i>`` or ``tp<a>-<b>``
  after its cards, ``cpu<i>`` for the CPU build's slots) and its port (``vllm_port`` plus its first card's index
  divided by the group's size): a card's instance keeps both when another card leaves the placement; its cards
  (``CUDA_VISIBLE_DEVICES`` by UUID where the driver role read them, else by PCI order), the device nodes
  its unit may open, its CPUs and NUMA node where all its cards share one, and what the card needs for
  tensor parallelism (:data:`TP_NEEDS`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import endpoints

TP_SIZES = (1, 2, 4, 8)
# Every NVIDIA device node a CUDA process needs besides its own cards' /dev/nvidia<minor>.
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")

# What a card needs once an instance spans several of them, and why: environment and vLLM arguments.
TP_NEEDS = (
    (
        re.compile(r"\bRTX\s*40[0-9]0\b|\bGeForce\b", re.I),
        {
            "environment": {"NCCL_P2P_DISABLE": "1"},
            "args": {},
            "why": "GeForce cards have no peer-to-peer over PCIe: NCCL's P2P transport hangs tensor parallelism on "
            "RTX 4090s unless it is off (NCCL_P2P_DISABLE=1; NCCL goes through host memory)",
        },
    ),
    (
        re.compile(r"\bL40S?\b", re.I),
        {
            "environment": {},
            "args": {"disable_custom_all_reduce": True},
            "why": "vLLM's custom all-reduce has hung on L40S cards (PCIe, no NVLink); NCCL's all-reduce is used "
            "instead (--disable-custom-all-reduce)",
        },
    ),
)


@dataclass
class Card:
    """One GPU as the placement sees it (a CPU build's slot has only an index)."""

    index: int
    name: str = ""
    memory_mib: int | None = None
    uuid: str = ""
    minor: int | None = None
    numa_node: int | None = None
    cpus: str = ""
    compute_cap: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def cards(gpu: Mapping[str, Any], detected: Any = None) -> list[Card]:
    """The host's cards: the detected list when the driver role read one, else vllm_gpu.count of the assumed
    card (a CPU host's count is its number of slots, at least one)."""
    if isinstance(detected, list) and detected:
        out = []
        for position, item in enumerate(detected):
            item = item if isinstance(item, Mapping) else {}
            out.append(
                Card(
                    index=_int(item.get("index"), position),
                    name=str(item.get("name") or ""),
                    memory_mib=_int(item.get("memory_mib"), None),
                    uuid=str(item.get("uuid") or ""),
                    minor=_int(item.get("minor"), None),
                    numa_node=_int(item.get("numa_node"), None),
                    cpus=str(item.get("cpus") or ""),
                    compute_cap=str(item.get("compute_cap") or ""),
                )
            )
        return sorted(out, key=lambda c: c.index)
    given = gpu.get("count")
    count = given if isinstance(given, int) and not isinstance(given, bool) else 1
    return [
        Card(index=i, name=str(gpu.get("name") or ""), memory_mib=gpu.get("memory_mib")) for i in range(max(count, 1))
    ]


def _int(value: Any, default: Any) -> Any:
    if isinstance(value, bool):
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def select(host: str, host_cards: list[Card], wanted: Any) -> tuple[list[Card], list[str]]:
    """The cards vllm_gpus lets vLLM use (all when it names none), and what is wrong with it."""
    if wanted in (None, [], ()):
        return host_cards, []
    known = [c.index for c in host_cards]
    if not isinstance(wanted, (list, tuple)) or any(isinstance(i, bool) or not isinstance(i, int) for i in wanted):
        return host_cards, [
            f"{host}: vllm_gpus={wanted!r} must be a list of card indices; fix: for example [0, 1] "
            f"(the host has {', '.join(map(str, known))})"
        ]
    unknown = [i for i in wanted if i not in known]
    if unknown or len(set(wanted)) != len(wanted):
        return host_cards, [
            f"{host}: vllm_gpus={list(wanted)!r} names "
            + (f"card(s) {', '.join(map(str, unknown))} the host does not have" if unknown else "a card twice")
            + f" (it has {len(known)}: {', '.join(map(str, known))}); fix: indices of its cards, "
            "each once (nvidia-smi -L lists them)"
        ]
    return [c for c in host_cards if c.index in wanted], []


def mixed_group_errors(host: str, groups: list[list[Card]]) -> list[str]:
    """A tensor-parallel group runs at the pace of its slowest card and sizes by its smallest: refuse mixed ones."""
    errors = []
    for group in groups:
        kinds = {(c.name, c.memory_mib) for c in group}
        if len(kinds) > 1:
            listed = ", ".join(f"{c.index}: {c.name} ({c.memory_mib} MiB)" for c in group)
            errors.append(
                f"{host}: the tensor-parallel group of GPUs {', '.join(str(c.index) for c in group)} mixes "
                f"cards ({listed}): vLLM splits the model evenly, so the group runs at its slowest card and "
                "fits its smallest; fix: cards of one kind per group (order the host's cards, or set "
                "tensor_parallel_size so that groups do not straddle kinds)"
            )
    return errors


def groups(host_cards: list[Card], tp: int) -> tuple[list[list[Card]], list[Card]]:
    """Consecutive groups of `tp` cards, and the cards left over."""
    usable = len(host_cards) // tp * tp
    return [host_cards[i : i + tp] for i in range(0, usable, tp)], host_cards[usable:]


def instance_name(group: list[Card], tp: int, one_card: bool, base_name: str, device: str) -> str:
    if one_card:
        return base_name
    if device == "cpu":
        return f"cpu{group[0].index}"
    if tp == 1:
        return f"gpu{group[0].index}"
    return f"tp{group[0].index}-{group[-1].index}"


def tp_needs(gpu_name: str, tp: int) -> dict[str, Any]:
    """What the card needs for tensor parallelism ({environment, args, why}); nothing for one card."""
    if tp < 2:
        return {"environment": {}, "args": {}, "why": ""}
    for pattern, needs in TP_NEEDS:
        if pattern.search(gpu_name or ""):
            return needs
    return {"environment": {}, "args": {}, "why": ""}


def place(
    host: str,
    host_cards: list[Card],
    tp: int,
    *,
    device: str,
    base_name: str,
    base_port: int,
    unit_format: str,
    bind: Any,
    inventory_address: str,
    one_card: bool,
) -> dict[str, Any]:
    """The host's instances for tensor_parallel_size `tp` on `host_cards` (`one_card`: the host has no other card, so
    its instance takes `base_name`): {"instances": [...], "errors": [...], "warnings": [...]}.
    Each instance: name, unit, port, local_url, address, url, gpus (indices), tensor_parallel_size, and on GPU
    hosts environment (CUDA_VISIBLE_DEVICES...), devices, numa_node and cpus."""
    if device == "cpu":
        tp = 1
    grouped, idle = groups(host_cards, tp)
    errors = mixed_group_errors(host, grouped) if device == "gpu" else []
    warnings = []
    if idle and grouped and device == "gpu":
        warnings.append(
            f"{host}: GPU(s) {', '.join(str(c.index) for c in idle)} stay idle: {len(host_cards)} GPUs in "
            f"groups of tensor_parallel_size={tp}; fix: a tensor_parallel_size that divides "
            f"{len(host_cards)}, or accept the idle cards"
        )
    address = endpoints.network_address(bind, inventory_address)
    by_uuid = uuids_usable(host_cards)
    out = []
    for group in grouped:
        name = instance_name(group, tp, one_card, base_name, device)
        # By its first card, not its place in the list: an instance keeps its port when another card leaves.
        port = base_port + group[0].index // tp
        instance: dict[str, Any] = {
            "name": name,
            "unit": unit_format.replace("{name}", name),
            "port": port,
            "local_url": endpoints.probe_url(bind, port),
            "address": address,
            "url": endpoints.probe_url(address, port),
            "gpus": [c.index for c in group],
            "tensor_parallel_size": tp,
        }
        if device == "gpu":
            instance.update(_gpu_side(group, by_uuid))
        out.append(instance)
    return {"instances": out, "errors": errors, "warnings": warnings}


def uuids_usable(cards: list[Card]) -> bool:
    """Whether the host's instances name their cards by UUID: only when every card has its own, unmasked one (a
    capture made with nvidia_gpu_facts' mask_uuids has only zeros). One rule per host, so that no two instances
    of a host count cards differently."""
    uuids = [c.uuid for c in cards]
    return bool(uuids) and all(u and not re.fullmatch(r"GPU-[0-]+", u) for u in uuids) and len(set(uuids)) == len(uuids)


def _gpu_side(group: list[Card], by_uuid: bool) -> dict[str, Any]:
    """CUDA_VISIBLE_DEVICES (by UUID when `by_uuid`, else by PCI order), the device nodes and the CPUs of one
    instance's cards."""
    environment = (
        {"CUDA_VISIBLE_DEVICES": ",".join(c.uuid for c in group)}
        if by_uuid
        # nvidia-smi numbers cards in PCI order; CUDA's own default order is fastest first.
        else {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(str(c.index) for c in group)}
    )
    minors = [c.minor if c.minor is not None else c.index for c in group]
    nodes = {c.numa_node for c in group}
    numa = nodes.pop() if len(nodes) == 1 and None not in nodes and -1 not in nodes else None
    cpus = group[0].cpus if numa is not None and len({c.cpus for c in group}) == 1 else ""
    return {
        "environment": environment,
        "gpu_uuids": [c.uuid for c in group if c.uuid],
        "devices": list(CONTROL_DEVICES) + [f"/dev/nvidia{m}" for m in minors],
        "numa_node": numa,
        "cpus": cpus,
    }
