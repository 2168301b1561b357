"""The host sentinel's side on the controller: its settings checked at plan time (:func:`errors`), and the instances
of its configuration (:func:`instances`) from the host's plan entry. The sentinel itself runs on the host
(roles/vllm_sentinel/files/vllm-sentinel.py, standard library only).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .inputs import plain, short, whole

# name: (the least it may be, what it is)
WHOLE_NUMBERS = {
    "vllm_sentinel_interval_s": (1, "seconds between two rounds"),
    "vllm_sentinel_probe_timeout_s": (1, "seconds a probe may wait for its token"),
    "vllm_sentinel_failures": (1, "failed probes in a row before a heal"),
    "vllm_sentinel_heals_per_hour": (1, "heals an hour (vllm_sentinel_act: false heals none)"),
    "vllm_sentinel_health_timeout_s": (30, "seconds a heal waits for /health"),
    "vllm_sentinel_agent_interval_s": (1, "seconds between two agent checks of a gateway"),
    "vllm_sentinel_rollout_pause_s": (60, "seconds a rollout may keep the sentinel paused"),
}
PORTS = ("vllm_sentinel_agent_port", "vllm_sentinel_metrics_port")
XID_LISTS = ("vllm_sentinel_xid_reset", "vllm_sentinel_xid_reboot", "vllm_sentinel_xid_ignore")
BOOLEANS = ("vllm_sentinel", "vllm_sentinel_act")
# Every setting errors() reads (the vllm role's _vllm_sentinel_settings).
SETTINGS = (*BOOLEANS, *WHOLE_NUMBERS, *PORTS, *XID_LISTS, "vllm_sentinel_xid_journal_match")


def errors(host: str, settings: Mapping[str, Any], instance_ports: Iterable[Any] = ()) -> list[str]:
    """Each bad sentinel setting of ``host``, with its value and the fix; [] when all hold."""
    settings = plain(settings)
    out: list[str] = []

    def bad(name: str, what: str, fix: str) -> None:
        out.append("%s: %s=%s %s. Fix: %s" % (host, name, short(settings.get(name), 60), what, fix))

    for name in BOOLEANS:
        if not isinstance(settings.get(name), bool) and str(settings.get(name)).lower() not in ("true", "false"):
            bad(name, "is not true or false", "set it to true or false")
    for name, (least, what) in WHOLE_NUMBERS.items():
        number = whole(settings.get(name))
        if number is None or number < least:
            bad(name, "is not a whole number of %s of at least %d" % (what, least), "set it to %d or more" % least)
    ports: dict[str, int] = {}
    taken = {whole(p) for p in instance_ports}
    for name in PORTS:
        port = whole(settings.get(name))
        if port is None or not 1 <= port <= 65535:
            bad(name, "is not a port (1-65535)", "give a free TCP port of the host")
        elif port in taken:
            bad(name, "is also the port of one of the host's vLLM instances", "give a port no instance uses")
        elif port in ports.values():
            bad(name, "is also %s" % next(n for n, p in ports.items() if p == port), "give the two ports apart")
        else:
            ports[name] = port
    seen: dict[int, str] = {}
    for name in XID_LISTS:
        codes = settings.get(name)
        if not isinstance(codes, list) or any(whole(c) is None for c in codes):
            bad(name, "is not a list of Xid codes (whole numbers)", "list NVIDIA Xid codes, e.g. [79, 48]")
            continue
        for number in (int(c) for c in codes):
            if seen.get(number, name) != name:
                bad(name, "lists Xid %d, which %s lists too" % (number, seen[number]), "keep each code in one list")
            seen[number] = name
    match = settings.get("vllm_sentinel_xid_journal_match")
    if not isinstance(match, list) or not match or not all(isinstance(m, str) and "=" in m for m in match):
        bad(
            "vllm_sentinel_xid_journal_match",
            "is not a list of journalctl matches (FIELD=value)",
            "give e.g. [_TRANSPORT=kernel]",
        )
    return out


def instances(
    planned: Iterable[Mapping[str, Any]], served_model_name: str, unit_format: str, config_dir: str
) -> list[dict[str, Any]]:
    """The sentinel's view of the host's planned instances: where to probe each, its unit and the vllm role's files
    of it (the same names as roles/vllm/vars/main.yml), and its GPUs."""
    out = []
    for instance in planned:
        name = str(instance["name"])
        unit = str(instance.get("unit") or unit_format.replace("{name}", name))
        out.append(
            {
                "name": name,
                "unit": unit,
                "url": str(instance["local_url"]),
                "model": served_model_name,
                "gpus": [int(g) for g in instance.get("gpus") or []],
                "unit_path": "/etc/systemd/system/" + unit,
                "env_path": "%s/%s.env" % (config_dir, name),
                "args_path": "%s/%s.args.json" % (config_dir, name),
                "releases_dir": "%s/releases/%s" % (config_dir, name),
            }
        )
    return out
