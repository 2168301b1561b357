"""benchmarks/plan_200_hosts.py: the planning benchmark runs, quickly, on a small fleet."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT as _ROOT

ROOT = str(_ROOT)


@pytest.mark.skipif(shutil.which("true") is None, reason="needs a POSIX userland")
def test_benchmark_script_runs_quickly():
    script = os.path.join(ROOT, "benchmarks", "plan_200_hosts.py")
    result = subprocess.run(
        [sys.executable, script, "--hosts", "20"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src")),
    )
    assert result.returncode == 0, result.stderr
    assert "20 hosts" in result.stdout
