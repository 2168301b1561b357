# Action plugin: the run report's files, written on the controller in the task's own worker (no module travels, no
# Python starts elsewhere). The documentation is plugins/modules/vllm_report_write.py.
from __future__ import annotations

import fcntl
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
from vllm_fleet import fragments as _fragments
from vllm_fleet import report as _report
from vllm_fleet.files import write_whole
from vllm_fleet.inputs import short as _short


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("run_dir", "run_id", "fragment", "render"))
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args  # ActionBase.run refused any option not in _VALID_ARGS, by name
        if self._task.check_mode:
            return dict(result, skipped=True, changed=False, msg="check mode: no report is written")
        run_dir, fragment, render = args.get("run_dir"), args.get("fragment"), args.get("render", True)
        if not isinstance(run_dir, str) or not run_dir:
            raise AnsibleActionFail("vllm_report_write: run_dir must be the run's folder, got %s" % _short(run_dir))
        if fragment is None and not render:
            raise AnsibleActionFail("vllm_report_write: nothing to write (give fragment, or render: true)")
        hosts = Path(run_dir) / "hosts"
        try:
            hosts.mkdir(parents=True, exist_ok=True)
            written = []
            if fragment is not None:
                if not isinstance(fragment, Mapping) or not {"host", "kind", "recorded_at"} <= set(fragment):
                    raise AnsibleActionFail(
                        "vllm_report_write: fragment must be vllm_report_fragment's output, got %s" % _short(fragment)
                    )
                path = hosts / _fragments.fragment_name(fragment)
                write_whole(path, json.dumps(dict(fragment), indent=4, sort_keys=True, default=str) + "\n")
                written.append(str(path))
            if render:
                # Hosts writing at once take turns: each merges every fragment written before its turn, so the last
                # one's report holds them all.
                with open(Path(run_dir) / ".report.lock", "w") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    report = _fragments.merge(
                        _fragments.load_fragments(run_dir), run_id=args.get("run_id") or Path(run_dir).name
                    )
                    from vllm_fleet.report_html import render_html  # matplotlib: loaded only where a page is written

                    for name, text in (
                        ("report.json", json.dumps(report, indent=4, sort_keys=True, default=str) + "\n"),
                        ("report.md", _report.render_markdown(report)),
                        ("report.html", render_html(report)),
                    ):
                        write_whole(Path(run_dir) / name, text)
                        written.append(str(Path(run_dir) / name))
        except (OSError, ValueError) as exc:
            raise AnsibleActionFail("vllm_report_write: could not write the report in %s: %s" % (run_dir, exc)) from exc
        # The report is the run's output, not state a host is driven to: "ok", so a second run still shows changed=0.
        return dict(result, changed=False, written=written)
