"""The library as an operator installs it: `pip install .` into a clean virtualenv (no system site packages), from the
wheels scripts/bootstrap.sh keeps for it and nothing else (pip --no-index), so a dependency the library imports and
pyproject.toml does not declare fails here. Then, from a folder outside the checkout and with the checkout on no path,
every module of vllm_fleet imports and the package reads its data as the checkout does: the roles' defaults the plan
shares (package data linked to roles/*/defaults/main.yml, their one home) and the shipped profiles."""

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from vllm_fleet import __version__, datafiles

PACKAGE = ROOT / "src" / "vllm_fleet"
# scripts/env.sh names the folder; a pytest run without it uses the checkout's cache, as bootstrap.sh does.
WHEELS = Path(os.environ.get("LIBRARY_WHEELS") or ROOT / ".cache" / "library-wheels")
FIX = "fix: scripts/bootstrap.sh --no-image (its 'library wheels' phase downloads them, from the network)"

# Run by the installed package's Python, in isolated mode (-I: no PYTHONPATH, no user site, not the current folder).
CHECK = r"""
import ast, importlib, importlib.metadata, json, pkgutil, sys
from importlib import resources

import vllm_fleet

modules = sorted(m.name for m in pkgutil.walk_packages(vllm_fleet.__path__, "vllm_fleet."))
for name in modules:
    importlib.import_module(name)
from vllm_fleet import bundle, datafiles, profiles

# What the modules import where it is used (cryptography in gateway's functions, scipy in tune's), not at the top.
missing = {}
for name in modules:
    for node in ast.walk(ast.parse(open(sys.modules[name].__file__, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            wanted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            wanted = [node.module]
        else:
            continue
        for module in wanted:
            if module.split(".")[0] not in sys.stdlib_module_names and module.split(".")[0] != "vllm_fleet":
                try:
                    importlib.import_module(module)
                except ImportError as exc:
                    missing[f"{name}: {module}"] = str(exc)
# An SBOM validated against the CycloneDX schema: cyclonedx's json-validation extra (jsonschema) is there.
try:
    sbom = json.loads(bundle.sbom_json("installed", "0" * 40, []))["metadata"]["component"]["name"]
except Exception as exc:  # the test shows it
    sbom = f"{type(exc).__name__}: {exc}"


def files(folder, prefix=""):
    for entry in folder.iterdir():
        if entry.is_dir():
            yield from files(entry, prefix + entry.name + "/")
        else:
            yield prefix + entry.name


json.dump(
    {
        "file": vllm_fleet.__file__,
        "path": sys.path,
        "modules": modules,
        "data": sorted(files(resources.files("vllm_fleet").joinpath("data"))),
        "defaults": datafiles.role_defaults(),
        "profiles": {name: profiles.resolve("installed", name) for name in profiles.names()},
        "missing": missing,
        "sbom": sbom,
        "version": vllm_fleet.__version__,
        "installed_version": importlib.metadata.version("vllm-fleet"),
    },
    sys.stdout,
    default=str,
)
"""


def _clean_env():
    """The environment without the machine's pip settings (its indexes, find-links, constraints) or a PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def test_the_packages_role_defaults_are_links_to_the_roles_own_files():
    """One home for each default: the package's data/role_defaults/ROLE.yml is a link to the role's defaults/main.yml
    (Ansible reads that file), never a copy that could drift from it."""
    folder = PACKAGE / "data" / "role_defaults"
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{role}.yml" for role in datafiles.DEFAULTS_ROLES)
    for role in datafiles.DEFAULTS_ROLES:
        link, home = folder / f"{role}.yml", ROOT / "roles" / role / "defaults" / "main.yml"
        assert link.is_symlink(), f"{link} is a copy; fix: ln -sfr {home} {link}"
        assert link.resolve() == home.resolve(), f"{link} points at {link.resolve()}, not {home}"


def test_pip_install_in_a_clean_virtualenv_imports_every_module_and_reads_the_data(tmp_path):
    if not WHEELS.is_dir() or not any(WHEELS.glob("*.whl")):
        pytest.fail(f"no wheels for the library's dependencies in {WHEELS}; {FIX}")
    assert ROOT not in tmp_path.resolve().parents, f"{tmp_path} is inside the checkout"
    # setuptools builds in the source folder (its build/ there): the build gets a copy of what an sdist holds,
    # pyproject.toml and src/, the linked role defaults copied as files.
    project = tmp_path / "project"
    shutil.copytree(PACKAGE.parent, project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy2(ROOT / "pyproject.toml", project)
    venv.create(tmp_path / "venv", with_pip=True, system_site_packages=False, symlinks=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    install = [python, "-m", "pip", "install", "--quiet", "--no-cache-dir", "--no-index", "--find-links", str(WHEELS)]
    done = subprocess.run(
        [*install, str(project)], cwd=tmp_path, env=_clean_env(), capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        pytest.fail(
            f"pip install . from {WHEELS} alone failed (a dependency of pyproject.toml that is not there: the wheels"
            f" predate a change of pyproject.toml or requirements/controller.txt); {FIX}\n{done.stderr[-3000:]}"
        )

    done = subprocess.run(
        [python, "-I", "-c", CHECK], cwd=tmp_path, env=_clean_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    installed = json.loads(done.stdout)

    site = tmp_path / "venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    assert Path(installed["file"]).resolve() == (site / "vllm_fleet" / "__init__.py").resolve()
    assert not [entry for entry in installed["path"] if entry.startswith(str(ROOT))]
    # Every module of the checkout, imported from the installed package (an unpackaged one would be missing here),
    # with everything it imports, where it is used too; the SBOM's schema check with it.
    assert installed["modules"] == sorted(f"vllm_fleet.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert installed["missing"] == {}, "pyproject.toml's dependencies leave out what these modules import"
    assert installed["sbom"] == "installed"
    # pyproject.toml's version is read from the package's __version__, its one home (tests/unit/test_version.py).
    assert installed["version"] == installed["installed_version"] == __version__
    data = sorted(str(p.relative_to(PACKAGE / "data")) for p in (PACKAGE / "data").rglob("*") if p.is_file())
    assert installed["data"] == data, "pyproject.toml's [tool.setuptools.package-data] leaves out a data file"

    # The roles' defaults as Ansible reads them from roles/ROLE/defaults/main.yml, in the plan's order.
    defaults = {}
    for role in datafiles.DEFAULTS_ROLES:
        defaults.update(yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {})
    assert installed["defaults"] == json.loads(json.dumps(defaults, default=str))
    assert isinstance(installed["defaults"]["vllm_port"], int) and installed["defaults"]["vllm_instance"]

    shipped = yaml.safe_load((PACKAGE / "data" / "profiles.yml").read_text())["profiles"]
    assert installed["profiles"] and set(installed["profiles"]) == set(shipped)
    for name, profile in installed["profiles"].items():
        assert profile == json.loads(json.dumps(shipped[name]["settings"], default=str)), name
        assert profile["model"], name
