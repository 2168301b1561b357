# Thin Ansible filters over vllm_fleet.upgrade: the go/no-go of a release change on the rollout's canary instance.
from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from functools import cache

import yaml
from ansible.errors import AnsibleFilterError

# The library of this checkout, beside the plugin (never another installed copy): every filter plugin loads it so.
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
from vllm_fleet import upgrade as _upgrade
from vllm_fleet.inputs import plain as _plain
from vllm_fleet.inputs import short as _short

# The checkout's shipped dashboard and alert rules (the vllm_monitoring role installs these files).
ROOTDIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MONITORING_FILES = os.path.join(ROOTDIR, "roles", "vllm_monitoring", "files")
DASHBOARD = os.path.join(MONITORING_FILES, "grafana-vllm-fleet.json")
ALERT_RULES = os.path.join(MONITORING_FILES, "vllm-alerts.yml")


@cache
def shipped_consumers():
    """(the dashboard, the alert rules), parsed; AnsibleFilterError names a file that cannot be read."""
    loaded = []
    for path, load in ((DASHBOARD, json.load), (ALERT_RULES, yaml.safe_load)):
        try:
            with open(path, encoding="utf-8") as handle:
                loaded.append(load(handle))
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise AnsibleFilterError(f"vllm_upgrade_report: cannot read the shipped {path}: {exc}") from exc
    return tuple(loaded)


def _flag(name, value):
    """A boolean argument as Ansible may pass it (a bool, or the text of one)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0", "", "none"):
        return False
    raise AnsibleFilterError(f"vllm_upgrade_report: {name} must be true or false, got {_short(value)}")


def vllm_upgrade_report(old, new, extra_required=None, limits=None, speculative=False):
    old, new = _plain(old), _plain(new)
    for side, snapshot in (("old release's snapshot (the input)", old), ("new release's snapshot", new)):
        if not isinstance(snapshot, Mapping):
            raise AnsibleFilterError(
                f"vllm_upgrade_report: the {side} must be a dict (vllm_verify's snapshot), got {_short(snapshot)}"
            )
    extra = _plain(extra_required) if extra_required is not None else []
    used = _plain(limits) if limits is not None else {}
    if not isinstance(used, Mapping):
        raise AnsibleFilterError(f"vllm_upgrade_report: limits must be a dict, got {_short(used)}")
    dashboard, rules = shipped_consumers()
    try:
        required = _upgrade.required_metrics(dashboard, rules, _flag("speculative", speculative), extra)
        return _upgrade.compare(old, new, required, used)
    except Exception as exc:  # any failure becomes a message naming it, never a traceback
        raise AnsibleFilterError(f"vllm_upgrade_report: {type(exc).__name__}: {exc}") from exc


def _report(name, report):
    """`report` as plain Python when it is vllm_upgrade_report's output, else an error naming the filter."""
    report = _plain(report)
    if not isinstance(report, Mapping) or "verdict" not in report or "reasons" not in report:
        raise AnsibleFilterError(f"{name} expects the output of vllm_upgrade_report, got {_short(report)}")
    return report


def _render(name, render, report):
    """`render` of the report vllm_upgrade_report made; any failure an AnsibleFilterError naming the filter."""
    report = _report(name, report)
    try:
        return render(report)
    except Exception as exc:
        raise AnsibleFilterError(f"{name}: {type(exc).__name__}: {exc}") from exc


def vllm_upgrade_markdown(report):
    return _render("vllm_upgrade_markdown", _upgrade.render_markdown, report)


def vllm_upgrade_html(report):
    return _render("vllm_upgrade_html", _upgrade.render_html, report)


# Each filter is documented in plugins/filter/<filter>.yml, which ansible-doc -t filter reads.
class FilterModule:
    """The upgrade gate's filters."""

    def filters(self):
        return {
            "vllm_upgrade_report": vllm_upgrade_report,
            "vllm_upgrade_markdown": vllm_upgrade_markdown,
            "vllm_upgrade_html": vllm_upgrade_html,
        }
