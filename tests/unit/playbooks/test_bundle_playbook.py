"""playbooks/bundle.yml as an operator runs it on the site's mirror (here a local connection): a bundle signed with
the site's key is served, a second run changes nothing, --check writes nothing; a bundle with an altered file, or
signed with another key, is refused with the file or the key named, and the mirror still serves what it served. The
bundles are real (vllm_fleet.bundle, the real minisign); see tests/unit/vllm_fleet/test_bundle.py for the format."""

import hashlib
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from bundle_helpers import make_collection_project, make_keys, make_project, make_staging, serve_folder
from vllm_fleet import bundle

ROOT = Path(__file__).resolve().parents[3]


def tree(folder):
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def run(inventory, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), "playbooks/bundle.yml", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def flat(inventory, *extra):
    """run(), its output on one line (the callback folds long messages)."""
    rc, out = run(inventory, *extra)
    return rc, " ".join(out.split())


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    pub, sec = make_keys(root / "keys")
    _, other_sec = make_keys(root / "other-keys")
    staging, project = make_staging(root), make_project(root)
    good = root / "site-2026-12.tar"
    bundle.build(staging, project, sec, good)
    # The same bundle with one wheel altered after signing (its manifest and signature as built).
    altered = root / "altered.tar"
    with tarfile.open(good) as src, tarfile.open(altered, "w", format=tarfile.PAX_FORMAT) as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read()
            if member.name.endswith("model.safetensors"):
                data = b"X" + data[1:]
            dst.addfile(member, io.BytesIO(data))
    forged = root / "forged.tar"
    bundle.build(staging, project, other_sec, forged)
    # What the mirror served before (last month's bundle: one file less).
    (staging / "models" / "tiny-qwen2" / "model.safetensors").unlink()
    previous = root / "previous.tar"
    bundle.build(staging, project, sec, previous)
    mirror = root / "mirror"
    (mirror / "unrelated").mkdir(parents=True)
    (mirror / "unrelated" / "keep.txt").write_text("the site's own file\n")
    inventory = root / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "vllm_mirrors": {
                    "hosts": {
                        "mirror-1": {
                            "ansible_connection": "local",
                            "ansible_python_interpreter": sys.executable,
                            "vllm_bundle": str(good),
                            "vllm_bundle_public_key": str(pub),
                            "vllm_bundle_mirror_root": str(mirror),
                        }
                    }
                }
            }
        )
    )
    return {
        "root": root,
        "inventory": inventory,
        "mirror": mirror,
        "altered": altered,
        "forged": forged,
        "good": good,
        "previous": previous,
    }


@pytest.mark.integration
def test_a_signed_bundle_is_served_once_and_a_second_run_changes_nothing(site):
    rc, out = run(site["inventory"], "--check")
    assert rc == 0, out
    assert sorted(tree(site["mirror"])) == ["unrelated/keep.txt"], "check mode wrote into the mirror"
    rc, out = run(site["inventory"])
    assert rc == 0, out
    served = tree(site["mirror"])
    assert "models/tiny-qwen2/model.safetensors" in served and "unrelated/keep.txt" in served
    assert "BUNDLE.sha256" in served and "sbom.cdx.json" in served
    assert "vllm-fleet bundle site-2026-12" in out and "changed=1" in out
    rc, out = run(site["inventory"])
    assert rc == 0 and "changed=0" in out and "already served, nothing changed (every file checked)" in out, out


@pytest.mark.integration
@pytest.mark.parametrize(
    ("which", "says"),
    [
        ("altered", "models/tiny-qwen2/model.safetensors: SHA-256"),
        ("forged", "site.pub"),
    ],
)
def test_a_bad_bundle_is_refused_by_name_and_the_mirror_keeps_serving_what_it_served(site, which, says):
    rc, out = run(site["inventory"], "-e", f"vllm_bundle={site['previous']}")
    assert rc == 0, out
    before = tree(site["mirror"])
    assert "models/tiny-qwen2/model.safetensors" not in before
    rc, out = run(site["inventory"], "-e", f"vllm_bundle={site[which]}")
    assert rc != 0 and says in out, out
    assert "Traceback" not in out
    assert tree(site["mirror"]) == before


