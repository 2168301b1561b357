"""One signed archive that carries everything an air-gapped site's mirror serves, and this project.

A connected machine gathers what the site's mirror serves into a *staging* folder (``wheelhouse/<release>/``,
``models/``, ``debian/``, ``collections/ansible_collections/<ns>/<name>/``...). :func:`build` writes one
uncompressed POSIX tar of it, all under one top-level folder NAME::

    NAME/MANIFEST.sha256          every other file's SHA-256, `sha256sum` format, sorted (sha256sum -c checks it)
    NAME/MANIFEST.sha256.minisig  minisign's signature of the manifest, made with the site's key
    NAME/sbom.cdx.json            a CycloneDX SBOM of the wheels under wheelhouse/*/ and the project (in the manifest)
    NAME/<payload>                the staging folder's files, project/<project>-<commit>.tar (git archive), and
                                  collection/vllm_fleet-fleet-<version>.tar.gz (the collection built from that
                                  archive, which playbooks/bundle.yml installs on the controller)

The manifest and its signature come first, so the site (plugins/modules/vllm_bundle_unpack.py) checks the
signature before it reads anything else, then checks each file as it streams past. The signature's trusted
comment, signed too, names the bundle and the vllm-fleet version it carries:
``vllm-fleet bundle NAME, <n> files, <bytes> bytes, project <commit>, version <X.Y.Z>`` (:func:`project_version`: the
version the project's HEAD states). The SBOM names that version too (the project's component), and the vllm-fleet
that wrote it (``metadata.tools``).

Each wheelhouse's ``requirements.lock`` must carry, for every pin, the SHA-256 the manifest gives that pin's wheel
(:func:`check_locks`): the hosts' pip checks each wheel against the lock, so what they install is what is signed.

Each file is read once for its hash and once into the tar; the second read hashes it again, so a file that
changed in between fails the build rather than the site. The tar is written beside the output and renamed into
place at the end: a failed build leaves no half archive.

CLI: ``python -m vllm_fleet.bundle build --staging DIR --project DIR --secret-key FILE --out FILE.tar [--name NAME]
[--add NAME=DIR ...] [--allow-dirty]`` (scripts/bundle.sh gives it this checkout's staging folder and collections).
"""

from __future__ import annotations

import argparse
import ast
import email.parser
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import IO

from cyclonedx.contrib.license.factories import LicenseFactory
from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.output.json import JsonV1Dot6
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packageurl import PackageURL

from . import __version__, wheelhouse
from .custody import CustodyError, read_tarball, sha256_file
from .wheelhouse import normalize

MANIFEST = "MANIFEST.sha256"
SIGNATURE = MANIFEST + ".minisig"
SBOM = "sbom.cdx.json"
PROJECT = "project"
# The project as the Ansible collection vllm_fleet.fleet (ansible-galaxy collection build of HEAD's archive), for
# playbooks/bundle.yml to install on the controller: collection/vllm_fleet-fleet-<version>.tar.gz.
COLLECTION = "collection"
# What the bundle adds beside the staging folder's files: the staging folder may not hold them itself.
RESERVED = (MANIFEST, SIGNATURE, SBOM, PROJECT, COLLECTION)

CHUNK = 1 << 20
INSTALL_MINISIGN = "install it with: apt-get install minisign"
MAKE_KEY = "make the site's key pair with: minisign -G -p site.pub -s site.key (-W for a key without a password)"
# A name that sha256sum would escape (backslash, newline) or that a terminal would mangle.
_BAD_NAME = re.compile(r"[\x00-\x1f\x7f\\]")
_BUNDLE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


class BundleError(Exception):
    """An expected failure: the message names the path and the fix."""


@dataclass(frozen=True)
class Entry:
    """One file of the bundle: its path under NAME/, where it is read from, its size and SHA-256."""

    path: str
    source: Path
    size: int
    sha256: str


