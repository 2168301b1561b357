# A thin Ansible filter over vllm_fleet.fragments: one event of the run report that vllm_verify, playbooks/benchmark.yml
# and playbooks/diagnose.yml write (the vllm_report_write action writes it and the report).
from __future__ import annotations

DOCUMENTATION = r"""
name: vllm_report_fragment
short_description: Make one event of an instance for the run report
description:
  - C(vllm_report_fragment) (data, host, kind, instance) makes one event of an instance for the report (a
    verification, a rollout's load-loop numbers, a rollback, a benchmark, a day-2 window).
  - The C(vllm_report_write) action writes fragments and merges them into the run's report.json, report.md and
    report.html (C(vllm_fleet.fragments), C(vllm_fleet.report), C(vllm_fleet.report_html)).
  - Every filter raises AnsibleFilterError naming the value it could not use.
options:
  _input:
    description:
      - The event's data (a verification result, load-loop numbers, a rollback...).
    type: raw
    required: true
requirements:
  - The C(vllm_fleet) package (this repository's C(src/)).
author:
  - vllm-fleet maintainers
"""

EXAMPLES = r"""
- name: This instance's verification as an event of the run report
  vllm_report_write:
    run_dir: reports/run-1
    fragment: "{{ vllm_verify_result | vllm_report_fragment(inventory_hostname, 'verify', 'cpu0') }}"
    render: false
"""

RETURN = r"""
_value:
  description: A fragment, for the C(vllm_report_write) action.
  type: raw
"""

import os
import sys

from ansible.errors import AnsibleFilterError

# The library of this checkout, beside the plugin (never another installed copy): every filter plugin loads it so.
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
from vllm_fleet import fragments as _fragments  # (the standard library only)


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


class FilterModule:
    """The run report's filters."""

    def filters(self):
        return {
            "vllm_report_fragment": vllm_report_fragment,
        }
