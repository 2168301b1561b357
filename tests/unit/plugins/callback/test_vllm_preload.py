"""The vllm_preload callback loads the collection's filter plugins in ansible-playbook's process before the first task,
so that each task's worker, forked from it, inherits them (plugins/callback/vllm_preload.py)."""

import json
import os
import subprocess
import sys

from conftest import ROOT

PROBE = """
import json, sys
from ansible import context
from ansible.plugins.loader import filter_loader, init_plugin_loader
init_plugin_loader()
from ansible.plugins.loader import callback_loader
before = "vllm_fleet.planner" in sys.modules
prefix = "ansible_collections.vllm_fleet.fleet.plugins.filter."
callback = callback_loader.get("vllm_fleet.fleet.vllm_preload")
callback.v2_playbook_on_start(None)
modules = [m for name, m in sys.modules.items() if name.startswith(prefix)]
loaded = {f for m in modules if hasattr(m, "FilterModule") for f in m.FilterModule().filters()}
print(json.dumps({"before": before, "planner": "vllm_fleet.planner" in sys.modules,
                  "filters": sorted(name for name in ("vllm_tune_candidates", "vllm_gateway_clients", "vllm_tune_load")
                                    if name in loaded)}))
"""


def test_the_callback_loads_the_filter_plugins_before_any_task():
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["before"] is False, seen
    assert seen["planner"] is True, seen
    assert seen["filters"] == ["vllm_gateway_clients", "vllm_tune_candidates", "vllm_tune_load"], seen


def test_ansible_cfg_enables_it():
    text = (ROOT / "ansible.cfg").read_text()
    assert any(
        line.startswith("callbacks_enabled") and "vllm_fleet.fleet.vllm_preload" in line for line in text.splitlines()
    ), text
