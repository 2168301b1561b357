"""The collection vllm_fleet.fleet as an operator in the air gap installs it: the signed bundle of this checkout's HEAD
(vllm_fleet.bundle, as scripts/bundle.sh builds it) carries the tarball `ansible-galaxy collection build` makes;
playbooks/bundle.yml serves the bundle from a mirror (here a folder served over HTTP on loopback) and installs the
tarball into a clean collections folder on the controller, checked against the signed digest. Then, from a folder
outside the checkout, with an ansible.cfg that names only that folder and the controller's other collections (its
dependencies), the playbooks run by their full names: playbooks/plan.yml plans the lab's vLLM hosts, every playbook
passes --syntax-check, and ansible-doc shows every filter, module, callback and role of the collection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bundle_helpers import make_keys, make_staging, serve_folder
from conftest import ROOT, load_source
from vllm_fleet import __version__, bundle

pytestmark = pytest.mark.integration

COLLECTION = "vllm_fleet.fleet"
TOOLS = Path(sys.executable).parent
# What the tarball carries at its top: the product, its library and templates, and the collection's own files.
CARRIED = {
    "CHANGELOG.md",
    "FILES.json",
    "MANIFEST.json",
    "README.md",
    "docs",
    "inventories",
    "meta",
    "playbooks",
    "plugins",
    "roles",
    "src",
    "templates",
}


def _run(
    tool: str, *args: str, cwd: Path, config: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    env = {
        "PATH": f"{TOOLS}:/usr/bin:/bin",
        "HOME": str(cwd),
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_LOCAL_TEMP": str(cwd / "tmp"),
    }
    if config is not None:
        env["ANSIBLE_CONFIG"] = str(config)
    if os.environ.get("CACHE_DIR"):
        env["CACHE_DIR"] = os.environ["CACHE_DIR"]
    return subprocess.run(
        [str(TOOLS / tool), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Iterator[dict[str, Path]]:
    """This checkout's HEAD in a signed bundle, served and its collection installed by playbooks/bundle.yml into a
    clean folder; the ansible.cfg of a site's inventory repository that uses it (that folder, then the controller's
    dependencies: .cache/collections)."""
    work = tmp_path_factory.mktemp("collection")
    pub, sec = make_keys(work / "keys")
    built = bundle.build(make_staging(work), ROOT, sec, work / "site.tar", allow_dirty=True)
    mirror, collections = work / "mirror", work / "installed"
    mirror.mkdir()
    with serve_folder(mirror) as server:
        mirror_vars = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "vllm_bundle": str(built.out),
            "vllm_bundle_public_key": str(pub),
            "vllm_bundle_mirror_root": str(mirror),
            "vllm_signed_manifest_url": f"{server.url}/BUNDLE.sha256",
            "vllm_signed_manifest_public_key": str(pub),
            "vllm_bundle_collections_path": str(collections),
        }
        (work / "hosts.yml").write_text(yaml.safe_dump({"vllm_mirrors": {"hosts": {"mirror-1": mirror_vars}}}))
        served = _run(
            "ansible-playbook", "-i", str(work / "hosts.yml"), str(ROOT / "playbooks" / "bundle.yml"),
            cwd=work, config=ROOT / "ansible.cfg",
        )  # fmt: skip
        assert served.returncode == 0, served.stdout[-4000:] + served.stderr[-2000:]
        said = " ".join(served.stdout.split())
        assert f"{COLLECTION} {__version__} on the controller" in said, served.stdout[-3000:]
        tarball = mirror / "collection" / f"vllm_fleet-fleet-{__version__}.tar.gz"
        assert tarball.is_file(), sorted(p.name for p in mirror.iterdir())
        dependencies = Path(os.environ.get("COLLECTIONS_DIR") or ROOT / ".cache" / "collections")
        config = work / "ansible.cfg"
        config.write_text(
            "[defaults]\n"
            f"collections_path = {collections}:{dependencies}\n"
            f"callbacks_enabled = {COLLECTION}.vllm_preload\n"
            "interpreter_python = auto_silent\n"
        )
        root = collections / "ansible_collections" / "vllm_fleet" / "fleet"
        assert (root / "MANIFEST.json").is_file()
        # This mirror as the lab's (its signed manifest, and where the hosts' wheelhouse and model would come from),
        # with the key that signed it: plan.yml checks the installed collection against the bundle's tarball.
        # The lab's adapter is left out: this mirror carries no adapters/ (the plan reads them from the lab's own,
        # test_lora.py and the fleet scenario).
        signed = (
            "-e", f"lab_mirror_url={server.url}", "-e", f"vllm_signed_manifest_public_key={pub}",
            "-e", '{"vllm_lora_adapters": []}',
        )  # fmt: skip
        yield {"work": work, "tarball": tarball, "config": config, "root": root, "signed": signed}


def test_the_tarball_is_the_projects_version_and_carries_the_product_only(installed):
    with tarfile.open(installed["tarball"]) as tar:
        names = tar.getnames()
        manifest = json.load(tar.extractfile("MANIFEST.json"))
        links = {m.name: m.linkname for m in tar.getmembers() if m.issym()}
    assert manifest["collection_info"]["version"] == __version__
    assert manifest["collection_info"]["namespace"] == "vllm_fleet" and manifest["collection_info"]["name"] == "fleet"
    assert set(manifest["collection_info"]["dependencies"]) == {"ansible.posix", "community.general"}
    assert {name.split("/")[0] for name in names} == CARRIED
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc") or "/.cache/" in n]
    # The library's package data are links to the roles' defaults (their one home): kept inside the collection.
    for name, target in links.items():
        assert os.path.normpath(os.path.join(os.path.dirname(name), target)) in names, (name, target)
    assert (installed["root"] / "src" / "vllm_fleet" / "data" / "role_defaults" / "vllm.yml").read_text() == (
        ROOT / "roles" / "vllm" / "defaults" / "main.yml"
    ).read_text()


def test_the_plan_runs_from_the_installed_collection(installed):
    """playbooks/plan.yml by its full name, from a folder outside the checkout: the lab's vLLM hosts planned with the
    installed roles, filters and library (the gateways need the lab's certificates, made when the lab runs), and the
    installed collection checked against the signed bundle's tarball, file for file."""
    work = installed["work"]
    done = _run(
        "ansible-playbook", "-i", str(ROOT / "lab" / "inventory"), f"{COLLECTION}.plan", "-l", "vllm_nodes",
        *installed["signed"], cwd=work, config=installed["config"],
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    said = " ".join(done.stdout.split())
    assert f"{COLLECTION} {__version__} ({installed['root']}) is the signed tarball, file for file." in said, said[
        -3000:
    ]
    assert "vllm_fleet.fleet.vllm_plan : Compute the plan of every host" in done.stdout
    plan = json.loads((work / "reports" / "plan.json").read_text())
    assert plan["vllm_fleet_version"] == __version__
    assert "lab-1" in plan["hosts"], sorted(plan["hosts"])


def test_every_playbook_passes_syntax_check_from_the_installed_collection(installed):
    playbooks = sorted(p.stem for p in (installed["root"] / "playbooks").glob("*.yml"))
    assert "site" in playbooks and "plan" in playbooks, playbooks
    failed = {}
    for name in playbooks:
        done = _run(
            "ansible-playbook", "-i", str(ROOT / "inventories" / "production"), "--syntax-check",
            f"{COLLECTION}.{name}", cwd=installed["work"], config=installed["config"],
        )  # fmt: skip
        if done.returncode != 0 or "ERROR" in done.stderr:
            failed[name] = done.stderr[-1500:]
        elif name == "site":
            assert str(installed["root"] / "playbooks" / "site.yml") in done.stdout, done.stdout
    assert failed == {}, failed


def _listed(kind: str, config: Path, cwd: Path) -> dict[str, str]:
    done = _run("ansible-doc", "-t", kind, "--list", "--json", COLLECTION, cwd=cwd, config=config)
    assert done.returncode == 0 and "ERROR" not in done.stderr, done.stderr
    return json.loads(done.stdout)


def test_ansible_doc_shows_every_plugin_and_role_of_the_installed_collection(installed):
    config, work = installed["config"], installed["work"]
    exported = set()
    for path in sorted((ROOT / "plugins" / "filter").glob("*.py")):
        exported |= set(load_source(f"collection_{path.stem}", path).FilterModule().filters())
    wanted = {
        "filter": {f"{COLLECTION}.{name}" for name in exported},
        "module": {f"{COLLECTION}.{p.stem}" for p in (ROOT / "plugins" / "modules").glob("*.py")},
        "callback": {f"{COLLECTION}.{p.stem}" for p in (ROOT / "plugins" / "callback").glob("*.py")},
        "role": {
            f"{COLLECTION}.{p.name}"
            for p in (ROOT / "roles").iterdir()
            if (p / "meta" / "argument_specs.yml").is_file()
        },
    }
    for kind, names in wanted.items():
        assert names, kind
        assert set(_listed(kind, config, work)) == names, kind
        shown = _run("ansible-doc", "-t", kind, "--json", *sorted(names), cwd=work, config=config)
        assert shown.returncode == 0 and "ERROR" not in shown.stderr and "WARNING" not in shown.stderr, shown.stderr
        docs = json.loads(shown.stdout)
        assert set(docs) == names, (kind, names - set(docs))
        if kind in ("filter", "module"):
            no_examples = sorted(name for name, doc in docs.items() if not (doc.get("examples") or "").strip())
            assert no_examples == [], f"{kind}s without examples: {no_examples}"
            unreadable = sorted(name for name, doc in docs.items() if yaml.safe_load(doc["examples"]) is None)
            assert unreadable == [], f"{kind}s whose examples are not YAML: {unreadable}"


def test_the_production_example_pins_the_collection_of_this_version():
    """inventories/production/requirements.yml names the tarball of this version that the site's mirror serves
    (collection/ of the signed bundle), and the collection's dependencies as galaxy.yml declares them."""
    pins = yaml.safe_load((ROOT / "inventories" / "production" / "requirements.yml").read_text())["collections"]
    galaxy = yaml.safe_load((ROOT / "galaxy.yml").read_text())
    urls = [pin["name"] for pin in pins if pin.get("type") == "url"]
    assert [url.rsplit("/", 2)[-2:] for url in urls] == [["collection", f"vllm_fleet-fleet-{__version__}.tar.gz"]]
    assert {pin["name"]: pin["version"] for pin in pins if "version" in pin} == galaxy["dependencies"]
