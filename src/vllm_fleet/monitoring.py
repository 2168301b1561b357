"""What the monitoring hosts run, made from the plan: Prometheus' scrape targets (every vLLM instance, labelled with
its host, instance, profile, card and vLLM release; the gateways' HAProxy exporters), the shipped alert rules with
the site's pending periods, and the day-2 findings of a window that Prometheus holds (playbooks/diagnose.yml).
"""

from __future__ import annotations

import copy
from typing import Any, Iterable, Mapping

from . import metrics

# The counters the day-2 findings read (vllm_fleet.metrics.findings), without their _total suffix.
FINDING_COUNTERS = ("vllm:num_preemptions", "vllm:prefix_cache_hits", "vllm:prefix_cache_queries",
                    "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")


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
            out.append({"targets": [f"{address}:{instance['port']}"],
                        "labels": {"instance": f"{host}/{instance['name']}", "host": host,
                                   "vllm_instance": instance["name"], "profile": str(entry.get("profile") or ""),
                                   "card": str((entry.get("gpu") or {}).get("name") or ""),
                                   "vllm_release": str(entry.get("vllm_version") or "")}})
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
    return sorted(rule["alert"] for group in shipped.get("groups") or [] for rule in group.get("rules") or []
                  if rule.get("alert"))


def window_findings(increases: Mapping[str, float | None], window: str, prefix_caching: bool | None = None,
                    thresholds: Mapping[str, float] | None = None) -> list[dict[str, Any]]:
    """The day-2 findings of a window: the counters' increases over it (Prometheus' ``increase()``, one per name
    of FINDING_COUNTERS; None where the instance does not export it) judged as the rollout's verification judges
    its two scrapes (vllm_fleet.metrics.findings), each finding's ``basis`` naming the window."""
    present = {name: float(value) for name, value in increases.items() if value is not None}
    before = metrics.MetricsFacts(counters=dict.fromkeys(present, 0.0))
    after = metrics.MetricsFacts(counters=present, cache_config={"enable_prefix_caching": prefix_caching}
                                 if prefix_caching is not None else {})
    found = metrics.findings(before, after, **dict(thresholds or {}))
    for finding in found:
        finding["basis"] = f"the last {window}" if finding.get("basis") == "window" else finding.get("basis")
        finding["message"] = (finding["message"].replace("between the two scrapes", f"in the last {window}")
                              .replace(", window)", f", the last {window})"))
    return found


def increases_by_instance(results: Iterable[Mapping[str, Any]], names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Prometheus' instant-query results of ``sum by (instance) (increase(NAME_total[WINDOW]))``, one per name,
    folded into ``{instance: {name: increase}}`` (a name an instance does not export stays None)."""
    out: dict[str, dict[str, Any]] = {}
    names = list(names)
    for name, result in zip(names, results):
        for sample in ((result or {}).get("data") or {}).get("result") or []:
            instance = (sample.get("metric") or {}).get("instance")
            if instance is None:
                continue
            out.setdefault(instance, dict.fromkeys(names))[name] = float(sample["value"][1])
    return out


def series_by_instance(results: Iterable[Mapping[str, Any]], names: Iterable[str]) -> dict[str, dict[str, list]]:
    """Prometheus' range-query results (one per name) as ``{name: {instance: [[unix time, value], ...]}}``."""
    out: dict[str, dict[str, list]] = {}
    for name, result in zip(names, results):
        by_instance = out.setdefault(name, {})
        for stream in ((result or {}).get("data") or {}).get("result") or []:
            instance = (stream.get("metric") or {}).get("instance")
            if instance is not None:
                by_instance[instance] = [[float(t), float(v)] for t, v in stream.get("values") or []]
    return out
