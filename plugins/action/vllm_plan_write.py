# Action plugin: the fleet's plan (the fact vllm_plan) written to plan.json on the controller, with its table and
# its errors, in the task's own worker. The documentation is plugins/modules/vllm_plan_write.py.
from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# The library of this checkout, beside the plugin (never another installed copy).
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
from vllm_fleet import planner as _planner
from vllm_fleet.files import write_whole
from vllm_fleet.inputs import short as _short


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("dest",))
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        dest = self._task.args.get("dest")  # ActionBase.run refused any option not in _VALID_ARGS, by name
        if not isinstance(dest, str) or not dest:
            raise AnsibleActionFail("vllm_plan_write: dest must be the path of plan.json, got %s" % _short(dest))
        # The fact as the play holds it, read here rather than passed as an option: an option would be templated value
        # by value, which for 10,000 hosts cost more than planning them (docs/benchmarks.md).
        plan = (task_vars or {}).get("vllm_plan")
        if not isinstance(plan, Mapping) or not isinstance(plan.get("hosts"), Mapping):
            raise AnsibleActionFail(
                "vllm_plan_write: the fact vllm_plan is not the fleet's plan (%s); fix: run the vllm_plan role's "
                "fleet entry point first" % _short(plan)
            )
        try:
            table = _planner.table(plan)
        except Exception as exc:  # noqa: BLE001 - a message naming what is wrong, never a traceback
            raise AnsibleActionFail(
                "vllm_plan_write: the plan's host entries are not plan entries (%s: %s)" % (type(exc).__name__, exc)
            ) from None
        errors = [str(e) for entry in plan["hosts"].values() for e in (entry.get("errors") or [])]
        path = Path(dest)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # Ansible's to_nice_json(indent=2) wrote the same text before: keys sorted, ASCII only.
            write_whole(path, json.dumps(plan, indent=2, sort_keys=True, separators=(",", ": "), default=str) + "\n")
        except (OSError, ValueError, TypeError) as exc:
            raise AnsibleActionFail("vllm_plan_write: could not write %s: %s" % (dest, exc)) from exc
        # plan.json is the run's output, not state a host is driven to: "ok", so a second run still shows changed=0.
        return dict(result, changed=False, path=str(path), hosts=len(plan["hosts"]), table=table, errors=errors)
