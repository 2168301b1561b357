"""execution-environment.yml: ansible-builder (the real tool, pinned in requirements/controller.txt) makes its
build context here; no image is built (no registry is reachable). The context must carry the project's
collections, the library's Python needs pinned as the controller pins them, and the system packages."""

import subprocess
import sys
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

from conftest import ROOT


def pins(path):
    """name -> version of each name==version line (a name without its extras: cyclonedx-python-lib[json-validation])."""
    return {
        line.split("==")[0].split("[")[0].lower().replace("_", "-"): line.split("==")[1]
        for line in path.read_text().split()
        if "==" in line and not line.startswith("#")
    }


def test_the_ee_context_is_created_from_the_projects_own_requirements(tmp_path):
    builder = Path(sys.executable).parent / "ansible-builder"
    proc = subprocess.run(
        [
            str(builder),
            "create",
            "-f",
            "execution-environment.yml",
            "-c",
            str(tmp_path / "ctx"),
            "--output-filename",
            "Containerfile",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    build = tmp_path / "ctx" / "_build"
    containerfile = (tmp_path / "ctx" / "Containerfile").read_text()
    controller = pins(ROOT / "requirements" / "controller.txt")
    assert f"ansible-core=={controller['ansible-core']}" in containerfile
    assert yaml.safe_load((build / "requirements.yml").read_text()) == yaml.safe_load(
        (ROOT / "requirements.yml").read_text()
    )
    assert "openssh-clients" in (build / "bindep.txt").read_text()
    ee = pins(build / "requirements.txt")
    assert ee and all(controller[name] == version for name, version in ee.items()), (ee, controller)


def test_the_ee_has_every_library_dependency():
    """pyproject's dependencies, with their extras, are the ones requirements/ee.txt pins."""
    with (ROOT / "pyproject.toml").open("rb") as handle:
        wanted = [Requirement(d) for d in tomllib.load(handle)["project"]["dependencies"]]
    pinned = [
        Requirement(line)
        for line in (ROOT / "requirements" / "ee.txt").read_text().split()
        if "==" in line and not line.startswith("#")
    ]

    def extras(requirements):
        return {r.name.lower().replace("_", "-"): r.extras for r in requirements}

    assert extras(wanted) == extras(pinned)