@pytest.mark.integration
def test_an_altered_served_bundle_is_refused_and_verify_names_what_changed_on_the_mirror(site):
    """Issue #50: the bundle already served, one file altered in the archive, is read and refused; the mirror's
    files altered, added or missing in place are named by -e vllm_bundle_verify=true, which writes nothing."""
    rc, out = flat(site["inventory"])
    assert rc == 0, out
    served = tree(site["mirror"])
    rc, out = flat(site["inventory"], "-e", f"vllm_bundle={site['altered']}")
    assert rc != 0 and "models/tiny-qwen2/model.safetensors: SHA-256" in out and "already served" not in out, out
    assert tree(site["mirror"]) == served
    rc, out = flat(site["inventory"], "-e", "vllm_bundle_verify=true")
    assert rc == 0 and "changed=0" in out and "serves vllm-fleet bundle site-2026-12" in out, out
    collection = site["mirror"] / "collections" / "ansible_collections" / "ns" / "name"
    (collection / "galaxy.yml").write_text("name: altered\n")
    (collection / "FILES.json").write_text("{}\n")
    (site["mirror"] / "debian" / "dists" / "bookworm" / "InRelease").unlink()
    changed = tree(site["mirror"])
    for extra in ((), ("--check",)):
        rc, out = flat(site["inventory"], "-e", "vllm_bundle_verify=true", "-e", "vllm_bundle=/nonexistent", *extra)
        assert rc != 0 and "Traceback" not in out, out
        for said in (
            "1 altered: collections/ansible_collections/ns/name/galaxy.yml (SHA-256 ",
            "1 added: collections/ansible_collections/ns/name/FILES.json",
            "1 missing: debian/dists/bookworm/InRelease",
        ):
            assert said in out, out
        assert tree(site["mirror"]) == changed
    rc, out = flat(site["inventory"])
    assert rc == 0 and "served again, its files having differed on the mirror" in out, out
    assert tree(site["mirror"]) == served
    rc, out = flat(site["inventory"], "-e", "vllm_bundle_verify=true")
    assert rc == 0, out


@pytest.fixture(scope="module")
def collection_site(tmp_path_factory):
    """A bundle whose project is a collection (vllm_fleet.fleet 1.2.3, as scripts/bundle.sh builds this project's),
    a mirror folder served over HTTP on loopback, and an inventory whose controller installs the collection into a
    folder of its own."""
    root = tmp_path_factory.mktemp("collection-site")
    pub, sec = make_keys(root / "keys")
    good = root / "site-2026-12.tar"
    bundle.build(make_staging(root), make_collection_project(root, "1.2.3"), sec, good)
    mirror = root / "mirror"
    mirror.mkdir()
    with serve_folder(mirror) as server:
        inventory = root / "hosts.yml"
        mirror_vars = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "vllm_bundle": str(good),
            "vllm_bundle_public_key": str(pub),
            "vllm_bundle_mirror_root": str(mirror),
            "vllm_signed_manifest_url": f"{server.url}/BUNDLE.sha256",
            "vllm_signed_manifest_public_key": str(pub),
            "vllm_bundle_collections_path": str(root / "controller-collections"),
        }
        inventory.write_text(yaml.safe_dump({"vllm_mirrors": {"hosts": {"mirror-1": mirror_vars}}}))
        yield {"inventory": inventory, "installed": root / "controller-collections", "mirror": mirror}


@pytest.mark.integration
def test_the_bundles_collection_is_installed_on_the_controller_once_and_checked_file_for_file(collection_site):
    """Issue #51: bundle.yml installs the collection the signed bundle carries on the controller, from the mirror it
    has just served, against the signed digest; --check installs nothing, a second run changes nothing, and a file
    altered in the installed copy is named by -e vllm_bundle_verify=true and put back by the next run."""
    folder = collection_site["installed"] / "ansible_collections" / "vllm_fleet" / "fleet"
    rc, out = flat(collection_site["inventory"], "--check")
    assert rc == 0 and not folder.exists(), out
    rc, out = flat(collection_site["inventory"])
    assert rc == 0, out
    assert f"vllm_fleet.fleet 1.2.3 on the controller ({folder}): installed from the signed bundle" in out, out
    assert "the signed bundle, collection/vllm_fleet-fleet-1.2.3.tar.gz (it differed: not installed)." in out
    assert (folder / "roles" / "demo" / "tasks" / "main.yml").is_file() and not (folder / "tests").exists()
    rc, out = flat(collection_site["inventory"])
    assert rc == 0 and "changed=0" in out, out
    assert "file for file the signed bundle, collection/vllm_fleet-fleet-1.2.3.tar.gz." in out
    rc, out = flat(collection_site["inventory"], "-e", "vllm_bundle_verify=true")
    assert rc == 0 and "changed=0" in out, out
    (folder / "roles" / "demo" / "tasks" / "main.yml").write_text("---\n- name: Something else\n")
    before = tree(folder)
    rc, out = flat(collection_site["inventory"], "-e", "vllm_bundle_verify=true")
    assert rc != 0 and "altered: roles/demo/tasks/main.yml (SHA-256" in out, out
    assert "fix: run playbooks/bundle.yml without vllm_bundle_verify to install it" in out and "Traceback" not in out
    assert tree(folder) == before, "verify changed the installed copy"
    rc, out = flat(collection_site["inventory"])
    assert rc == 0 and "installed from the signed bundle" in out and "(it differed: altered: roles/demo" in out, out
    assert (folder / "roles" / "demo" / "tasks" / "main.yml").read_text().startswith("---\n- name: Say so")
