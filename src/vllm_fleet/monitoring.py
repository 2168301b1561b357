"""What the monitoring hosts run, made from the plan: Prometheus' scrape targets (every vLLM instance, labelled with
its host, instance, profile, card and vLLM release; the gateways' HAProxy exporters), the shipped alert rules with
the site's pending periods, and the day-2 findings of a window that Prometheus holds (playbooks/diagnose.yml); and
the plan-time checks of a monitoring host's settings (``check``, the role's preflight).
"""

from __future__ import annotations

import copy
import ipaddress
import re
from collections.abc import Iterable, Mapping
from typing import Any

from . import inputs, metrics

# The counters the day-2 findings read (vllm_fleet.metrics.findings), without their _total suffix.
FINDING_COUNTERS = (
    "vllm:num_preemptions",
    "vllm:prefix_cache_hits",
    "vllm:prefix_cache_queries",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)


def targets(plans: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One Prometheus static_configs entry per planned instance, sorted: ``{"targets": ["address:port"],
    "labels": {instance, host, vllm_instance, profile, card, vllm_release}}``. ``instance`` (Prometheus' own
    label, which would be the address) is ``host/instance``, as the reports name it."""
    out = []
    for host in sorted(plans):
        entry = plans[host] or {}
        for instance in entry.get("instances") or []:
            address = str(instance["address"])
            address = f"[{address}]" if ":" in address and not address.startswith("[") else address
            out.append(
                {
                    "targets": [f"{address}:{instance['port']}"],
                    "labels": {
                        "instance": f"{host}/{instance['name']}",
                        "host": host,
                        "vllm_instance": instance["name"],
                        "profile": str(entry.get("profile") or ""),
                        "card": str((entry.get("gpu") or {}).get("name") or ""),
                        "vllm_release": str(entry.get("vllm_version") or ""),
                    },
                }
            )
    return out


# The vllm_gateway role's default exporter port (roles/vllm_gateway/defaults/main.yml), for a gateway whose inventory
# sets none (role defaults are not in another host's hostvars).
GATEWAY_METRICS_PORT = 8405


def gateway_targets(gateways: Iterable[Mapping[str, Any]]) -> list[str]:
    """Each gateway's HAProxy exporter as ``address:port`` (its ansible_host, [v6] bracketed; its
    vllm_gateway_metrics_port or the role's default)."""
    out = []
    for values in gateways:
        address = str(values.get("ansible_host") or values.get("inventory_hostname") or "")
        if not address:
            continue
        address = f"[{address}]" if ":" in address and not address.startswith("[") else address
        out.append(f"{address}:{int(values.get('vllm_gateway_metrics_port') or GATEWAY_METRICS_PORT)}")
    return out


def rules(shipped: Mapping[str, Any], pending: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The shipped rule groups with each alert's ``for:`` replaced where `pending` names the alert (a site
    that wants a page sooner, the lab that cannot wait 15 minutes); every other field as shipped."""
    pending = dict(pending or {})
    out = copy.deepcopy(dict(shipped))
    known = set()
    for group in out.get("groups") or []:
        for rule in group.get("rules") or []:
            name = rule.get("alert")
            if name:
                known.add(name)
                if name in pending:
                    rule["for"] = str(pending[name])
    unknown = sorted(set(pending) - known)
    if unknown:
        raise ValueError(f"no shipped alert is named {', '.join(unknown)} (the alerts: {', '.join(sorted(known))})")
    return out


def alert_names(shipped: Mapping[str, Any]) -> list[str]:
    return sorted(
        rule["alert"] for group in shipped.get("groups") or [] for rule in group.get("rules") or [] if rule.get("alert")
    )


def window_findings(
    increases: Mapping[str, float | None],
    window: str,
    prefix_caching: bool | None = None,
    thresholds: Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    """The day-2 findings of a window: the counters' increases over it (Prometheus' ``increase()``, one per name
    of FINDING_COUNTERS; None where the instance does not export it) judged as the rollout's verification judges
    its two scrapes (vllm_fleet.metrics.findings), each finding's ``basis`` naming the window."""
    present = {name: float(value) for name, value in increases.items() if value is not None}
    before = metrics.MetricsFacts(counters=dict.fromkeys(present, 0.0))
    after = metrics.MetricsFacts(
        counters=present, cache_config={"enable_prefix_caching": prefix_caching} if prefix_caching is not None else {}
    )
    found = metrics.findings(before, after, **dict(thresholds or {}))
    for finding in found:
        finding["basis"] = f"the last {window}" if finding.get("basis") == "window" else finding.get("basis")
        finding["message"] = (
            finding["message"]
            .replace("between the two scrapes", f"in the last {window}")
            .replace(", window)", f", the last {window})")
        )
    return found


