"""tests/unit/conftest.py: where every test must run (VLLM_FLEET_NO_SKIPS=1, set by scripts/test.sh), a skipped
test fails the run and is named; elsewhere a skip stays a skip."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("no_skips, rc", [("1", 1), ("", 0)])
def test_a_skip_fails_the_run_only_where_every_test_must_run(tmp_path, no_skips, rc):
    (tmp_path / "test_one.py").write_text(
        "import pytest\n\ndef test_runs():\n    pass\n\n"
        "def test_needs_a_tool():\n    pytest.skip('the tool is missing')\n"
    )
    env = dict(os.environ, VLLM_FLEET_NO_SKIPS=no_skips, PYTHONPATH=str(HERE))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "conftest",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == rc, out.stdout[-2000:]
    assert "1 passed, 1 skipped" in out.stdout
    assert ("test_one.py::test_needs_a_tool: Skipped: the tool is missing" in out.stdout) == (rc == 1), out.stdout
