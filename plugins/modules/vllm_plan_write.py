#!/usr/bin/python
# -*- coding: utf-8 -*-
# Part of the vllm-fleet Ansible package. The documentation of an action plugin (plugins/action/vllm_plan_write.py),
# which runs on the controller: nothing here runs on a host.

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: vllm_plan_write
short_description: Write the fleet's plan (the fact vllm_plan) to plan.json on the controller, with its table and errors
description:
  - Runs on the controller, in the task's own worker (an action plugin); no module is sent to a host.
  - Reads the fact C(vllm_plan) (the output of the C(vllm_plan_hosts) filter, which the vllm_plan role's C(fleet)
    entry point sets) and writes it to O(dest) as JSON (keys sorted, indented by 2), replaced whole (written beside
    it, then renamed); makes the folder when it is missing.
  - Returns the plan's table (C(vllm_plan_table)'s lines) and every host's errors, so that the play shows and checks
    them without templating the whole plan again.
  - "Reports C(ok), never C(changed): plan.json is the run's output, not state a host is driven to. Writes also in
    check mode."
version_added: "0.1.0"
author:
  - vllm-fleet maintainers
options:
  dest:
    description: The path of plan.json on the controller, for example C(reports/plan.json).
    type: path
    required: true
requirements:
  - The C(vllm_fleet) package (this repository's C(src/)) on the controller.
"""

EXAMPLES = r"""
- name: Write plan.json on the controller
  vllm_fleet.fleet.vllm_plan_write:
    dest: "{{ vllm_plan_report_dir }}/plan.json"
  register: _plan_written
  run_once: true

- name: Show the plan
  ansible.builtin.debug:
    msg: "{{ _plan_written.table | join('\n') }}"
  run_once: true
"""

RETURN = r"""
path:
  description: The file written.
  type: str
  returned: success
hosts:
  description: How many hosts the plan holds.
  type: int
  returned: success
table:
  description: The plan's table, one line per item (C(vllm_plan_table)).
  type: list
  elements: str
  returned: success
errors:
  description: Every host's planning errors, in host order; empty when none.
  type: list
  elements: str
  returned: success
"""
