# -*- coding: utf-8 -*-
# Parsing of nvidia-smi output for the nvidia_gpu_facts module and the unit tests.
# Standard library only: this file is shipped to the managed hosts inside the module payload.
"""Parse ``nvidia-smi --query-gpu ... --format=csv`` output and related driver files.

The module runs::

    LC_ALL=C nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits

which prints one line per GPU, fields separated by ``", "``, e.g. (a real H200)::

    0, GPU-..., NVIDIA H200, 143771, 0, 580.159.04, 9.0, 00000000:00:06.0, Enabled

The parser also accepts the ``--format=csv`` form with a header line and units
(``143771 MiB``), so that a saved human-made capture can be read the same way.
"""

from __future__ import absolute_import, division, print_function

import csv
import re

__metaclass__ = type

# The fields the module asks for, in order. The real H200 capture in
# tests/unit/fixtures/gpu/h200/query-gpu-nounits.csv was taken with exactly this list.
QUERY_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "memory.used",
    "driver_version",
    "compute_cap",
    "pci.bus_id",
    "persistence_mode",
)

# Values nvidia-smi prints when a field has no value on this GPU or driver.
_MISSING = frozenset(
    ("", "N/A", "[N/A]", "[Not Supported]", "Not Supported", "[Unknown Error]", "[Insufficient Permissions]")
)

# Units nvidia-smi appends without ``nounits`` (and names in brackets in the header).
_UNIT_RE = re.compile(r"^(?P<value>-?[0-9]+(?:\.[0-9]+)?) (?:MiB|W|MHz|%|C)$")
_HEADER_UNIT_RE = re.compile(r"\s*\[[^\]]*\]\s*$")

# First lines of nvidia-smi's error output, mapped to a status the role acts on.
_ERRORS = (
    ("nvml_mismatch", re.compile(r"Driver/library version mismatch", re.I)),
    ("driver_not_loaded", re.compile(r"couldn't communicate with the NVIDIA driver|NVIDIA driver is not loaded", re.I)),
    ("no_devices", re.compile(r"No devices were found", re.I)),
    ("no_permission", re.compile(r"Insufficient Permissions", re.I)),
)

_PROC_VERSION_RE = re.compile(
    r"NVRM version:\s+NVIDIA UNIX (?P<open>Open )?.*?Kernel Module(?: for \S+)?\s+(?P<version>[0-9]+(?:\.[0-9]+)+)"
)
_NVML_LIB_RE = re.compile(r"NVML library version:\s*(?P<version>[0-9]+(?:\.[0-9]+)+)")
_Q_HEADER_RE = re.compile(r"^(?P<key>Driver Version|CUDA Version|Attached GPUs)\s*:\s*(?P<value>\S+)\s*$")


class NvidiaSmiParseError(ValueError):
    """Raised when nvidia-smi output cannot be read; the message names the offending text."""