def staging_files(staging: Path) -> list[tuple[str, Path]]:
    """The staging folder's regular files as (relative path, path), sorted; refuses links, special files, names
    that sha256sum would escape, the bundle's own names at the top, and an empty folder."""
    if not staging.is_dir():
        raise BundleError(f"staging folder {staging} does not exist or is not a folder; fix: give --staging DIR")
    found: list[tuple[str, Path]] = []

    def walk(folder: Path, prefix: str) -> None:
        with os.scandir(folder) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                rel = prefix + entry.name
                path = Path(entry.path)
                if _BAD_NAME.search(entry.name):
                    raise BundleError(f"{path}: a control character or backslash in the name; fix: rename it")
                if entry.is_symlink():
                    raise BundleError(
                        f"{path} is a symbolic link (to {os.readlink(path)}); a bundle carries only regular files: "
                        "fix: replace it with a copy of its target (cp --dereference), or remove it"
                    )
                if entry.is_dir(follow_symlinks=False):
                    walk(path, rel + "/")
                elif entry.is_file(follow_symlinks=False):
                    found.append((rel, path))
                else:
                    raise BundleError(
                        f"{path} is a special file (socket, pipe or device); a bundle carries only regular files: "
                        "fix: remove it from the staging folder"
                    )

    walk(staging, "")
    clashes = sorted({rel.split("/")[0] for rel, _ in found} & set(RESERVED))
    if clashes:
        raise BundleError(
            f"{staging / clashes[0]}: the bundle writes {', '.join(RESERVED)} itself; "
            "fix: remove or rename it in the staging folder"
        )
    if not found:
        raise BundleError(
            f"staging folder {staging} holds no file; fix: gather the mirror's wheelhouse/, models/, debian/ and "
            "collections/ into it first"
        )
    found.sort()
    return found


def _git(project: Path, *args: str) -> str:
    try:
        proc = subprocess.run(["git", "-C", str(project), *args], capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise BundleError("git is not on PATH; fix: apt-get install git") from exc
    if proc.returncode != 0:
        raise BundleError(
            f"{project}: git {args[0]} failed: {proc.stderr.strip()}; fix: give --project a git checkout of vllm-fleet "
            "with a commit"
        )
    return proc.stdout


def project_commit(project: Path, allow_dirty: bool = False) -> str:
    """The project's HEAD (12 hex digits); refuses a checkout whose tracked files have uncommitted changes, unless
    ``allow_dirty`` (the lab's own bundle: the archive is still HEAD's, and the commit is marked ``+changes``)."""
    if not project.is_dir():
        raise BundleError(f"project folder {project} does not exist; fix: give --project the vllm-fleet checkout")
    commit = _git(project, "rev-parse", "--short=12", "HEAD").strip()
    dirty = _git(project, "status", "--porcelain", "--untracked-files=no").splitlines()
    if dirty and allow_dirty:
        return commit + "+changes"
    if dirty:
        raise BundleError(
            f"{project} has uncommitted changes ({', '.join(line[3:] for line in dirty[:5])}"
            f"{f' and {len(dirty) - 5} more' if len(dirty) > 5 else ''}) and the bundle carries commit {commit}; "
            "fix: commit (or stash) them first"
        )
    return commit


def _version_in_init(text: str) -> str | None:
    """``__version__``'s value in the text of a package's __init__.py (a plain string assignment), else None."""
    for node in ast.parse(text).body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(target, "id", None) for target in node.targets] == ["__version__"]
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    return None


def _version_in_pyproject(text: str) -> str | None:
    """``[project] version`` of a pyproject.toml's text (the static one of releases before 0.2.0), else None."""
    version = tomllib.loads(text).get("project", {}).get("version")
    return version if isinstance(version, str) else None