def increases_by_instance(results: Iterable[Mapping[str, Any]], names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Prometheus' instant-query results of ``sum by (instance) (increase(NAME_total[WINDOW]))``, one per name,
    folded into ``{instance: {name: increase}}`` (a name an instance does not export stays None)."""
    out: dict[str, dict[str, Any]] = {}
    names = list(names)
    for name, result in zip(names, results, strict=False):
        for sample in ((result or {}).get("data") or {}).get("result") or []:
            instance = (sample.get("metric") or {}).get("instance")
            if instance is None:
                continue
            out.setdefault(instance, dict.fromkeys(names))[name] = float(sample["value"][1])
    return out


def series_by_instance(results: Iterable[Mapping[str, Any]], names: Iterable[str]) -> dict[str, dict[str, list[Any]]]:
    """Prometheus' range-query results (one per name) as ``{name: {instance: [[unix time, value], ...]}}``."""
    out: dict[str, dict[str, list[Any]]] = {}
    for name, result in zip(names, results, strict=False):
        by_instance = out.setdefault(name, {})
        for stream in ((result or {}).get("data") or {}).get("result") or []:
            instance = (stream.get("metric") or {}).get("instance")
            if instance is not None:
                by_instance[instance] = [[float(t), float(v)] for t, v in stream.get("values") or []]
    return out


# --- Plan-time checks of a monitoring host's settings (roles/vllm_monitoring/tasks/preflight.yml) ------------------

# Every setting ``check`` reads; the filter plugin fills the role's defaults where the inventory is silent.
SETTINGS = (
    "vllm_monitoring_packages",
    "vllm_monitoring_listen_address",
    "vllm_monitoring_prometheus_port",
    "vllm_monitoring_alertmanager_port",
    "vllm_monitoring_allow",
    "vllm_monitoring_backend_group",
    "vllm_monitoring_node_exporters",
    "vllm_monitoring_scrape_interval",
    "vllm_monitoring_evaluation_interval",
    "vllm_monitoring_retention_time",
    "vllm_monitoring_retention_size",
    "vllm_monitoring_alert_pending",
    "vllm_monitoring_receivers",
    "vllm_monitoring_route",
    "vllm_monitoring_smtp_smarthost",
    "vllm_monitoring_smtp_from",
    "vllm_monitoring_smtp_auth_username",
    "vllm_monitoring_smtp_auth_password",
    "vllm_monitoring_resolve_timeout",
    "vllm_monitoring_mirror_check",
    "vllm_monitoring_mirror_check_calendar",
    "vllm_monitoring_mirror_check_timeout_s",
    "vllm_monitoring_mirror_check_stale_after_s",
    "vllm_monitoring_mirror_check_port",
    "vllm_signed_manifest_url",
    "vllm_signed_manifest_public_key",
)
BOOLEANS = {True: True, False: False, "true": True, "false": False, "yes": True, "no": False}
# Prometheus' and Alertmanager's durations (their model.ParseDuration): units largest first, each at most once.
DURATION = re.compile(
    r"(?:([0-9]+)y)?(?:([0-9]+)w)?(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?"
    r"(?:([0-9]+)ms)?"
)
_UNIT_SECONDS = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)
SIZE = re.compile(r"[0-9]+(B|KB|MB|GB|TB|PB|EB)")
LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RECEIVER = re.compile(r"[A-Za-z0-9_.-]+")
URL = re.compile(r"https?://[^\s]+")
ADDRESS = re.compile(r"[^@\s]+@[^@\s]+")
HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})")
# The durations that must be at least 1 s (0 is nonsense there: Prometheus or Alertmanager refuse it, or it would
# mean never), with the default as the fix; group_wait and an alert's pending period (for) may be 0 (at once).
POSITIVE_DURATIONS = {
    "vllm_monitoring_scrape_interval": ("15s", "Prometheus refuses a scrape interval of 0"),
    "vllm_monitoring_evaluation_interval": ("15s", "the rules would never be evaluated"),
    "vllm_monitoring_retention_time": ("15d", "Prometheus would keep its default, 15d, not what is written"),
    "vllm_monitoring_resolve_timeout": ("5m", "an alert without an end would resolve at once"),
}
ROUTE_DURATIONS = {"group_wait": ("30s", False), "group_interval": ("5m", True), "repeat_interval": ("4h", True)}
ROUTE_KEYS = ("receiver", "group_by", "group_wait", "group_interval", "repeat_interval", "routes")
RECEIVER_KEYS = ("name", "webhook_url", "email_to")


