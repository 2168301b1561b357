"""What every unit test shares: where the repository and its fixtures are, the fixture loaders, and the
threaded local HTTP server behind the stand-ins of a vLLM server.

The layout mirrors the source: tests/unit/vllm_fleet/test_planner.py for src/vllm_fleet/planner.py,
tests/unit/plugins/filter/test_vllm_verify.py for plugins/filter/vllm_verify.py, tests/unit/roles/ for the
roles, tests/unit/playbooks/ for playbooks/. Tests that run ansible-playbook are marked ``integration``.
Test modules import the names below (``from conftest import ROOT, fixture_text, LocalServer``): StandInVllm is
the stand-in vLLM (tests/serving.py), the other stand-ins subclass LocalServer for the endpoint they test, and
their module-level constants read fixtures at import time.
Standard library only: the parser tests run it in the .venv-vllm test venv too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
VLLM_FIXTURES = FIXTURES / "vllm"  # real vLLM pages and answers (fixtures/vllm/README.md)
GPU_FIXTURES = FIXTURES / "gpu"  # real and constructed nvidia-smi outputs (fixtures/gpu/README.md)

# The cards the planner tests plan for (vllm_gpu as a group gives it).
RTX4090 = {"name": "NVIDIA GeForce RTX 4090", "memory_mib": 24564, "bandwidth_gb_s": 1008, "count": 1}
L40 = {"name": "NVIDIA L40", "memory_mib": 46068, "bandwidth_gb_s": 864, "count": 1}
H200 = {"name": "NVIDIA H200", "memory_mib": 143771, "bandwidth_gb_s": 4800, "count": 1}
LAB = {"name": "cpu", "memory_mib": 4096, "bandwidth_gb_s": 20, "count": 1}

# This checkout's package, before any installed copy (a venv's editable install may point at another checkout).
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))
# This checkout as the collection vllm_fleet.fleet (collections/ansible_collections/vllm_fleet/fleet links to it): the
# modules import their module_utils by the collection's name, ansible_collections.vllm_fleet.fleet.plugins.module_utils.
if str(ROOT / "collections") not in sys.path:
    sys.path.append(str(ROOT / "collections"))
# tests/browser.py: the headless browser the report page's tests share with the fleet scenario.
if str(ROOT / "tests") not in sys.path:
    sys.path.append(str(ROOT / "tests"))


# scripts/test.sh sets VLLM_FLEET_NO_SKIPS=1: where every test must run (CI, the README's test command), a test that
# skipped (a missing tool, a missing fixture) fails the run, named, instead of passing it silently.
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = terminalreporter.stats.get("skipped", [])
    if os.environ.get("VLLM_FLEET_NO_SKIPS") == "1" and skipped:
        terminalreporter.section("skipped where every test must run (VLLM_FLEET_NO_SKIPS=1)", red=True)
        for report in skipped:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            terminalreporter.line(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if os.environ.get("VLLM_FLEET_NO_SKIPS") == "1" and reporter and reporter.stats.get("skipped") and exitstatus == 0:
        session.exitstatus = 1


def load_source(name: str, path: str | os.PathLike[str], beside: str | os.PathLike[str] | None = None) -> Any:
    """A Python file that is not an importable module (a role's script, a plugin, a module_utils file), loaded
    under `name`; with `beside`, that folder is first on sys.path while it loads (a script that imports its
    sibling files)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    folders = [str(beside)] if beside is not None else []
    sys.path[:0] = folders
    try:
        spec.loader.exec_module(module)
    finally:
        for folder in folders:
            sys.path.remove(folder)
    return module


def run_ansible(
    tool: str, *args: str, cwd: str | os.PathLike[str], env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """One of Ansible's commands (ansible-playbook, ansible-vault...) from this Python's environment, run on the
    controller in `cwd` with `env`, its output captured as text, bounded by `timeout` seconds."""
    return subprocess.run(
        [str(Path(sys.executable).parent / tool), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ansible_env(home: str | os.PathLike[str], **more: str) -> dict[str, str]:
    """The environment a test's ansible-playbook runs in: this project's ansible.cfg, this Python's tools first on
    PATH, `home` as HOME, no colours, each result on one line (JSON); `more` adds or overrides settings."""
    return {
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
        "HOME": str(home),
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_CALLBACK_RESULT_FORMAT": "json",
        **more,
    }


def run_module(tmp_path: Path, module: str, args: dict[str, Any], path: tuple[str, ...] = ()) -> dict[str, Any]:
    """One of plugins/modules run by Ansible itself on this machine (an ad-hoc task on localhost, with `path`
    first on PATH for its stand-ins): the module's result, with ``failed``."""
    ansible = shutil.which("ansible", path=str(Path(sys.executable).parent)) or shutil.which("ansible")
    if not ansible:
        raise AssertionError(f"ansible is not installed next to {sys.executable} nor on PATH")
    config = tmp_path / "ansible.cfg"
    config.write_text("[defaults]\n")
    env = dict(
        os.environ,
        ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"),
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.minimal",
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_CONFIG=str(config),
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
        PATH=os.pathsep.join([*path, str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    )
    proc = subprocess.run(
        [
            ansible,
            "localhost",
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            "ansible_python_interpreter=" + sys.executable,
            "-m",
            module if "." in module else f"vllm_fleet.fleet.{module}",
            "-a",
            json.dumps(args),
        ],
        env=env,
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    # The minimal callback: "localhost | SUCCESS => {json}" (or FAILED!).
    assert " => " in proc.stdout, proc.stdout + proc.stderr
    head, body = proc.stdout.split(" => ", 1)
    result = json.loads(body)
    result["failed"] = "FAILED" in head
    return result


def socket_activated(program: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    """`program` started as a systemd socket unit with Accept=no starts it: a listening socket on loopback at file
    descriptor 3, LISTEN_FDS=1 and LISTEN_PID its own (set between the fork and the exec, as systemd does). Returns
    the process and the socket's port; the caller stops the process."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    fd, port = listener.fileno(), listener.getsockname()[1]
    handover = (
        "import os, sys; os.dup2(int(sys.argv[1]), 3); os.environ.update(LISTEN_FDS='1', LISTEN_PID=str(os.getpid()));"
        " os.execv(sys.argv[2], sys.argv[2:])"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", handover, str(fd), *program],
        pass_fds=(fd,),
        env={"PATH": os.environ["PATH"]},
        stderr=subprocess.PIPE,
    )
    listener.close()  # the program holds its own copy
    return process, port


def fixture_text(*parts: str) -> str:
    """The text of a fixture file: fixture_text("vllm", "0.32.0-cpu", "metrics_idle.txt")."""
    return FIXTURES.joinpath(*parts).read_text()


def fixture_json(*parts: str) -> Any:
    """A JSON fixture file, parsed."""
    return json.loads(fixture_text(*parts))


from serving import LocalServer, StandInVllm  # noqa: E402,F401  (tests/serving.py: shared with the fleet scenario)