def project_version(project: Path) -> str:
    """The vllm-fleet version the project's HEAD states (what the bundle carries, as git archive takes HEAD):
    ``__version__`` of its src/vllm_fleet/__init__.py, the version's one home, else (a commit before 0.2.0) the
    static version of its pyproject.toml. Refuses a project that states none."""
    for path, read in (("src/vllm_fleet/__init__.py", _version_in_init), ("pyproject.toml", _version_in_pyproject)):
        proc = subprocess.run(
            ["git", "-C", str(project), "show", f"HEAD:{path}"], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            continue
        try:
            version = read(proc.stdout)
        except (SyntaxError, ValueError) as exc:  # tomllib.TOMLDecodeError is a ValueError
            raise BundleError(f"{project}: HEAD's {path} cannot be read ({exc}); fix: commit a readable one") from exc
        if version:
            return version
    raise BundleError(
        f"{project}: HEAD states no vllm-fleet version (neither __version__ in src/vllm_fleet/__init__.py nor "
        "[project] version in pyproject.toml); fix: give --project the vllm-fleet checkout"
    )


def project_archive(project: Path, out: Path) -> None:
    """`git archive --format=tar HEAD` of the project, written to `out`."""
    with out.open("wb") as handle:
        proc = subprocess.run(
            ["git", "-C", str(project), "archive", "--format=tar", "HEAD"], stdout=handle, stderr=subprocess.PIPE
        )
    if proc.returncode != 0:
        raise BundleError(f"{project}: git archive failed: {proc.stderr.decode(errors='replace').strip()}")


def collection_build(archive: Path, work: Path, galaxy: str | None = None) -> Path | None:
    """The collection tarball ``ansible-galaxy collection build`` makes of the project's archive (HEAD's files, so
    the collection is the commit the bundle names), in ``work/collection/``; None for a project that is no
    collection (no galaxy.yml at HEAD). `galaxy` is the ansible-galaxy to run (default: the one beside this Python,
    else on PATH)."""
    tree = work / "collection-src"
    with tarfile.open(archive) as tar:
        if "galaxy.yml" not in tar.getnames():
            return None
        tar.extractall(tree, filter="tar")
    beside = Path(sys.executable).parent / "ansible-galaxy"
    galaxy = galaxy or (str(beside) if beside.is_file() else shutil.which("ansible-galaxy"))
    if galaxy is None:
        raise BundleError(
            "the project is an Ansible collection (galaxy.yml) and ansible-galaxy is not installed; fix: run "
            "scripts/bundle.sh from a checkout set up with scripts/bootstrap.sh (its virtualenv has ansible-core)"
        )
    out = work / COLLECTION
    proc = subprocess.run(
        [galaxy, "collection", "build", "--output-path", str(out), str(tree)],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, ANSIBLE_NOCOLOR="1"),
    )
    built = sorted(out.glob("*.tar.gz")) if out.is_dir() else []
    if proc.returncode != 0 or len(built) != 1:
        message = (proc.stderr or proc.stdout).strip().splitlines()
        raise BundleError(
            f"ansible-galaxy collection build of the project failed: {message[-1] if message else proc.returncode}; "
            "fix: run `ansible-galaxy collection build` in the checkout and mend what it names (galaxy.yml)"
        )
    shutil.rmtree(tree)
    return built[0]


def collection_component(entry: Entry, commit: str) -> Component:
    """The SBOM component of the collection tarball (collection/NS-NAME-VERSION.tar.gz): name and version from its
    MANIFEST.json (custody.read_tarball, which the controller's checks read it with)."""
    try:
        tarball = read_tarball(entry.source)
    except CustodyError as exc:
        raise BundleError(str(exc)) from exc
    description = f"the Ansible collection {tarball.fqcn} built from the project at commit {commit}"
    return _project_part(entry, ComponentType.LIBRARY, tarball.fqcn, tarball.version, description, commit)