def seconds(value: Any) -> float | None:
    """A Prometheus duration (15s, 1h30m, 2w) in seconds; None when it is not one."""
    if not isinstance(value, str) or not value:
        return None
    if value == "0":
        return 0.0
    found = DURATION.fullmatch(value)
    if not found:
        return None
    return sum(int(n) * unit for n, unit in zip(found.groups(), _UNIT_SECONDS, strict=True) if n is not None)


def _control(host: str, name: str, value: Any, secret: bool = False) -> list[str]:
    """A control or format character in a string that reaches prometheus.yml, alertmanager.yml or the services'
    flags: a newline would add a line (or a setting) of its own, an invisible character a value no one can read."""
    if not isinstance(value, str) or not inputs.CONTROL.search(value):
        return []
    shown = " (value not shown)" if secret else f"={inputs.short(value)}"
    return [
        f"{host}: {name}{shown} holds a control or format character (a line break, an invisible character); "
        "fix: remove it" + (" and encrypt the value again with ansible-vault" if secret else "")
    ]


def _strings(host: str, name: str, value: Any, secret: bool = False) -> list[str]:
    """_control over every string of a setting, lists and mappings (keys too) included, naming where it is."""
    if isinstance(value, Mapping):
        errors = []
        for key, item in value.items():
            errors += _control(host, f"{name} key", key) or _strings(host, f"{name}.{key}", item, secret)
        return errors
    if isinstance(value, (list, tuple)):
        return [e for index, item in enumerate(value) for e in _strings(host, f"{name}[{index}]", item, secret)]
    return _control(host, name, value, secret)


def _duration(host: str, name: str, value: Any, default: str, positive: bool, zero: str = "") -> list[str]:
    number = seconds(value)
    if number is None:
        return [
            f"{host}: {name}={inputs.short(value)} is not a duration (a number and a unit: ms, s, m, h, d, w, y; "
            f"e.g. 1h30m); fix: e.g. {default}"
        ]
    if positive and number < 1:
        return [
            f"{host}: {name}={inputs.short(value)} must be at least 1s ({zero or 'zero means never'}); "
            f"fix: e.g. {default}"
        ]
    return []


