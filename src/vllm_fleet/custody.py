"""The chain of custody from the signed bundle to each host.

The mirror serves the manifest of the bundle it unpacked (``BUNDLE.sha256``, ``sha256sum`` format) and its minisign
signature (``BUNDLE.sha256.minisig``) at its root (docs/air-gap.md). The controller reads both once a run, checks the
signature with the site's public key, and gives each host the SHA-256 the signed manifest lists for the two files
that vouch for everything else it takes from the mirror: a wheelhouse's ``requirements.lock`` (whose every line
carries its wheel's SHA-256, which pip checks) and a model's ``SHA256SUMS`` (against which each of its files is
checked as it lands and again before use). A host that finds another digest stops before it changes anything.
On the controller, the collections Ansible loads are checked against it too: those of ``collections/`` file for file
(:func:`collection_errors`), and this project's own collection against the tarball the bundle carries
(:func:`fleet_collection`; playbooks/bundle.yml installs it, :func:`installed_errors` checks the copy it installed).

Standard library only, and the ``minisign`` program.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

SIGNATURE_SUFFIX = ".minisig"
MAX_MANIFEST = 64 * 1024 * 1024
MAX_SIGNATURE = 64 * 1024
_LINE = re.compile(r"^([0-9a-f]{64})  (\S(?:.*\S)?)$")


class CustodyError(ValueError):
    """A signed manifest that cannot be read or trusted, or a file it does not vouch for: the message says which,
    and the fix."""


@dataclass(frozen=True)
class SignedManifest:
    url: str
    digests: dict[str, str] = field(repr=False)
    trusted_comment: str
    manifest_sha256: str

    @property
    def base(self) -> str:
        """The mirror's root: where the manifest's relative paths start."""
        return self.url.rsplit("/", 1)[0]

    def as_dict(self) -> dict[str, object]:
        return {
            "url": self.url,
            "base": self.base,
            "digests": dict(self.digests),
            "trusted_comment": self.trusted_comment,
            "manifest_sha256": self.manifest_sha256,
            "bundle": bundle_of(self.trusted_comment, self.manifest_sha256),
        }


# vllm_fleet.bundle.build's trusted comment; bundles built before 0.2.0 end at the commit, with no version.
_COMMENT = re.compile(
    r"^vllm-fleet bundle (?P<name>.+), [0-9]+ files, [0-9]+ bytes, project (?P<commit>[0-9a-f]+(?:\+changes)?)"
    r"(?:, version (?P<version>[^\s,]+))?$"
)


def bundle_of(comment: str, manifest_sha256: str) -> dict[str, str]:
    """The bundle a signed manifest belongs to: its name, project commit and vllm-fleet version, as scripts/bundle.sh
    signs them into the trusted comment (vllm_fleet.bundle.build), and the manifest's SHA-256. A comment of another
    shape (a bundle signed by other means) is kept whole as the name, with no commit; one without a version (a bundle
    built before 0.2.0) has version ""."""
    found = _COMMENT.match(comment)
    return {
        "name": found["name"] if found else comment,
        "commit": found["commit"] if found else "",
        "version": (found["version"] or "") if found else "",
        "manifest_sha256": manifest_sha256,
    }


def parse(text: str, source: str) -> dict[str, str]:
    """{relative path: SHA-256} of a manifest in ``sha256sum`` format; a line of another shape, a path that climbs
    out or an absolute one, or a path listed twice is refused, naming the line."""
    digests: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line:
            continue
        match = _LINE.match(line)
        if match is None:
            raise CustodyError(f"{source}, line {number}, is not '<sha256>  <path>': {line[:120]!r}")
        digest, path = match.groups()
        if path.startswith("/") or ".." in path.split("/"):
            raise CustodyError(f"{source}, line {number}, names a path outside the mirror: {path!r}")
        if path in digests:
            raise CustodyError(f"{source}, line {number}, lists {path!r} a second time")
        digests[path] = digest
    if not digests:
        raise CustodyError(f"{source} lists no file")
    return digests


def _fetch(url: str, limit: int, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            data: bytes = answer.read(limit + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise CustodyError(f"could not read {url}: {reason}") from exc
    if len(data) > limit:
        raise CustodyError(f"{url} is larger than {limit} bytes: not a manifest or its signature")
    return data


def verify(minisign: str, public_key: str, manifest: bytes, signature: bytes, url: str) -> str:
    """The trusted comment of `signature` when minisign verifies it for `manifest` with `public_key`."""
    with tempfile.TemporaryDirectory(prefix="vllm-custody-") as folder:
        manifest_path, signature_path = os.path.join(folder, "manifest"), os.path.join(folder, "manifest.minisig")
        with open(manifest_path, "wb") as out:
            out.write(manifest)
        with open(signature_path, "wb") as out:
            out.write(signature)
        proc = subprocess.run(
            [minisign, "-V", "-p", public_key, "-m", manifest_path, "-x", signature_path],
            capture_output=True,
            text=True,
            env=dict(os.environ, LC_ALL="C"),
            check=False,
        )
    if proc.returncode != 0:
        said = " ".join((proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}").split())
        raise CustodyError(
            f"the signature of {url} does not verify with the site's public key {public_key} ({said}): the mirror "
            "serves a manifest the site did not sign; fix: serve the site's signed bundle again with "
            "playbooks/bundle.yml, and check the key (vllm_signed_manifest_public_key)"
        )
    for line in proc.stdout.splitlines():
        if line.startswith("Trusted comment: "):
            return line[len("Trusted comment: ") :]
    return ""


def read(url: str, public_key: str, timeout: float = 30.0) -> SignedManifest:
    """The mirror's manifest at `url`, its signature (`url` + ``.minisig``) checked with `public_key` first."""
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise CustodyError(f"{url!r} is not an http(s) URL of the mirror's BUNDLE.sha256")
    if not os.path.isfile(public_key):
        raise CustodyError(
            f"the site's public key {public_key} is not a file on the controller; fix: the site.pub that "
            "scripts/bundle.sh signed with (vllm_signed_manifest_public_key)"
        )
    minisign = shutil.which("minisign")
    if minisign is None:
        raise CustodyError("minisign is not installed on the controller; fix: apt-get install minisign")
    manifest = _fetch(url, MAX_MANIFEST, timeout)
    signature = _fetch(url + SIGNATURE_SUFFIX, MAX_SIGNATURE, timeout)
    comment = verify(minisign, public_key, manifest, signature, url)
    try:
        text = manifest.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CustodyError(f"{url} is not UTF-8 text") from exc
    return SignedManifest(url, parse(text, url), comment, hashlib.sha256(manifest).hexdigest())


