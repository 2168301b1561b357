# Thin Ansible filters over vllm_fleet.upgrade: the go/no-go of a release change on the rollout's canary instance.
from __future__ import annotations

DOCUMENTATION = r"""
name: vllm_upgrade_report
short_description: Judge a vLLM release change on one instance (go or no-go), and render the judgement
description:
  - C(vllm_upgrade_report) applied to the old release's snapshot, with the new release's (both from vllm_verify's
    C(snapshot) entry point, completed by the rollout with the release, arguments, dropped flags and the planner's
    KV cache prediction), compares them (C(vllm_fleet.upgrade.compare)) and returns the report with its verdict,
    C(go) or C(no-go), and the reasons for a no-go.
  - The metric names the new release must expose are those the shipped Grafana dashboard and alert rules read
    (this checkout's roles/vllm_monitoring/files), verification's (C(vllm_fleet.metrics.required_families)) and
    C(extra_required). The speculative-decoding names are required only with C(speculative), since vLLM registers
    them only when the engine speculates.
  - C(vllm_upgrade_markdown) and C(vllm_upgrade_html) render the report as Markdown and as one self-contained HTML
    page.
  - Every filter raises AnsibleFilterError naming what it could not use, never a Python traceback.
options:
  _input:
    description:
      - For C(vllm_upgrade_report), the old release's snapshot (C(instance), C(release), C(version), C(args),
        C(dropped), C(metrics_text), C(predicted_kv_cache_tokens), C(outputs), C(load), C(error); any may be missing
        or null).
      - For C(vllm_upgrade_markdown) and C(vllm_upgrade_html), the output of C(vllm_upgrade_report).
    type: dict
    required: true
  new:
    description: The new release's snapshot, the same keys.
    type: dict
    required: true
  extra_required:
    description: Metric names the site's own dashboards, alerts or tools read (vllm_rollout_upgrade_required_metrics).
    type: list
    elements: str
    default: []
  limits:
    description: >-
      C(max_latency_ratio) (2.0), C(min_kv_ratio) (0.8) and C(require_same_outputs) (false); a missing key takes its
      default.
    type: dict
    default: {}
  speculative:
    description: Whether the instance runs speculative decoding (its names are required then).
    type: bool
    default: false
requirements:
  - The C(vllm_fleet) package (this checkout's C(src/), loaded beside the plugin), C(prometheus_client), and
    C(matplotlib) for the page.
author:
  - vllm-fleet maintainers
"""

EXAMPLES = r"""
- name: Compare the old release with the new one
  ansible.builtin.set_fact:
    __vllm_rollout_upgrade: >-
      {{ _before | vllm_upgrade_report(_after, extra_required=['vllm:request_success_total'],
                                       limits={'max_latency_ratio': 1.5}) }}

- name: Write the go/no-go page
  ansible.builtin.copy:
    content: "{{ __vllm_rollout_upgrade | vllm_upgrade_html }}"
    dest: reports/run-1/upgrade-fleet-1-main.html
    mode: "0644"
  delegate_to: localhost
"""

RETURN = r"""
_value:
  description: For C(vllm_upgrade_report) the report, for the others its Markdown or HTML text.
  type: raw
  contains:
    verdict: {description: "C(go) or C(no-go).", type: str}
    reasons:
      description: Why a no-go, one sentence each naming the figure, both values and the limit (empty for a go).
      type: list
      elements: str
    notes:
      description: What the old release failed to measure, and the comparisons that skipped.
      type: list
      elements: str
    instance: {description: The instance (host/instance)., type: str}
    from: {description: The old release., type: str}
    to: {description: The new release., type: str}
    from_version: {description: The old release's /version., type: str}
    to_version: {description: The new release's /version., type: str}
    arguments:
      description: "C(old), C(new) (secret values not shown), C(added), C(removed), C(changed) flags, C(dropped)."
      type: dict
    kv_cache:
      description: "C(old) and C(new) (C(tokens), C(predicted), C(error_pct)) and C(ratio), new over old."
      type: dict
    metrics:
      description: "C(required), C(missing) and C(missing_before) (name to readers), C(removed), C(added)."
      type: dict
    outputs:
      description: "C(compared), C(same), C(different) (C(prompt), C(old), C(new)), C(errors)."
      type: dict
    latency:
      description: "C(old), C(new) (TTFT and ITL p50 and p99 in ms, output tokens/s, completed, failed), C(ratio)."
      type: dict
    limits: {description: The limits used., type: dict}
"""

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


class FilterModule:
    """The upgrade gate's filters."""

    def filters(self):
        return {
            "vllm_upgrade_report": vllm_upgrade_report,
            "vllm_upgrade_markdown": vllm_upgrade_markdown,
            "vllm_upgrade_html": vllm_upgrade_html,
        }
