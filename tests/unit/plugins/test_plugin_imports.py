"""What loading a filter plugin costs every task. Ansible loads every filter plugin of plugins/filter/ in each worker
process of each task whose arguments use a filter, for every host: a heavy import at a plugin's top level is paid
thousands of times in one site.yml run. On 2026-12-05 one such import (matplotlib, through the tune filters' page
writer) made each task that used a filter about 0.9 s longer per host (py-spy of playbooks/plan.yml: 68 % of its time
in that import), and the fleet scenario's site.yml runs took about twice as long. Plotting is loaded only where a
page is written, the Prometheus parser where a page is parsed, cryptography where a certificate or key is read."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT

FILTERS = sorted((ROOT / "plugins" / "filter").glob("*.py"))
# Libraries a filter plugin may use only inside the function that needs them.
HEAVY = ("matplotlib", "numpy", "PIL", "prometheus_client", "jsonschema", "cryptography")

# What a worker process has before it loads a filter plugin (its parent, ansible-playbook, imported them): the task
# executor, templating and the vault (which brings cryptography). Only what the plugin adds to that is counted.
LOAD = """
import importlib.util, json, sys
import ansible.executor.task_executor, ansible.parsing.vault, ansible.template
before = set(sys.modules)
spec = importlib.util.spec_from_file_location("plugin_under_test", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
assert module.FilterModule().filters(), "the plugin publishes no filter"
print(json.dumps(sorted({name.split(".")[0] for name in set(sys.modules) - before})))
"""


def test_there_are_filter_plugins():
    assert len(FILTERS) >= 10, FILTERS


@pytest.mark.parametrize("path", FILTERS, ids=lambda path: path.name)
def test_loading_a_filter_plugin_loads_no_heavy_library(path):
    """In a fresh interpreter that has what a worker process inherits, as the worker loads it: the plugin's filters
    are there, and none of the heavy libraries was imported to get them."""
    done = subprocess.run([sys.executable, "-c", LOAD, str(path)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    assert "vllm_fleet" in loaded or path.name == "vllm_verify.py" or path.name == "systemd_args.py", loaded
    assert not loaded & set(HEAVY), f"{path.name} loads {sorted(loaded & set(HEAVY))} when Ansible loads it"