def relative(base: str, location: str) -> str | None:
    """The path of the folder at `location` under the mirror's root `base` (the signed manifest's folder), or None
    when it is not under it."""
    root, folder = base.rstrip("/") + "/", location.rstrip("/")
    return folder[len(root) :] if folder.startswith(root) and len(folder) > len(root) else None


def digest_of(signed: dict[str, object], location: str, name: str) -> str:
    """The SHA-256 the signed manifest (`SignedManifest.as_dict()`) lists for `name` in the folder at `location` (a
    URL under the mirror's root); refused, naming both, when the folder is elsewhere or the file is not listed."""
    base = str(signed["base"]).rstrip("/")
    folder = relative(base, location)
    if folder is None:
        raise CustodyError(
            f"{location.rstrip('/')} is not under the mirror whose signed manifest is read ({base}/): nothing vouches "
            "for what it serves; fix: serve it from that mirror (the signed bundle's entries), or leave "
            "vllm_signed_manifest_url empty for a site without a signed bundle"
        )
    path = f"{folder}/{name}"
    digests = signed["digests"]
    assert isinstance(digests, dict)
    if path not in digests:
        raise CustodyError(
            f"the signed manifest {signed['url']} does not list {path}: the site did not sign it; fix: build the "
            "bundle with it (scripts/bundle.sh) and serve that bundle"
        )
    return str(digests[path])


COLLECTIONS = "collections/ansible_collections/"
NAMED = 10  # files named per kind in an error; the count says the rest


