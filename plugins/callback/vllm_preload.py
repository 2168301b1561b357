"""Load this collection's filter plugins once, in ansible-playbook's own process, before the first task.

Ansible runs each task for each host in a worker process forked from ansible-playbook. A worker whose task uses one of
this collection's filters loads its plugin file (the planner, the gateway's checks, the report and tune code they
import) unless its parent has already loaded it, in which case it inherits it with the fork. Loaded here once, they
cost a run about a second; loaded in every worker, they were about a third of the workers' time in a py-spy of the
vllm_verify role's test (2026-12-05)."""

from __future__ import annotations

DOCUMENTATION = """
name: vllm_preload
type: aggregate
short_description: Load this collection's filter plugins once, before the first task, for each task's worker to inherit
description:
  - At the start of a playbook, loads every filter plugin of this collection (vllm_fleet.fleet) in ansible-playbook's
    process. Each task's worker process, forked from it, then finds them loaded instead of loading them again.
  - Prints nothing. A plugin that fails to load here is left to fail where a task uses it, with Ansible's own error.
requirements:
  - enabled in ansible.cfg, callbacks_enabled = vllm_fleet.fleet.vllm_preload
"""

from pathlib import Path

from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import filter_loader

# This collection's name, and its filters: each has its documentation, plugins/filter/<name>.yml, beside this folder.
COLLECTION = "vllm_fleet.fleet"
FILTERS = Path(__file__).resolve().parent.parent / "filter"


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "vllm_preload"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook):
        try:
            for doc in sorted(FILTERS.glob("*.yml")):
                filter_loader.get(f"{COLLECTION}.{doc.stem}")
        except Exception as exc:  # noqa: BLE001 (a load error is Ansible's to report where a task uses the filter)
            self._display.vvvv(f"vllm_preload: the filter plugins were not loaded ahead: {exc!r}")
