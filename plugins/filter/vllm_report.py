# Thin Ansible filters over vllm_fleet.fragments and vllm_fleet.report: the run report that vllm_verify,
# playbooks/benchmark.yml and playbooks/diagnose.yml write.
from __future__ import annotations

DOCUMENTATION = r"""
name: vllm_report_merge
short_description: Build a run's report from its fragments, and the other vllm_report_* filters
description:
  - C(vllm_report_fragment) (data, host, kind, instance) makes one event of an instance for the report (a
    verification, a rollout's load-loop numbers, a rollback, a benchmark, a day-2 window), and
    C(vllm_report_fragment_name) its file name, which sorts in time order.
  - C(vllm_report_merge) (fragments, run_id, meta) folds a run's fragments into one report (see
    C(vllm_fleet.fragments)); C(vllm_report_markdown) and C(vllm_report_html) render it (C(vllm_fleet.report), and
    C(vllm_fleet.report_html) for the page with plots).
  - Every filter raises AnsibleFilterError naming the value it could not use.
options:
  _input:
    description:
      - For C(vllm_report_fragment), the event's data (a verification result, load-loop numbers, a rollback...).
      - For C(vllm_report_fragment_name), a fragment; for C(vllm_report_merge), a run's fragments.
      - For C(vllm_report_markdown) and C(vllm_report_html), the merged report.
    type: raw
    required: true
requirements:
  - The C(vllm_fleet) package (this repository's C(src/)), and C(matplotlib) for the page.
author:
  - vllm-fleet maintainers
"""

EXAMPLES = r"""
- name: The run's report, from its fragments
  ansible.builtin.copy:
    content: "{{ _fragments | vllm_report_merge('run-1') | vllm_report_markdown }}"
    dest: reports/run-1/report.md
    mode: "0644"
  delegate_to: localhost
"""

RETURN = r"""
_value:
  description: A fragment, its file name, the merged report, or its Markdown or HTML.
  type: raw
"""

import os
import sys
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

# The library of this checkout, beside the plugin (never another installed copy): every filter plugin loads it so.
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
from vllm_fleet import fragments as _fragments  # (the standard library only)
from vllm_fleet import report as _report
from vllm_fleet.inputs import short as _short


def vllm_report_fragment(data, host, kind, instance=None):
    try:
        return _fragments.fragment(
            str(host) if isinstance(host, str) else host,
            kind,
            data,
            instance=str(instance) if isinstance(instance, str) else instance,
        )
    except ValueError as exc:
        raise AnsibleFilterError("vllm_report_fragment: %s" % exc) from exc


def vllm_report_fragment_name(frag):
    if not isinstance(frag, Mapping) or not {"host", "kind", "recorded_at"} <= set(frag):
        raise AnsibleFilterError(
            "vllm_report_fragment_name expects the output of vllm_report_fragment, got %s" % _short(frag)
        )
    return _fragments.fragment_name(frag)


def vllm_report_merge(fragments, run_id=None, meta=None):
    if isinstance(fragments, (str, Mapping)) or not hasattr(fragments, "__iter__"):
        raise AnsibleFilterError("vllm_report_merge expects a list of fragments, got %s" % _short(fragments))
    frags = list(fragments)
    for item in frags:
        if not isinstance(item, Mapping) or not {"host", "kind", "data"} <= set(item):
            raise AnsibleFilterError("vllm_report_merge: not a report fragment: %s" % _short(item))
    return _fragments.merge(frags, run_id=run_id, meta=dict(meta or {}))


def _merged_report(name, report):
    """`report` when it is vllm_report_merge's output, else an error naming the filter."""
    if not isinstance(report, Mapping) or "hosts" not in report:
        raise AnsibleFilterError("%s expects the output of vllm_report_merge, got %s" % (name, _short(report)))
    return report


def vllm_report_markdown(report):
    return _report.render_markdown(_merged_report("vllm_report_markdown", report))


def vllm_report_html(report):
    report = _merged_report("vllm_report_html", report)
    from vllm_fleet import report_html  # matplotlib: loaded only where a page is written

    return report_html.render_html(report)


class FilterModule:
    """The run report's filters."""

    def filters(self):
        return {
            "vllm_report_fragment": vllm_report_fragment,
            "vllm_report_fragment_name": vllm_report_fragment_name,
            "vllm_report_merge": vllm_report_merge,
            "vllm_report_markdown": vllm_report_markdown,
            "vllm_report_html": vllm_report_html,
        }