def query_command(nvidia_smi="nvidia-smi", fields=QUERY_FIELDS):
    """The argv that produces the CSV this module parses (run it with LC_ALL=C)."""
    return [nvidia_smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"]


def _clean(value):
    value = value.strip()
    if value in _MISSING:
        return None
    match = _UNIT_RE.match(value)
    if match:
        return match.group("value")
    return value


def parse_csv(text, fields=None):
    """Split nvidia-smi CSV output into a list of ``{field: str or None}`` rows.

    ``fields`` is the list asked for with ``--format=csv,noheader``; when it is None the
    first line must be nvidia-smi's header (``--format=csv``), whose unit suffixes
    (``memory.total [MiB]``) are dropped from the names.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if fields is None:
        if not lines:
            raise NvidiaSmiParseError("nvidia-smi printed no header line")
        fields = [_HEADER_UNIT_RE.sub("", name).strip() for name in next(csv.reader([lines[0]], skipinitialspace=True))]
        lines = lines[1:]
    fields = list(fields)
    rows = []
    for number, values in enumerate(csv.reader(lines, skipinitialspace=True), start=1):
        if len(values) != len(fields):
            raise NvidiaSmiParseError(
                "line %d of nvidia-smi output has %d fields, expected %d (%s): %r"
                % (number, len(values), len(fields), ",".join(fields), lines[number - 1])
            )
        rows.append(dict(zip(fields, [_clean(value) for value in values])))
    return rows


def _int(row, field):
    value = row.get(field)
    if value is None:
        return None
    try:
        return int(float(value))
    except ValueError as exc:
        raise NvidiaSmiParseError("%s is not a number: %r" % (field, value)) from exc


def short_name(name):
    """``NVIDIA GeForce RTX 4090`` -> ``RTX 4090``; ``NVIDIA L40`` -> ``L40``."""
    if not name:
        return name
    short = re.sub(r"^NVIDIA\s+", "", name.strip())
    short = re.sub(r"^(GeForce|Quadro|Tesla)\s+", "", short)
    return short


def mask_uuid(uuid):
    """Keep the ``GPU-`` prefix and the shape, hide the identifying digits."""
    if not uuid:
        return uuid
    return re.sub(r"[0-9a-fA-F]", "0", uuid)


def gpu_from_row(row, mask=False):
    """One GPU's facts from one parsed row (the QUERY_FIELDS names)."""
    persistence = row.get("persistence_mode")
    gpu = {
        "index": _int(row, "index"),
        "uuid": mask_uuid(row.get("uuid")) if mask else row.get("uuid"),
        "name": row.get("name"),
        "short_name": short_name(row.get("name")),
        "memory_mib": _int(row, "memory.total"),
        "memory_used_mib": _int(row, "memory.used"),
        "driver_version": row.get("driver_version"),
        "compute_cap": row.get("compute_cap"),
        "pci_bus_id": row.get("pci.bus_id"),
        "persistence_mode": None if persistence is None else persistence.lower() == "enabled",
    }
    if gpu["name"] is None or gpu["memory_mib"] is None:
        raise NvidiaSmiParseError("GPU row without a name or memory.total: %r" % (row,))
    return gpu


def summarize(gpus):
    """Host-level facts over all GPUs: what the role checks and the planner consumes."""
    drivers = sorted({gpu["driver_version"] for gpu in gpus if gpu["driver_version"]})
    names = [gpu["name"] for gpu in gpus]
    memory = [gpu["memory_mib"] for gpu in gpus]
    persistence = [gpu["persistence_mode"] for gpu in gpus]
    return {
        "count": len(gpus),
        "gpus": gpus,
        "names": names,
        "short_names": [gpu["short_name"] for gpu in gpus],
        "uuids": [gpu["uuid"] for gpu in gpus],
        "memory_mib": memory,
        "memory_mib_min": min(memory) if memory else None,
        "memory_mib_total": sum(memory),
        "driver_version": drivers[0] if len(drivers) == 1 else (",".join(drivers) or None),
        "compute_caps": sorted({gpu["compute_cap"] for gpu in gpus if gpu["compute_cap"]}),
        "persistence_mode": bool(persistence) and all(persistence),
        "homogeneous": len(set(names)) <= 1 and len(set(memory)) <= 1,
    }


_PCI_RE = re.compile(
    r"^(?:[0-9A-Fa-f]{4})?(?P<domain>[0-9A-Fa-f]{4}):(?P<bus>[0-9A-Fa-f]{2}):(?P<device>[0-9A-Fa-f]{2})"
    r"\.(?P<function>[0-7])$"
)
_MINOR_RE = re.compile(r"^Device Minor:\s*(?P<minor>[0-9]+)\s*$", re.M)


def pci_address(bus_id):
    """nvidia-smi's ``00000000:17:00.0`` as sysfs and ``/proc/driver/nvidia/gpus`` name the device:
    ``0000:17:00.0``; None for anything else."""
    match = _PCI_RE.match((bus_id or "").strip())
    if not match:
        return None
    return (
        "%s:%s:%s.%s" % (match.group("domain"), match.group("bus"), match.group("device"), match.group("function"))
    ).lower()


def topology(gpu, read):
    """Where a GPU sits, for placing work beside it: its device node's minor number (``/dev/nvidia<minor>``,
    from the driver's ``/proc/driver/nvidia/gpus/<pci>/information``; not always its nvidia-smi index), its
    NUMA node and the CPUs local to it (sysfs). ``read(kind, address)`` returns the text of ``information``,
    ``numa_node`` or ``local_cpulist`` for the device, or None; anything unreadable is None."""
    address = pci_address(gpu.get("pci_bus_id"))
    out = {"minor": None, "numa_node": None, "cpus": None}  # type: dict[str, int | str | None]
    if not address:
        return out
    match = _MINOR_RE.search(read("information", address) or "")
    if match:
        out["minor"] = int(match.group("minor"))
    node = (read("numa_node", address) or "").strip()
    if re.match(r"^[0-9]+$", node):  # -1: the platform has no NUMA information
        out["numa_node"] = int(node)
    cpus = (read("local_cpulist", address) or "").strip()
    if re.match(r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$", cpus):
        out["cpus"] = cpus
    return out


def parse_gpus(text, fields=QUERY_FIELDS, mask=False):
    """nvidia-smi CSV text -> summary dict (see summarize)."""
    return summarize([gpu_from_row(row, mask=mask) for row in parse_csv(text, fields)])


def classify_error(text):
    """Map nvidia-smi's error output to a status: nvml_mismatch, driver_not_loaded, no_devices, ... or error."""
    for status, pattern in _ERRORS:
        if pattern.search(text or ""):
            return status
    return "error"


def nvml_library_version(text):
    """The user-space NVML version newer nvidia-smi prints after a mismatch, else None."""
    match = _NVML_LIB_RE.search(text or "")
    return match.group("version") if match else None


def parse_proc_version(text):
    """``/proc/driver/nvidia/version`` -> ``{version, open}`` of the loaded kernel module, or None."""
    match = _PROC_VERSION_RE.search(text or "")
    if not match:
        return None
    return {"version": match.group("version"), "open": bool(match.group("open"))}


def parse_query_header(text):
    """The header of ``nvidia-smi -q``: driver version, the CUDA version the driver supports, GPU count."""
    found = {}  # type: dict[str, str]
    for line in (text or "").splitlines():
        match = _Q_HEADER_RE.match(line.strip())
        if match:
            found.setdefault(match.group("key"), match.group("value"))
        if line.startswith("GPU "):
            break
    attached = found.get("Attached GPUs")
    return {
        "driver_version": found.get("Driver Version"),
        "cuda_version": found.get("CUDA Version"),
        "attached_gpus": int(attached) if attached and attached.isdigit() else None,
    }


def version_tuple(version):
    """``580.65.06`` -> (580, 65, 6); non-numeric parts end the tuple."""
    parts = []
    for part in str(version).split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def version_at_least(version, minimum):
    """True when driver ``version`` >= ``minimum`` (both dotted numbers)."""
    return version_tuple(version) >= version_tuple(minimum)
