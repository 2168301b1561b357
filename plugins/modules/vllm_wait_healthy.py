#!/usr/bin/python
# -*- coding: utf-8 -*-
# Part of the vllm-fleet Ansible package. Runs on the managed host; standard library only.

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: vllm_wait_healthy
short_description: Wait until a vLLM instance answers /health, telling a crash from a slow start
description:
  - Probes the instance's C(/health) every O(delay) seconds until it answers 200 or O(timeout) seconds have passed.
  - With O(unit), reads C(systemctl show) of the instance's unit before every probe and gives up at once when the
    unit is not installed, failed or stopped, or has restarted more than O(max_restarts) times (the vLLM unit
    restarts on any exit, so a release that dies shows as a restart). That is RV(state=crashed); running out
    of time with the unit up is RV(state=timeout), a slow start.
  - Not healthy, it returns the unit's last journal lines (RV(journal_tail)).
  - The one health wait of the project, used by the vllm role after a (re)start and by the vllm_verify role before
    its probes.
version_added: "0.1.0"
author:
  - vllm-fleet maintainers
options:
  url:
    description: The instance's base URL as the host reaches it (C(http://127.0.0.1:8000)); C(/health) is added.
    type: str
    required: true
  unit:
    description: The instance's systemd unit (C(vllm@main.service)). Unset, only C(/health) is watched.
    type: str
  timeout:
    description: Seconds to wait for a 200 in all.
    type: int
    default: 900
  delay:
    description: Seconds between two probes (and two reads of the unit).
    type: float
    default: 1.0
  max_restarts:
    description:
      - Restarts of the unit (C(NRestarts)) above which the release counts as crashed. The vllm role zeroes the
        counter before it restarts the unit, so 0 means any crash since that restart.
    type: int
    default: 0
  validate_certs:
    description: Check the certificate of an C(https) URL.
    type: bool
    default: true
  journal_lines:
    description: How many of the unit's journal lines to return when it is not healthy.
    type: int
    default: 30
  fail_on_unhealthy:
    description: Fail the task when not healthy. V(false) returns the result for the caller to judge.
    type: bool
    default: true
notes:
  - Supports check mode (it only reads).
"""

EXAMPLES = r"""
- name: Wait until the restarted instance is healthy (fail with the reason and its journal)
  vllm_fleet.fleet.vllm_wait_healthy:
    url: http://127.0.0.1:8000
    unit: vllm@main.service
    timeout: 900

- name: Wait, and keep the result for the report
  vllm_fleet.fleet.vllm_wait_healthy:
    url: http://10.0.0.5:8000
    unit: vllm@gpu0.service
    timeout: 300
    delay: 5
    fail_on_unhealthy: false
  register: __health
"""

RETURN = r"""
ok:
  description: Whether /health answered 200.
  returned: always
  type: bool
state:
  description: V(healthy), V(crashed) (the unit failed, stopped or restarted too often) or V(timeout) (still starting).
  returned: always
  type: str
error:
  description: Why it is not healthy (null when it is).
  returned: always
  type: str
waited_s:
  description: Seconds waited.
  returned: always
  type: float
attempts:
  description: Probes of /health sent (0 when the unit's state ended the wait before the first).
  returned: always
  type: int
already_up:
  description: The first probe answered 200 (nothing was started).
  returned: always
  type: bool
healthy_date:
  description: The Date header of the 200 (the host's clock), empty when not healthy.
  returned: always
  type: str
restarts:
  description: The unit's restart count as last read (null without O(unit)).
  returned: always
  type: int
unit_state:
  description: The unit's LoadState, ActiveState, SubState, Result, NRestarts, restarts and error as last read.
  returned: always
  type: dict
journal_tail:
  description: The unit's last O(journal_lines) journal lines, when not healthy.
  returned: always
  type: list
  elements: str
"""

from urllib.error import HTTPError

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.vllm_unit import show_argv, wait_healthy


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            unit=dict(type="str"),
            timeout=dict(type="int", default=900),
            delay=dict(type="float", default=1.0),
            max_restarts=dict(type="int", default=0),
            validate_certs=dict(type="bool", default=True),
            journal_lines=dict(type="int", default=30),
            fail_on_unhealthy=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    url = params["url"].rstrip("/") + "/health"
    environ = {"LC_ALL": "C"}

    def probe():
        try:
            response = open_url(
                url, timeout=max(5, int(params["delay"])), validate_certs=params["validate_certs"], use_proxy=False
            )
            return response.getcode(), response.headers.get("Date", ""), ""
        except HTTPError as exc:
            return exc.code, "", "HTTP %s" % exc.code
        except Exception as exc:  # noqa: BLE001 - connection refused, reset, timed out: the server is not up
            return None, "", str(exc)[:300]

    def read_unit():
        rc, out, _err = module.run_command(show_argv(params["unit"]), environ_update=environ)
        return out if rc == 0 else ""

    result = wait_healthy(
        probe, read_unit, url, params["timeout"], params["delay"], params["unit"], params["max_restarts"]
    )
    result["journal_tail"] = []
    if not result["ok"] and params["unit"] and params["journal_lines"] > 0:
        _rc, out, _err = module.run_command(
            [
                "journalctl",
                "--unit",
                params["unit"],
                "--lines",
                str(params["journal_lines"]),
                "--no-pager",
                "--output",
                "cat",
            ],
            environ_update=environ,
        )
        result["journal_tail"] = out.splitlines()[-params["journal_lines"] :]
    result["changed"] = False
    if not result["ok"] and params["fail_on_unhealthy"]:
        module.fail_json(msg="%s: %s" % (params["unit"] or url, result["error"]), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