def sha256_file(path: str | os.PathLike[str]) -> tuple[str, int]:
    """The file's SHA-256 (hex) and size, read in chunks of a MiB (the bundle's build, a wheelhouse's lock and the
    controller's collections all hash files so)."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _loaded_from(roots: list[str], namespace: str, name: str) -> str | None:
    """The folder Ansible loads the collection NS.NAME from: ``ansible_collections/NS/NAME`` under the first of
    `roots` (the controller's collections paths, in order) that has it; None when none has it."""
    for root in roots:
        folder = os.path.join(os.path.expanduser(root), "ansible_collections", namespace, name)
        if os.path.isdir(folder):
            return folder
    return None


def _differences(
    folder: str, wanted: dict[str, str], ignored: tuple[str, ...] = (), links_altered: bool = False
) -> list[str]:
    """What differs between the files under `folder` and `wanted` ({relative path: SHA-256}): ``altered: ...``,
    ``missing: ...``, ``added: ...`` (at most NAMED files named each, then a count), byte-code caches aside on either
    side; `ignored` files are not counted as added; with `links_altered`, a link is altered whatever it points at."""
    found = {}
    for top, folders, names in os.walk(folder):
        folders[:] = sorted(f for f in folders if f != "__pycache__")
        for file_name in names:
            full = os.path.join(top, file_name)
            found[os.path.relpath(full, folder)] = full
    altered = [
        f"{rel} (SHA-256 {sha256_file(found[rel])[0]}, signed {wanted[rel]})"
        for rel in sorted(wanted)
        if rel in found
        and ((links_altered and os.path.islink(found[rel])) or sha256_file(found[rel])[0] != wanted[rel])
    ]
    missing = sorted(rel for rel in wanted if rel not in found)
    added = sorted(rel for rel in found if rel not in wanted and rel not in ignored)
    said = []
    for kind, listed in (("altered", altered), ("missing", missing), ("added", added)):
        if listed:
            more = f" and {len(listed) - NAMED} more" if len(listed) > NAMED else ""
            said.append(f"{kind}: {', '.join(listed[:NAMED])}{more}")
    return said


def collection_errors(digests: dict[str, str], roots: list[str]) -> tuple[list[str], list[str]]:
    """(errors, checked) of the collections the signed manifest carries (``collections/ansible_collections/NS/NAME/``),
    each as this controller's Ansible loads it: from the first of `roots` (its collections paths, in order) that has
    ``ansible_collections/NS/NAME``. Every file there is compared with the signed digests: one altered, missing or
    added fails it, named; Python's byte-code caches (``__pycache__``, which Python writes where it may) are not the
    collection's, on either side. A collection the
    controller does not have is not checked (Ansible would not load it)."""
    signed: dict[tuple[str, str], dict[str, str]] = {}
    for path, digest in digests.items():
        if path.startswith(COLLECTIONS):
            parts = path[len(COLLECTIONS) :].split("/", 2)
            if len(parts) == 3 and "__pycache__" not in parts[2].split("/"):
                signed.setdefault((parts[0], parts[1]), {})[parts[2]] = digest
    errors, checked = [], []
    for (namespace, name), files in sorted(signed.items()):
        folder = _loaded_from(roots, namespace, name)
        if folder is None:
            continue
        checked.append(f"{namespace}.{name}")
        # A link stands for a file it is not: the signed collections/ tree holds none.
        said = _differences(folder, files, links_altered=True)
        if said:
            errors.append(
                f"the collection {namespace}.{name} this controller loads ({folder}) is not the one the site signed: "
                + "; ".join(said)
                + "; fix: install the collections from the signed mirror's collections/ folder (its "
                "ansible_collections/ on the controller's collections_path), or remove the copy that comes first"
            )
    return errors, checked


# The bundle's collection of this project (vllm_fleet.bundle builds it: collection/NS-NAME-VERSION.tar.gz).
FLEET_COLLECTION = "collection/"
MAX_COLLECTION = 64 << 20


@dataclass(frozen=True)
class CollectionTarball:
    """What a collection tarball says of itself: its name, version and every file with its SHA-256 (FILES.json)."""

    namespace: str
    name: str
    version: str
    files: dict[str, str]

    @property
    def fqcn(self) -> str:
        return f"{self.namespace}.{self.name}"


def read_tarball(path: str | os.PathLike[str]) -> CollectionTarball:
    """The MANIFEST.json and FILES.json of a collection tarball (``ansible-galaxy collection build``'s)."""
    try:
        with tarfile.open(path) as tar:
            manifest, files = (tar.extractfile(name) for name in ("MANIFEST.json", "FILES.json"))
            if manifest is None or files is None:
                raise KeyError("MANIFEST.json")
            info = json.load(manifest)["collection_info"]
            listed = json.load(files)["files"]
    except (OSError, tarfile.TarError, KeyError, ValueError, TypeError) as exc:
        raise CustodyError(
            f"{path} is not a collection tarball ({exc}); fix: serve the site's signed bundle again"
        ) from exc
    return CollectionTarball(
        str(info["namespace"]),
        str(info["name"]),
        str(info["version"]),
        {str(f["name"]): str(f["chksum_sha256"]) for f in listed if f.get("ftype") == "file"},
    )


def installed_errors(tarball: CollectionTarball, folder: str) -> list[str]:
    """What differs between the collection installed in `folder` (``.../ansible_collections/NS/NAME``) and the
    tarball it should be: each file altered, missing or added (byte-code caches aside), and MANIFEST.json and
    FILES.json, which ``ansible-galaxy collection install`` copies from the tarball. Empty when they are the same."""
    said = _differences(folder, tarball.files, ignored=("MANIFEST.json", "FILES.json"))
    manifest = os.path.join(folder, "MANIFEST.json")
    try:
        with open(manifest, encoding="utf-8") as handle:
            version = json.load(handle)["collection_info"]["version"]
    except (OSError, ValueError, KeyError, TypeError):
        version = None
    if version != tarball.version:
        said.insert(0, f"version {version or 'unknown'} installed, {tarball.version} signed")
    return said


def installed_at(tarball: CollectionTarball, roots: list[str]) -> str | None:
    """The folder Ansible loads the tarball's collection from (the first of `roots` that has it), or None."""
    return _loaded_from(roots, tarball.namespace, tarball.name)


def fetch_tarball(signed: SignedManifest, folder: str, timeout: float = 30.0) -> tuple[str, str]:
    """(its path in the bundle, the file in `folder`) of this project's collection tarball, which the signed manifest
    lists under ``collection/``: read from the mirror beside the manifest and checked against its signed digest."""
    carried = sorted(path for path in signed.digests if path.startswith(FLEET_COLLECTION) and path.endswith(".tar.gz"))
    if len(carried) != 1:
        raise CustodyError(
            f"the signed manifest {signed.url} lists {len(carried) or 'no'} collection tarball(s) under "
            f"{FLEET_COLLECTION}: a bundle carries one, vllm_fleet.bundle builds it; fix: build the bundle with "
            "scripts/bundle.sh from this version's checkout and serve it"
        )
    path = carried[0]
    url = f"{signed.base.rstrip('/')}/{path}"
    data = _fetch(url, MAX_COLLECTION, timeout)
    digest = hashlib.sha256(data).hexdigest()
    if digest != signed.digests[path]:
        raise CustodyError(
            f"{url} has SHA-256 {digest}, the signed manifest says {signed.digests[path]}: the mirror serves a "
            "collection the site did not sign; fix: serve the site's signed bundle again with playbooks/bundle.yml"
        )
    local = os.path.join(folder, os.path.basename(path))
    with open(local, "wb") as out:
        out.write(data)
    return path, local


def fleet_collection(
    signed: SignedManifest, roots: list[str], timeout: float = 30.0
) -> tuple[list[str], dict[str, str] | None]:
    """(errors, what was found) of this project's collection where the signed manifest carries its tarball
    (``collection/*.tar.gz``): the tarball is read from the mirror beside the manifest and checked against its signed
    digest, then the copy this controller's Ansible loads (the first of `roots` that has it) is compared with it file
    for file. A checkout (galaxy.yml, no MANIFEST.json: a development copy) is said, not checked; a controller that
    has no copy is said too. (None when the manifest carries no collection tarball.)"""
    if not any(path.startswith(FLEET_COLLECTION) for path in signed.digests):
        return [], None
    try:
        with tempfile.TemporaryDirectory(prefix="vllm-custody-") as work:
            path, local = fetch_tarball(signed, work, timeout)
            tarball = read_tarball(local)
    except CustodyError as exc:
        return [str(exc)], None
    folder = installed_at(tarball, roots)
    found = {"collection": tarball.fqcn, "version": tarball.version, "tarball": path, "path": folder or ""}
    if folder is None:
        return [], dict(found, state="not installed")
    if not os.path.isfile(os.path.join(folder, "MANIFEST.json")) and os.path.isfile(os.path.join(folder, "galaxy.yml")):
        return [], dict(found, state="checkout")
    said = installed_errors(tarball, folder)
    if said:
        return [
            f"the collection {tarball.fqcn} this controller loads ({folder}) is not the one the site signed ({path}): "
            + "; ".join(said)
            + "; fix: install it from the signed bundle with playbooks/bundle.yml, or remove the copy that comes first"
        ], dict(found, state="differs")
    return [], dict(found, state="signed")
