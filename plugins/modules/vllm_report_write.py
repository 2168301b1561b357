#!/usr/bin/python
# -*- coding: utf-8 -*-
# Part of the vllm-fleet Ansible package. The documentation of an action plugin (plugins/action/vllm_report_write.py),
# which runs on the controller: nothing here runs on a host.

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: vllm_report_write
short_description: Write a run report's fragment, and its report.json, report.md and report.html, on the controller
description:
  - Runs on the controller, in the task's own worker (an action plugin); no module is sent to a host.
  - With O(fragment) (the output of the C(vllm_report_fragment) filter), writes it to O(run_dir)C(/hosts/), named so
    that the fragments sort in time order (C(vllm_fleet.fragments.fragment_name)).
  - With O(render), merges every fragment of O(run_dir) (C(vllm_fleet.fragments)) and writes C(report.json),
    C(report.md) and C(report.html) (one page, plots embedded) there. Hosts that render at once take turns under a
    lock in O(run_dir), so the last report holds every fragment written before it.
  - Every file is replaced whole (written beside it, then renamed).
  - "Reports C(ok), never C(changed): a report is a run's output, not state a host is driven to. Writes nothing in
    check mode."
version_added: "0.1.0"
author:
  - vllm-fleet maintainers
options:
  run_dir:
    description: The run's folder on the controller, for example C(reports/rollout-1).
    type: path
    required: true
  run_id:
    description: The run's name in the report. Default, the folder's name.
    type: str
  fragment:
    description: One event of one instance, from the C(vllm_report_fragment) filter.
    type: dict
  render:
    description: Merge the run's fragments and write the three report files.
    type: bool
    default: true
requirements:
  - The C(vllm_fleet) package (this repository's C(src/)) and C(matplotlib) on the controller.
"""

EXAMPLES = r"""
- name: Write this instance's fragment
  vllm_fleet.fleet.vllm_report_write:
    run_dir: "{{ _run_dir }}"
    fragment: "{{ _result | vllm_fleet.fleet.vllm_report_fragment(inventory_hostname, 'verify', 'cpu0') }}"
    render: false

- name: Write the run's report
  vllm_fleet.fleet.vllm_report_write:
    run_dir: "{{ _run_dir }}"
    run_id: rollout-1
  run_once: true
"""

RETURN = r"""
written:
  description: The files written.
  type: list
  elements: str
  returned: success
"""