def _whole_number(value: Any) -> int | None:
    """A whole number given as one or as its digits (a port, seconds); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    return int(value) if isinstance(value, str) and re.fullmatch(r"[0-9]+", value) else None


def _receivers(host: str, receivers: Any, smtp: bool) -> tuple[list[str], list[str]]:
    """(errors, names) of vllm_monitoring_receivers; a webhook URL is never shown (it may hold a token)."""
    if receivers is None:
        return [], []
    if not isinstance(receivers, (list, tuple)):
        return [
            f"{host}: vllm_monitoring_receivers must be a list of {{name, webhook_url}} or {{name, email_to}}; "
            "fix: e.g. [{name: ops, email_to: ops@example.org}]"
        ], []
    errors, names = [], []
    for index, receiver in enumerate(receivers):
        where = f"{host}: vllm_monitoring_receivers[{index}]"
        if not isinstance(receiver, Mapping):
            errors.append(
                f"{where} is not a mapping; fix: {{name: NAME, webhook_url: URL}} or {{name: NAME, "
                "email_to: ADDRESS}}"
            )
            continue
        unknown = sorted(str(k) for k in receiver if k not in RECEIVER_KEYS)
        if unknown:
            errors.append(f"{where} has unknown keys {unknown}; fix: only name and one of webhook_url or email_to")
        name = receiver.get("name")
        found = _control(host, f"vllm_monitoring_receivers[{index}].name", name)
        if found:
            errors += found
        elif not (isinstance(name, str) and RECEIVER.fullmatch(name)):
            errors.append(f"{where}.name={inputs.short(name)} must be letters, digits and ._-; fix: e.g. ops")
        elif name in names:
            errors.append(f"{where}.name={name!r} is given twice (Alertmanager refuses it); fix: one receiver per name")
        else:
            names.append(name)
        if ("webhook_url" in receiver) == ("email_to" in receiver):
            errors.append(
                f"{where} (name {inputs.short(name)}) must have exactly one of webhook_url or email_to; "
                "fix: one receiver per destination"
            )
        if "webhook_url" in receiver:
            url = receiver["webhook_url"]
            found = _control(host, f"vllm_monitoring_receivers[{index}].webhook_url", url, secret=True)
            if found:
                errors += found
            elif not (isinstance(url, str) and URL.fullmatch(url)):
                errors.append(
                    f"{where}.webhook_url (value not shown: it may hold a token) is not an http(s) URL "
                    "without spaces; fix: the receiver's URL, e.g. https://chat.example.org/hooks/..., "
                    "from Ansible Vault when it holds a token"
                )
        if "email_to" in receiver:
            to = receiver["email_to"]
            found = _control(host, f"vllm_monitoring_receivers[{index}].email_to", to)
            if found:
                errors += found
            elif not (isinstance(to, str) and ADDRESS.fullmatch(to)):
                errors.append(
                    f"{where}.email_to={inputs.short(to)} is not an e-mail address; fix: e.g. ops@example.org"
                )
            if not smtp:
                errors.append(
                    f"{where}.email_to needs vllm_monitoring_smtp_smarthost and vllm_monitoring_smtp_from, "
                    "which are empty; fix: the site's SMTP relay (host:port) and the sender's address"
                )
    return errors, names


def _route(host: str, route: Any, names: list[str], name: str = "vllm_monitoring_route") -> list[str]:
    if route is None:
        return []
    if not isinstance(route, Mapping):
        return [f"{host}: {name}={inputs.short(route)} must be a mapping; fix: e.g. {{receiver: ops, group_wait: 30s}}"]
    errors = _strings(host, name, route)
    if errors:
        return errors
    top = name == "vllm_monitoring_route"
    unknown = sorted(str(k) for k in route if k not in ROUTE_KEYS) if top else []
    if unknown:
        errors.append(
            f"{host}: {name} has unknown keys {unknown}, which the role does not write; fix: only "
            f"{', '.join(ROUTE_KEYS)} (child routes under routes)"
        )
    receiver = route.get("receiver")
    if (receiver is not None or not top) and receiver not in names:
        errors.append(
            f"{host}: {name}.receiver={inputs.short(receiver)} is not one of vllm_monitoring_receivers "
            f"({', '.join(names) or 'none'}); fix: the name of one of them"
        )
    for key, (default, positive) in ROUTE_DURATIONS.items():
        if route.get(key) is not None:
            errors += _duration(
                host, f"{name}.{key}", route[key], default, positive, "Alertmanager refuses 0" if positive else ""
            )
    group_by = route.get("group_by")
    if group_by is not None and (
        not isinstance(group_by, (list, tuple))
        or not all(isinstance(label, str) and (label == "..." or LABEL.fullmatch(label)) for label in group_by)
    ):
        errors.append(
            f"{host}: {name}.group_by={inputs.short(group_by)} must be a list of label names (or ['...']); "
            "fix: e.g. [alertname, instance]"
        )
    routes = route.get("routes")
    if routes is not None and not isinstance(routes, (list, tuple)):
        errors.append(
            f"{host}: {name}.routes must be a list of routes; fix: e.g. [{{receiver: ops, matchers: "
            "['severity=\"warning\"']}]"
        )
    for index, child in enumerate(routes if isinstance(routes, (list, tuple)) else []):
        errors += _route(host, child, names, f"{name}.routes[{index}]")
    return errors


def check(host: str, values: Mapping[str, Any]) -> list[str]:
    """The errors of a monitoring host's settings (``values``: those of SETTINGS it has), each naming the host, the
    setting, its value (never a secret's: a webhook URL may hold a token, the SMTP password) and the fix."""
    errors: list[str] = []
    unsafe = set()
    for name in SETTINGS:
        if name in ("vllm_monitoring_receivers", "vllm_monitoring_route"):
            continue  # checked entry by entry below, a webhook URL not shown
        found = _strings(host, name, values.get(name), secret=inputs.is_secret(name, {}))
        unsafe |= {name} if found else set()
        errors += found
    ports = {}
    for name, default_port in (("vllm_monitoring_prometheus_port", 9090), ("vllm_monitoring_alertmanager_port", 9093)):
        value = values.get(name)
        if value is None:
            continue
        port = _whole_number(value)
        if port is None or not 1 <= port <= 65535:
            errors.append(
                f"{host}: {name}={inputs.short(value)} must be a port number from 1 to 65535; fix: e.g. {default_port}"
            )
        else:
            ports[name] = port
    if len(ports) == 2 and len(set(ports.values())) == 1:
        errors.append(
            f"{host}: vllm_monitoring_prometheus_port and vllm_monitoring_alertmanager_port are both "
            f"{ports['vllm_monitoring_prometheus_port']}; fix: two different ports, e.g. 9090 and 9093"
        )
    address = values.get("vllm_monitoring_listen_address")
    if address is not None and "vllm_monitoring_listen_address" not in unsafe:
        try:
            ipaddress.ip_address(str(address))
        except ValueError:
            errors.append(
                f"{host}: vllm_monitoring_listen_address={inputs.short(address)} is not an IP address; "
                "fix: the host's address, or 0.0.0.0 for every interface"
            )
    if values.get("vllm_monitoring_allow") is not None and "vllm_monitoring_allow" not in unsafe:
        try:
            inputs.networks(host, "vllm_monitoring_allow", values["vllm_monitoring_allow"])
        except ValueError as exc:
            errors.append(str(exc))
    group = values.get("vllm_monitoring_backend_group")
    if group is not None and not (isinstance(group, str) and group.strip()):
        errors.append(
            f"{host}: vllm_monitoring_backend_group={inputs.short(group)} must name an inventory group; fix: vllm_nodes"
        )
    exporters = values.get("vllm_monitoring_node_exporters")
    if exporters is not None and "vllm_monitoring_node_exporters" not in unsafe:
        if not isinstance(exporters, (list, tuple)):
            errors.append(
                f"{host}: vllm_monitoring_node_exporters={inputs.short(exporters)} must be a list of "
                "host:port; fix: e.g. ['10.0.0.11:9100']"
            )
        else:
            for index, target in enumerate(exporters):
                matched = HOST_PORT.fullmatch(target) if isinstance(target, str) else None
                if not matched or not 1 <= int(matched.group(2)) <= 65535:
                    errors.append(
                        f"{host}: vllm_monitoring_node_exporters[{index}]={inputs.short(target)} is not "
                        "host:port; fix: e.g. 10.0.0.11:9100 or [fd00::11]:9100"
                    )
    for name, (default, zero) in POSITIVE_DURATIONS.items():
        if values.get(name) is not None and name not in unsafe:
            errors += _duration(host, name, values[name], default, True, zero)
    size = values.get("vllm_monitoring_retention_size")
    if (
        size is not None
        and "vllm_monitoring_retention_size" not in unsafe
        and not (isinstance(size, str) and SIZE.fullmatch(size))
    ):
        errors.append(
            f"{host}: vllm_monitoring_retention_size={inputs.short(size)} is not a size (a number and B, "
            "KB, MB, GB, TB, PB or EB); fix: e.g. 20GB"
        )
    pending = values.get("vllm_monitoring_alert_pending")
    if pending is not None and "vllm_monitoring_alert_pending" not in unsafe:
        if not isinstance(pending, Mapping):
            errors.append(
                f"{host}: vllm_monitoring_alert_pending={inputs.short(pending)} must be a mapping of alert "
                "name to pending period; fix: e.g. {VllmInstanceDown: 1m}"
            )
        else:
            # 0s is a choice there: the alert fires at its first evaluation.
            for alert, period in pending.items():
                errors += _duration(host, f"vllm_monitoring_alert_pending.{alert}", period, "5m", False)
    smarthost = values.get("vllm_monitoring_smtp_smarthost") or ""
    sender = values.get("vllm_monitoring_smtp_from") or ""
    if (
        smarthost
        and "vllm_monitoring_smtp_smarthost" not in unsafe
        and not (isinstance(smarthost, str) and HOST_PORT.fullmatch(smarthost))
    ):
        errors.append(
            f"{host}: vllm_monitoring_smtp_smarthost={inputs.short(smarthost)} is not host:port; fix: the "
            "site's SMTP relay, e.g. smtp.example.org:587"
        )
    if (
        sender
        and "vllm_monitoring_smtp_from" not in unsafe
        and not (isinstance(sender, str) and ADDRESS.fullmatch(sender))
    ):
        errors.append(
            f"{host}: vllm_monitoring_smtp_from={inputs.short(sender)} is not an e-mail address; fix: e.g. "
            "alerts@example.org"
        )
    found, names = _receivers(host, values.get("vllm_monitoring_receivers"), bool(smarthost and sender))
    errors += found
    errors += _route(host, values.get("vllm_monitoring_route"), names)
    errors += _mirror_check(host, values, ports)
    return errors


def mirror_check_on(values: Mapping[str, Any]) -> bool | None:
    """Whether a monitoring host checks the mirror (vllm_monitoring_mirror_check; unset: wherever the site signs,
    vllm_signed_manifest_url), None when the setting is not a boolean."""
    setting = values.get("vllm_monitoring_mirror_check")
    if setting is None:
        return bool(values.get("vllm_signed_manifest_url"))
    return BOOLEANS.get(setting.lower() if isinstance(setting, str) else setting)


def _mirror_check(host: str, values: Mapping[str, Any], ports: Mapping[str, int]) -> list[str]:
    """The mirror's check: a boolean, the signed manifest it needs (inputs' own check of the URL and key), its port
    apart from Prometheus' and Alertmanager's, and whole seconds."""
    on = mirror_check_on(values)
    if on is None:
        return [
            f"{host}: vllm_monitoring_mirror_check={inputs.short(values.get('vllm_monitoring_mirror_check'))} is not "
            "a boolean; fix: true or false"
        ]
    if not on:
        return []
    if not values.get("vllm_signed_manifest_url"):
        return [
            f"{host}: vllm_monitoring_mirror_check is true but vllm_signed_manifest_url is empty for this host: the "
            "check compares the mirror with the manifest the site signed; fix: set vllm_signed_manifest_url and "
            "vllm_signed_manifest_public_key for this host too (group_vars/all), or vllm_monitoring_mirror_check: false"
        ]
    errors = inputs.signed_settings(host, values)
    port = values.get("vllm_monitoring_mirror_check_port")
    if port is not None:
        number = _whole_number(port)
        if number is None or not 1 <= number <= 65535:
            errors.append(
                f"{host}: vllm_monitoring_mirror_check_port={inputs.short(port)} must be a port number from 1 to "
                "65535; fix: e.g. 9174"
            )
        elif number in ports.values():
            taken = next(name for name, value in ports.items() if value == number)
            errors.append(
                f"{host}: vllm_monitoring_mirror_check_port={number} is {taken}'s port too; fix: another, e.g. 9174"
            )
    for name, default in (
        ("vllm_monitoring_mirror_check_timeout_s", 60),
        ("vllm_monitoring_mirror_check_stale_after_s", 93600),
    ):
        value = values.get(name)
        seconds_given = _whole_number(value)
        if value is not None and (seconds_given is None or seconds_given < 1):
            errors.append(
                f"{host}: {name}={inputs.short(value)} must be a whole number of seconds, at least 1; "
                f"fix: e.g. {default}"
            )
    calendar = values.get("vllm_monitoring_mirror_check_calendar")
    if calendar is not None and not (isinstance(calendar, str) and calendar.strip()):
        errors.append(
            f"{host}: vllm_monitoring_mirror_check_calendar={inputs.short(calendar)} must be a systemd calendar; "
            "fix: e.g. daily"
        )
    return errors