def _project_part(
    entry: Entry, kind: ComponentType, name: str, version: str, description: str, commit: str
) -> Component:
    """The SBOM component of a file the bundle makes from the project at `commit` (its archive, its collection)."""
    return Component(
        type=kind,
        name=name,
        version=version,
        bom_ref=entry.path,
        description=description,
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=entry.sha256)],
        properties=[
            Property(name="vllm-fleet:bundle-path", value=entry.path),
            Property(name="vllm-fleet:project-commit", value=commit),
        ],
    )


def wheel_metadata(path: Path) -> Message:
    """The wheel's ``*.dist-info/METADATA``, parsed."""
    try:
        with zipfile.ZipFile(path) as wheel:
            names = [n for n in wheel.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            if len(names) != 1:
                raise BundleError(
                    f"{path}: {'no' if not names else len(names)} *.dist-info/METADATA in the wheel; fix: replace it "
                    "with the wheel the index serves"
                )
            text = wheel.read(names[0]).decode("utf-8")
    except (zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise BundleError(f"{path}: not a readable wheel ({exc}); fix: download it again") from exc
    return email.parser.HeaderParser().parsestr(text)


def wheel_component(entry: Entry) -> Component:
    """The SBOM component of one wheel file: name and version from its METADATA, purl, SHA-256, licence."""
    meta = wheel_metadata(entry.source)
    name, version = meta.get("Name"), meta.get("Version")
    if not name or not version:
        raise BundleError(f"{entry.source}: its METADATA has no Name or Version; fix: replace the wheel")
    filename = entry.path.rsplit("/", 1)[1]
    expression = meta.get("License-Expression")
    return Component(
        type=ComponentType.LIBRARY,
        name=str(name),
        version=str(version),
        bom_ref=entry.path,  # unique even where two releases carry the same wheel file
        purl=PackageURL("pypi", None, normalize(str(name)), str(version), {"file_name": filename}),
        hashes=[HashType(alg=HashAlgorithm.SHA_256, content=entry.sha256)],
        licenses=[LicenseFactory().make_from_string(str(expression))] if expression else None,
        properties=[Property(name="vllm-fleet:bundle-path", value=entry.path)],
    )


def model_components(entries: list[Entry]) -> list[Component]:
    """One SBOM component per model and LoRA adapter the bundle carries: each folder under models/ or adapters/ that
    holds a SHA256SUMS (what the hosts check its files against). Its hash is its SHA256SUMS's (which holds every
    file's, as the manifest does); an adapter names the base model it was trained for, its rank and its PEFT type,
    from its adapter_config.json."""
    by_path = {e.path: e for e in entries}
    components = []
    for entry in sorted(entries, key=lambda e: e.path):
        found = re.fullmatch(r"(models|adapters)/(.+)/SHA256SUMS", entry.path)
        if not found:
            continue
        kind, name = found.groups()
        folder = entry.path.rsplit("/", 1)[0]
        properties = [
            Property(name="vllm-fleet:bundle-path", value=folder),
            Property(name="vllm-fleet:kind", value="model" if kind == "models" else "lora-adapter"),
        ]
        config = by_path.get(f"{folder}/adapter_config.json")
        if kind == "adapters" and config is not None:
            try:
                peft = json.loads(config.source.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise BundleError(
                    f"{config.source}: not readable JSON ({exc}); fix: the adapter's own adapter_config.json"
                ) from exc
            for key in ("base_model_name_or_path", "r", "peft_type"):
                if isinstance(peft, dict) and peft.get(key) not in (None, ""):
                    properties.append(Property(name=f"vllm-fleet:adapter-{key}", value=str(peft[key])))
        components.append(
            Component(
                type=ComponentType.MACHINE_LEARNING_MODEL,
                name=name,
                bom_ref=folder,
                description=(
                    f"the model {name} (its files listed in {entry.path})"
                    if kind == "models"
                    else f"the LoRA adapter {name} (its files listed in {entry.path})"
                ),
                hashes=[HashType(alg=HashAlgorithm.SHA_256, content=entry.sha256)],
                properties=properties,
            )
        )
    return components


def project_component(entry: Entry, version: str, commit: str) -> Component:
    """The SBOM component of the project's archive (project/<project>-<commit>.tar): vllm-fleet at `version`."""
    description = f"the vllm-fleet project at commit {commit} (git archive)"
    return _project_part(entry, ComponentType.APPLICATION, "vllm-fleet", version, description, commit)


def sbom_json(name: str, commit: str, entries: list[Entry], version: str = __version__) -> str:
    """The CycloneDX 1.6 SBOM (JSON) of the wheels under wheelhouse/*/, of the project's archive (vllm-fleet at
    `version`, the one the project states), of its collection tarball and of the models and LoRA adapters
    (``model_components``), validated against the schema.
    ``metadata.tools`` names the vllm-fleet that wrote it (this library's version)."""
    bom = Bom()
    bom.metadata.tools.components.add(
        Component(
            type=ComponentType.APPLICATION,
            name="vllm-fleet",
            version=__version__,
            description="vllm_fleet.bundle, which built the bundle and wrote this SBOM",
        )
    )
    root = Component(
        type=ComponentType.APPLICATION,
        name=name,
        version=commit,
        bom_ref=f"bundle:{name}",
        description=f"vllm-fleet air-gap bundle {name}",
        properties=[Property(name="vllm-fleet:project-commit", value=commit)],
    )
    bom.metadata.component = root
    wheels = [wheel_component(e) for e in entries if re.fullmatch(r"wheelhouse/[^/]+/[^/]+\.whl", e.path)]
    projects = [
        project_component(e, version, commit) for e in entries if re.fullmatch(rf"{PROJECT}/[^/]+\.tar", e.path)
    ]
    collections = [
        collection_component(e, commit) for e in entries if re.fullmatch(rf"{COLLECTION}/[^/]+\.tar\.gz", e.path)
    ]
    models = model_components(entries)
    for component in [*wheels, *projects, *collections, *models]:
        bom.components.add(component)
    bom.register_dependency(root, [*wheels, *projects, *collections, *models])
    text = JsonV1Dot6(bom).output_as_string(indent=2)
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if error is not None:
        raise BundleError(f"the SBOM does not validate against CycloneDX 1.6: {str(error).splitlines()[0]}")
    return text + "\n"


def manifest_text(entries: list[Entry]) -> str:
    """`sha256sum` format: ``<hex>  <path>`` a line, sorted by path."""
    return "".join(f"{e.sha256}  {e.path}\n" for e in sorted(entries, key=lambda e: e.path))


def check_minisign() -> str:
    found = shutil.which("minisign")
    if found is None:
        raise BundleError(f"minisign is not on PATH; fix: {INSTALL_MINISIGN}")
    return found


def sign(minisign: str, secret_key: Path, manifest: Path, comment: str) -> Path:
    """minisign's signature of `manifest` (beside it) with `comment` as its trusted comment. A key with a password
    asks for it on the terminal; without one, the key must have none (minisign -G -W)."""
    signature = manifest.with_name(SIGNATURE)
    command = [minisign, "-S", "-s", str(secret_key), "-m", str(manifest), "-x", str(signature), "-t", comment]
    if sys.stdin.isatty():  # minisign asks for the key's password, if it has one, on stderr
        asked = subprocess.run(command, stdout=subprocess.DEVNULL, check=False)
        if asked.returncode != 0:
            raise BundleError(f"minisign could not sign with {secret_key} (see its message above); fix: {MAKE_KEY}")
        return signature
    proc = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        said = " ".join(proc.stderr.replace("Password:", "").split())
        raise BundleError(
            f"minisign could not sign with {secret_key}: {said}; fix: a key with a password needs a terminal to type "
            f"it in, otherwise {MAKE_KEY}"
        )
    return signature


class _HashingReader:
    """A file object that hashes what tarfile reads from it (the second read of each file)."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        self.digest.update(data)
        return data


def _tarinfo(path: str, size: int, mtime: float) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path)
    info.size, info.mtime, info.mode = size, int(mtime), 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_tar(out: Path, name: str, head: list[Entry], payload: list[Entry]) -> None:
    """The tar at `out`: `head` in that order, then `payload` (sorted); each payload file hashed again as it is
    copied, so one that changed since it was hashed fails the build."""
    with (
        out.open("wb") as raw,
        tarfile.TarFile(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT, copybufsize=CHUNK) as tar,
    ):
        for entry in [*head, *payload]:
            mtime = entry.source.stat().st_mtime
            with entry.source.open("rb") as handle:
                reader = _HashingReader(handle)
                try:
                    tar.addfile(_tarinfo(f"{name}/{entry.path}", entry.size, mtime), reader)
                except OSError as exc:  # tarfile: "unexpected end of data", the file shrank
                    raise BundleError(
                        f"{entry.source} changed while the bundle was built ({exc}); fix: build again"
                    ) from exc
            if reader.digest.hexdigest() != entry.sha256:
                raise BundleError(f"{entry.source} changed while the bundle was built; fix: build again")
        raw.flush()
        os.fsync(raw.fileno())


@dataclass(frozen=True)
class Built:
    out: Path
    name: str
    commit: str
    version: str
    files: int
    bytes: int
    trusted_comment: str


def check_locks(entries: list[Entry]) -> None:
    """Each wheelhouse's requirements.lock against the digests the manifest gives its wheels: every pin carries a
    SHA-256 (the hosts' pip then installs only the wheels the lock names) and each is the digest of that pin's wheel
    in the same folder, so the hashes the hosts check are the signed manifest's. Raises BundleError naming the lock,
    the pin and both digests."""
    wheels: dict[tuple[str, str, str], set[str]] = {}
    locks = []
    for entry in entries:
        folder, _, file = entry.path.rpartition("/")
        if not folder.startswith("wheelhouse/"):
            continue
        if file.endswith(".whl"):
            dist, version = file.split("-")[:2]
            wheels.setdefault((folder, normalize(dist), version.lower()), set()).add(entry.sha256)
        elif file == "requirements.lock":
            locks.append((folder, entry))
    fix = "fix: python -m vllm_fleet.wheelhouse hash FOLDER (or scripts/wheelhouse.sh again) and build the bundle again"
    for folder, entry in locks:
        pins, hashes = wheelhouse.read_lock(entry.source.read_text(encoding="utf-8"))
        for name, version in sorted(pins.items()):
            signed = wheels.get((folder, normalize(name), version.lower()), set())
            if not hashes.get(name):
                raise BundleError(f"{entry.path}: {name}=={version} carries no --hash=sha256:; {fix}")
            wrong = sorted(set(hashes[name]) - signed)
            if wrong:
                raise BundleError(
                    f"{entry.path}: {name}=={version} --hash=sha256:{wrong[0]} is not the digest of its wheel in "
                    f"{folder}/ ({', '.join(sorted(signed)) or 'no such wheel there'}); {fix}"
                )


def _entries(files: list[tuple[str, Path]]) -> Iterator[Entry]:
    for rel, path in files:
        digest, size = sha256_file(path)
        yield Entry(rel, path, size, digest)


def build(
    staging: Path,
    project: Path,
    secret_key: Path,
    out: Path,
    name: str | None = None,
    extra: dict[str, Path] | None = None,
    allow_dirty: bool = False,
) -> Built:
    """Write the signed bundle of `staging` and `project` to `out` (see the module's docstring); ``extra`` adds
    other folders under names of their own ({"collections": the collections folder})."""
    name = name or out.stem
    if not _BUNDLE_NAME.fullmatch(name):
        raise BundleError(f"bundle name {name!r}: give --name letters, digits and . _ + - (e.g. site-2026-05)")
    minisign = check_minisign()
    if not secret_key.is_file():
        raise BundleError(f"secret key {secret_key} does not exist; fix: {MAKE_KEY}")
    if not out.parent.is_dir():
        raise BundleError(f"{out.parent} does not exist; fix: create it, or give --out in an existing folder")
    staging, out = staging.resolve(), out.resolve()
    if out.is_relative_to(staging):
        raise BundleError(f"{out} is inside the staging folder {staging}; fix: write the bundle elsewhere")
    files = staging_files(staging)
    taken = {rel.split("/")[0] for rel, _ in files}
    for top, folder in sorted((extra or {}).items()):
        if top in taken or top in RESERVED or not _BUNDLE_NAME.fullmatch(top):
            raise BundleError(
                f"--add {top}={folder}: {top!r} is already in the bundle or not a plain name; fix: another name"
            )
        files += [(f"{top}/{rel}", path) for rel, path in staging_files(folder.resolve())]
    files.sort()
    project = project.resolve()
    commit = project_commit(project, allow_dirty)
    version = project_version(project)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as tmp:
        work = Path(tmp)
        archive = work / f"{project.name}-{commit.replace('+', '-')}.tar"
        project_archive(project, archive)
        carried = [*files, (f"{PROJECT}/{archive.name}", archive)]
        collection = collection_build(archive, work)
        if collection is not None:
            carried.append((f"{COLLECTION}/{collection.name}", collection))
        payload = sorted(_entries(carried), key=lambda e: e.path)
        check_locks(payload)
        sbom = work / SBOM
        sbom.write_text(sbom_json(name, commit, payload, version))
        sbom_entry = next(_entries([(SBOM, sbom)]))
        listed = [sbom_entry, *payload]
        total = sum(e.size for e in listed)
        manifest = work / MANIFEST
        manifest.write_text(manifest_text(listed))
        comment = f"vllm-fleet bundle {name}, {len(listed)} files, {total} bytes, project {commit}, version {version}"
        signature = sign(minisign, secret_key, manifest, comment)
        head = [
            next(_entries([(MANIFEST, manifest)])),
            next(_entries([(SIGNATURE, signature)])),
            sbom_entry,
        ]
        partial = work / "bundle.tar.partial"
        write_tar(partial, name, head, payload)
        os.chmod(partial, stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)
        os.replace(partial, out)
    return Built(out, name, commit, version, len(listed), total, comment)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_fleet.bundle", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("build", help="write the signed bundle of a staging folder and the project")
    cmd.add_argument("--staging", type=Path, required=True, help="the folder of what the site's mirror serves")
    cmd.add_argument("--project", type=Path, required=True, help="the vllm-fleet checkout (its HEAD is carried)")
    cmd.add_argument("--secret-key", type=Path, required=True, help="the site's minisign secret key")
    cmd.add_argument("--out", type=Path, required=True, help="the bundle to write, e.g. site-2026-05.tar")
    cmd.add_argument("--name", help="the archive's top-level folder (default: the out file's stem)")
    cmd.add_argument(
        "--add",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="carry another folder as NAME/ (e.g. collections=.cache/collections); repeatable",
    )
    cmd.add_argument(
        "--allow-dirty",
        action="store_true",
        help="carry HEAD although tracked files have changes (marked +changes; for a lab, never for a site)",
    )
    args = parser.parse_args(argv)
    extra = {}
    for item in args.add:
        top, sep, folder = item.partition("=")
        if not sep or not top or not folder:
            print(f"bundle: --add {item!r}: give NAME=DIR, e.g. collections=.cache/collections", file=sys.stderr)
            return 1
        extra[top] = Path(folder)
    start = time.monotonic()
    try:
        built = build(args.staging, args.project, args.secret_key, args.out, args.name, extra, args.allow_dirty)
    except (BundleError, OSError) as exc:
        print(f"bundle: {exc}", file=sys.stderr)
        return 1
    print(
        f"bundle: {built.out}: {built.files} files, {built.bytes} bytes, project {built.commit}, "
        f"version {built.version}, {time.monotonic() - start:.1f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
