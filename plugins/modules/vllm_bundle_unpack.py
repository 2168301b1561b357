#!/usr/bin/python
# -*- coding: utf-8 -*-
# Part of the vllm-fleet Ansible package. Runs on the managed host; standard library only (and minisign).

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: vllm_bundle_unpack
short_description: Verify a signed vllm-fleet air-gap bundle and swap its contents into a mirror's document root
description:
  - Reads a bundle made by C(python -m vllm_fleet.bundle build) (an uncompressed tar whose first members are
    C(NAME/MANIFEST.sha256) and its minisign signature C(NAME/MANIFEST.sha256.minisig)) as a stream, once
    (twice when a bundle already served must be served again).
  - Checks the manifest's signature with C(minisign -V) and O(public_key) before anything else is read, then
    checks every following member as it streams past (only regular files and folders under C(NAME/), each file
    listed in the manifest with the SHA-256 it has). Every file of the manifest must be in the bundle.
  - Files are written into a staging folder C(dest/.incoming-*), mode 0644 (folders 0755, owned by the module's
    user whatever the archive says). Only once every check passed is each top-level entry the bundle carries
    (C(wheelhouse), C(models), C(debian), C(collections), C(project), C(sbom.cdx.json)...) swapped into O(dest),
    one rename each (the old entry moves into the staging folder, the new one into place), and the manifest and
    its signature are kept as C(dest/BUNDLE.sha256) and C(dest/BUNDLE.sha256.minisig). Entries of O(dest) that
    the bundle does not carry are left alone. On any failure the staging folder is removed and O(dest) is as
    it was.
  - When C(dest/BUNDLE.sha256) is the bundle's manifest byte for byte and its signature verifies with
    O(public_key) (a bundle already served), the bundle is still read whole and every member checked as above,
    each file also compared byte for byte with its copy in O(dest); a bundle whose content differs from its
    manifest is refused with the file named, as any other. When the mirror's files are the bundle's (none
    altered or missing, none added under the entries the bundle carries), nothing is written
    (RV(changed=false)); otherwise the module warns, naming the files, and serves the bundle again.
  - With O(mode=verify), no bundle is read; the mirror is checked against the manifest it kept. The signature of
    C(dest/BUNDLE.sha256) is checked with O(public_key), then every file under the top-level entries the manifest
    lists is hashed; a file altered (or not a regular file), added or missing fails the module, each named
    (RV(altered), RV(added), RV(missing)). Nothing is ever written. Entries of O(dest) the manifest does not
    list at its top (the site's own) are not read.
version_added: "0.1.0"
author:
  - vllm-fleet maintainers
requirements:
  - minisign (Debian package C(minisign)) on the host
options:
  mode:
    description:
      - C(unpack) verifies O(bundle) and serves it; C(verify) re-checks what O(dest) serves against the signed
        manifest it was served from, and changes nothing.
    type: str
    choices: [unpack, verify]
    default: unpack
  bundle:
    description: The bundle (tar) on the host. Required with O(mode=unpack), unused with O(mode=verify).
    type: path
  public_key:
    description: The site's minisign public key file (C(minisign -G -p site.pub -s site.key) made it).
    type: path
    required: true
  dest:
    description: The mirror's document root; it must exist. The staging folder is made in it, so that the swaps
      are renames on one file system.
    type: path
    required: true
  name:
    description: The top-level folder the bundle must have (its NAME); with O(mode=verify), the bundle the mirror
      must serve (read from the signature's trusted comment). Unset, any name is taken.
    type: str
notes:
  - Supports check mode, in which every check runs (the signature and every file's SHA-256) while nothing is
    written under O(dest). The payload is hashed, not written. The manifest and its signature always go to a
    temporary folder outside O(dest) for minisign, removed afterwards.
  - O(mode=verify) is the same in check mode and out of it, and reports RV(changed=false).
"""

EXAMPLES = r"""
- name: Unpack the signed bundle into the mirror
  vllm_fleet.fleet.vllm_bundle_unpack:
    bundle: /srv/incoming/site-2026-05.tar
    public_key: /etc/vllm-fleet/site.pub
    dest: /srv/mirror
  register: __vllm_bundle

- name: Check a bundle without unpacking it
  vllm_fleet.fleet.vllm_bundle_unpack:
    bundle: /srv/incoming/site-2026-05.tar
    public_key: /etc/vllm-fleet/site.pub
    dest: /srv/mirror
    name: site-2026-05
  check_mode: true

- name: Check that the mirror still serves, file for file, the signed bundle it was served from
  vllm_fleet.fleet.vllm_bundle_unpack:
    mode: verify
    public_key: /etc/vllm-fleet/site.pub
    dest: /srv/mirror
"""

RETURN = r"""
files:
  description: How many files the bundle's manifest lists (with O(mode=verify), the mirror's kept manifest).
  returned: always
  type: int
bytes:
  description: Their size in all (with O(mode=verify), the size of those the mirror has).
  returned: always
  type: int
swapped:
  description: The top-level entries swapped into O(dest) (in check mode, those that would be); empty without a change.
  returned: always
  type: list
  elements: str
trusted_comment:
  description: The signature's trusted comment, signed with the manifest, e.g. C(vllm-fleet bundle site-2026-05,
    812 files, 1342177280 bytes, project 0123456789ab, version 0.3.0).
  returned: always
  type: str
name:
  description: The bundle's top-level folder.
  returned: always
  type: str
altered:
  description: Files of the mirror that differ from the signed manifest (another SHA-256, or not a regular file).
    With O(mode=unpack), those found when the bundle was already served (it was then served again).
  returned: always
  type: list
  elements: str
added:
  description: Files under the entries the manifest lists that the manifest does not list.
  returned: always
  type: list
  elements: str
missing:
  description: Files of the signed manifest that the mirror does not have.
  returned: always
  type: list
  elements: str
seconds:
  description: How long the module took.
  returned: always
  type: float
"""

import errno
import hashlib
import os
import re
import shutil
import stat
import tarfile
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule

MANIFEST = "MANIFEST.sha256"
SIGNATURE = MANIFEST + ".minisig"
KEPT_MANIFEST = "BUNDLE.sha256"
KEPT_SIGNATURE = KEPT_MANIFEST + ".minisig"
INCOMING = ".incoming-"
# What a bundle may not carry at its top: the module's own names in dest.
RESERVED = (MANIFEST, SIGNATURE, KEPT_MANIFEST, KEPT_SIGNATURE)
CHUNK = 1 << 20
MAX_MANIFEST = 64 << 20
MAX_SIGNATURE = 64 << 10
_LINE = re.compile(r"([0-9a-f]{64})  (.+)")
_BAD_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")
_C_LOCALE = {"LC_ALL": "C", "LANG": "C"}
MISSING = "missing"
ALTERED = "altered"
SHOWN = 10
REBUILD = "fix: rebuild the bundle with python -m vllm_fleet.bundle build and copy it again"


class BundleError(Exception):
    """An expected failure; the message names the bundle, the file and the fix."""


def path_problem(path):
    """Why `path` may not be a file of a bundle (None when it may): relative, no '..', '.' or empty parts."""
    if not path:
        return "an empty path"
    if path.startswith("/"):
        return "an absolute path"
    if _BAD_CHARS.search(path):
        return "a control character or backslash in the path"
    parts = path.split("/")
    if ".." in parts:
        return "a path with '..'"
    if "." in parts or "" in parts:
        return "a path with an empty or '.' part"
    return None


def parse_manifest(text, bundle):
    """{path: sha256} of a manifest in `sha256sum` format; refuses anything else."""
    entries = {}
    for number, line in enumerate(text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"), 1):
        match = _LINE.fullmatch(line)
        if not match:
            raise BundleError(
                "%s: line %d of its manifest is not '<64 hex digits>  <path>': %r; %s" % (bundle, number, line, REBUILD)
            )
        digest, path = match.groups()
        problem = path_problem(path)
        if problem:
            raise BundleError("%s: its manifest lists %r, %s; %s" % (bundle, path, problem, REBUILD))
        if path.split("/")[0] in RESERVED or path.startswith(INCOMING):
            raise BundleError("%s: its manifest lists %s, a name a bundle may not carry; %s" % (bundle, path, REBUILD))
        if path in entries:
            raise BundleError("%s: its manifest lists %s twice; %s" % (bundle, path, REBUILD))
        entries[path] = digest
    if not entries:
        raise BundleError("%s: its manifest lists no file; %s" % (bundle, REBUILD))
    for path in entries:
        parts = path.split("/")
        for end in range(1, len(parts)):
            if "/".join(parts[:end]) in entries:
                raise BundleError(
                    "%s: its manifest lists %s as a file and as a folder of %s; %s"
                    % (bundle, "/".join(parts[:end]), path, REBUILD)
                )
    return entries


def folders_of(entries):
    """Every folder that holds a file of the manifest."""
    folders = set()  # type: set[str]
    for path in entries:
        parts = path.split("/")
        folders.update("/".join(parts[:end]) for end in range(1, len(parts)))
    return folders


def _read_member(tar, member, limit, bundle):
    if member.size > limit:
        raise BundleError(
            "%s: %s is %d bytes, more than a bundle's %d; %s" % (bundle, member.name, member.size, limit, REBUILD)
        )
    return tar.extractfile(member).read()


def read_head(tar, bundle, expected_name):
    """The bundle's NAME, manifest and signature (its first two members)."""
    first = tar.next()
    what = first.name if first is not None else "nothing (an empty archive)"
    parts = first.name.split("/") if first is not None else []
    if first is None or len(parts) != 2 or parts[1] != MANIFEST or not first.isfile() or path_problem(parts[0]):
        raise BundleError(
            "%s is not a vllm-fleet bundle: first member is %s (a bundle starts with NAME/%s and NAME/%s); %s"
            % (bundle, what, MANIFEST, SIGNATURE, REBUILD)
        )
    name = parts[0]
    if expected_name and name != expected_name:
        raise BundleError(
            "%s is the bundle %s, not the expected %s; fix: give the right bundle, or name: %s"
            % (bundle, name, expected_name, name)
        )
    manifest = _read_member(tar, first, MAX_MANIFEST, bundle)
    second = tar.next()
    if second is None or second.name != "%s/%s" % (name, SIGNATURE) or not second.isfile():
        raise BundleError(
            "%s is not a vllm-fleet bundle: its second member is %s, not %s/%s; %s"
            % (bundle, second.name if second is not None else "missing", name, SIGNATURE, REBUILD)
        )
    return name, manifest, _read_member(tar, second, MAX_SIGNATURE, bundle)


def verify(module, minisign, public_key, manifest, signature):
    """(True, trusted comment) when minisign verifies `signature` of `manifest` with `public_key`, else
    (False, minisign's message)."""
    rc, out, err = module.run_command(
        [minisign, "-V", "-p", public_key, "-m", manifest, "-x", signature], environ_update=_C_LOCALE
    )
    if rc != 0:
        return False, " ".join((err.strip() or out.strip() or "exit %d" % rc).split())
    for line in out.splitlines():
        if line.startswith("Trusted comment: "):
            return True, line[len("Trusted comment: ") :]
    return True, ""


def _write_file(path, data):
    with open(path, "wb") as handle:
        handle.write(data)
    os.chmod(path, 0o644)


def _make_folders(root, folder):
    """`folder` (relative) under `root`, each part mode 0755."""
    current = root
    for part in folder.split("/") if folder else []:
        current = os.path.join(current, part)
        if not os.path.isdir(current):
            os.mkdir(current)
            os.chmod(current, 0o755)


def _member_path(member, name, bundle):
    """The member's path under NAME/ (refusing one outside NAME/ or an unsafe one)."""
    path = member.name.rstrip("/") if member.isdir() else member.name
    if path == name and member.isdir():
        return ""
    if not path.startswith(name + "/"):
        raise BundleError("%s: member %s is outside the bundle's folder %s/; %s" % (bundle, member.name, name, REBUILD))
    rel = path[len(name) + 1 :]
    problem = path_problem(rel)
    if problem:
        raise BundleError("%s: member %s: %s; %s" % (bundle, member.name, problem, REBUILD))
    return rel


def _kind(member):
    if member.issym():
        return "a symbolic link (to %s)" % member.linkname
    if member.islnk():
        return "a hard link (to %s)" % member.linkname
    if member.ischr() or member.isblk():
        return "a device"
    if member.isfifo():
        return "a FIFO"
    return "a member of tar type %r" % member.type


def _open_served(dest, rel):
    """The mirror's copy of `rel` to read, or (None, why) when it is not a regular file there."""
    try:
        fd = os.open(os.path.join(dest, rel), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None, MISSING
        if exc.errno == errno.ELOOP:
            return None, "a symbolic link, not a regular file"
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None, "not a regular file"
    return os.fdopen(fd, "rb"), None


def stream_payload(tar, name, entries, bundle, payload, compare=None, differ=None):
    """Check every member after the manifest's two against `entries`, writing the files under `payload` (a folder)
    or, with `payload` None (check mode, or a bundle already served), only hashing them. With `compare` (the
    mirror's root), each file is also compared byte for byte with the mirror's copy, and `differ` ({path: why})
    gets those that are not the same. Returns the bytes read."""
    folders = folders_of(entries)
    seen = set()
    total = 0
    for member in iter(tar.next, None):
        if not (member.isfile() or member.isdir()):
            raise BundleError(
                "%s: member %s is %s: a bundle holds only regular files and folders; %s"
                % (bundle, member.name, _kind(member), REBUILD)
            )
        rel = _member_path(member, name, bundle)
        if member.isdir():
            if rel and rel not in folders:
                raise BundleError("%s: %s/: in the bundle but not in its signed manifest; %s" % (bundle, rel, REBUILD))
            if payload is not None:
                _make_folders(payload, rel)
            continue
        if rel not in entries:
            raise BundleError("%s: %s: in the bundle but not in its signed manifest; %s" % (bundle, rel, REBUILD))
        if rel in seen:
            raise BundleError("%s: %s is in the bundle twice; %s" % (bundle, rel, REBUILD))
        digest = hashlib.sha256()
        source = tar.extractfile(member)
        out = served = None
        if payload is not None:
            _make_folders(payload, os.path.dirname(rel))
            target = os.path.join(payload, rel)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
            os.fchmod(fd, 0o644)
            out = os.fdopen(fd, "wb")
        if compare is not None:
            served, why = _open_served(compare, rel)
            if why:
                differ[rel] = why
        try:
            while True:
                chunk = source.read(CHUNK)
                if not chunk:
                    break
                digest.update(chunk)
                total += len(chunk)
                if out is not None:
                    out.write(chunk)
                if served is not None and served.read(len(chunk)) != chunk:
                    differ[rel] = ALTERED
                    served.close()
                    served = None
            if served is not None and served.read(1):
                differ[rel] = ALTERED
        finally:
            for handle in (out, served):
                if handle is not None:
                    handle.close()
        got = digest.hexdigest()
        if got != entries[rel]:
            raise BundleError(
                "%s: %s: SHA-256 %s does not match the signed manifest's %s: the file was altered after signing; %s"
                % (bundle, rel, got, entries[rel], REBUILD)
            )
        seen.add(rel)
    missing = sorted(set(entries) - seen)
    if missing:
        raise BundleError(
            "%s: %d files of its signed manifest are not in the bundle: %s%s; the bundle is incomplete: %s"
            % (
                bundle,
                len(missing),
                ", ".join(missing[:10]),
                " (and %d more)" % (len(missing) - 10) if len(missing) > 10 else "",
                REBUILD,
            )
        )
    return total


def swap_in(staging, payload, dest, tops):
    """Each of `tops` from `payload` into `dest`, the old one moved into the staging folder first, then the manifest
    and its signature kept as BUNDLE.sha256(.minisig); on an error the entries already swapped are put back."""
    old = os.path.join(staging, "old")
    os.mkdir(old)
    done = []
    try:
        for top in tops:
            live = os.path.join(dest, top)
            had = os.path.lexists(live)
            if had:
                os.rename(live, os.path.join(old, top))
            done.append((top, had))
            os.rename(os.path.join(payload, top), live)
        os.replace(os.path.join(staging, SIGNATURE), os.path.join(dest, KEPT_SIGNATURE))
        os.replace(os.path.join(staging, MANIFEST), os.path.join(dest, KEPT_MANIFEST))
    except OSError:
        for top, had in reversed(done):
            live = os.path.join(dest, top)
            if os.path.lexists(live) and not os.path.lexists(os.path.join(payload, top)):
                os.rename(live, os.path.join(payload, top))
            if had:
                os.rename(os.path.join(old, top), live)
        raise


def _read_kept(path, limit):
    """The bytes of a regular file of the mirror (not a link), or None (absent, or larger than `limit`)."""
    if os.path.islink(path) or not os.path.isfile(path) or os.path.getsize(path) > limit:
        return None
    with open(path, "rb") as handle:
        return handle.read()


def verify_bytes(module, minisign, public_key, manifest, signature):
    """verify() of a manifest and signature held in memory, written for minisign into a temporary folder outside
    the mirror, removed afterwards: what is verified is what is then parsed."""
    work = tempfile.mkdtemp(prefix="vllm-bundle-check-")
    try:
        head_manifest = os.path.join(work, MANIFEST)
        head_signature = os.path.join(work, SIGNATURE)
        _write_file(head_manifest, manifest)
        _write_file(head_signature, signature)
        return verify(module, minisign, public_key, head_manifest, head_signature)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check_signature(module, minisign, public_key, bundle, manifest, signature):
    """The bundle's manifest as {path: sha256} and the signature's trusted comment, once minisign verified it with
    `public_key`."""
    ok, said = verify_bytes(module, minisign, public_key, manifest, signature)
    if not ok:
        raise BundleError(
            "%s: its manifest does not verify with the public key %s (minisign: %s): the bundle was not signed "
            "with this site's key, or it was altered; fix: rebuild and re-sign it with the site's secret key "
            "(python -m vllm_fleet.bundle build --secret-key ...), or give the public key of the key that "
            "signed it" % (bundle, public_key, said)
        )
    try:
        text = manifest.decode("utf-8")
    except UnicodeDecodeError:
        raise BundleError("%s: its manifest is not UTF-8 text; %s" % (bundle, REBUILD)) from None
    return parse_manifest(text, bundle), said


def mirror_entries(dest, entries):
    """What the mirror holds under the top-level entries the manifest lists: {path: None} for a regular file, else
    {path: what it is} (a link, a device...). Folders are walked, never followed through a link; entries of `dest`
    that the manifest does not list at its top are not the bundle's, and are not read."""
    found = {}  # type: dict[str, str | None]
    pending = sorted({path.split("/")[0] for path in entries}, reverse=True)
    while pending:
        rel = pending.pop()
        full = os.path.join(dest, rel)
        try:
            mode = os.lstat(full).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(mode) and rel not in entries:
            pending.extend(sorted((rel + "/" + child for child in os.listdir(full)), reverse=True))
        elif stat.S_ISREG(mode):
            found[rel] = None
        elif stat.S_ISLNK(mode):
            found[rel] = "a symbolic link (to %s), not a regular file" % os.readlink(full)
        elif stat.S_ISDIR(mode):
            found[rel] = "a folder, not a regular file"
        else:
            found[rel] = "not a regular file"
    return found


def _shown(paths, describe):
    shown = [describe(path) for path in paths[:SHOWN]]
    more = " (and %d more)" % (len(paths) - SHOWN) if len(paths) > SHOWN else ""
    return ", ".join(shown) + more


def differences_text(result, details):
    """'2 altered: a (...), b (...); 1 added: c; 1 missing: d', each list cut at SHOWN with a count."""

    def describe(path):
        return "%s (%s)" % (path, details[path]) if path in details else path

    return "; ".join(
        "%d %s: %s" % (len(result[key]), key, _shown(result[key], describe))
        for key in ("altered", "added", "missing")
        if result[key]
    )


def _serve(module, tar, name, entries, manifest, signature, bundle, dest, result):
    """Stream the members after the manifest's two into a staging folder in `dest` (in check mode, hash them only),
    then swap the bundle's top-level entries into `dest`."""
    staging = payload = None
    if not module.check_mode:
        staging = tempfile.mkdtemp(prefix=INCOMING, dir=dest)
    try:
        if staging is not None:
            _write_file(os.path.join(staging, MANIFEST), manifest)
            _write_file(os.path.join(staging, SIGNATURE), signature)
            payload = os.path.join(staging, "payload")
            os.mkdir(payload)
            os.chmod(payload, 0o755)
        result["bytes"] = stream_payload(tar, name, entries, bundle, payload)
        tops = sorted({path.split("/")[0] for path in entries})
        result["swapped"] = tops
        result["changed"] = True
        if payload is not None:
            swap_in(staging, payload, dest, tops)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def unpack(module, minisign, bundle, public_key, dest, expected_name, result):
    """Verify the bundle whole and serve it (see DOCUMENTATION); fills `result`."""
    with tarfile.open(bundle, mode="r|") as tar:
        name, manifest, signature = read_head(tar, bundle, expected_name)
        result["name"] = name
        entries, result["trusted_comment"] = check_signature(module, minisign, public_key, bundle, manifest, signature)
        result["files"] = len(entries)
        kept = os.path.join(dest, KEPT_MANIFEST)
        served = _read_kept(kept, MAX_MANIFEST) == manifest
        if served:
            served = verify(module, minisign, public_key, kept, os.path.join(dest, KEPT_SIGNATURE))[0]
        if not served:
            _serve(module, tar, name, entries, manifest, signature, bundle, dest, result)
            return
        # The same signed manifest: every member is still read and checked, and compared with the mirror's copy.
        differ = {}  # type: dict[str, str]
        result["bytes"] = stream_payload(tar, name, entries, bundle, None, compare=dest, differ=differ)
    found = mirror_entries(dest, entries)
    result["added"] = sorted(path for path in found if path not in entries)
    result["missing"] = sorted(path for path, why in differ.items() if why == MISSING)
    result["altered"] = sorted(path for path, why in differ.items() if why != MISSING)
    if not (result["added"] or result["missing"] or result["altered"]):
        return
    # The mirror is not what this bundle made it: serve the bundle again, which replaces the entries it carries.
    details = {path: why for path, why in differ.items() if why not in (ALTERED, MISSING)}
    details.update((path, found[path]) for path in result["added"] if found[path])
    module.warn(
        "%s serves %s, but its files differ from that bundle's signed manifest (%s): it %s served again from %s"
        % (
            dest,
            result["trusted_comment"] or name,
            differences_text(result, details),
            "would be (check mode)" if module.check_mode else "is",
            bundle,
        )
    )
    with tarfile.open(bundle, mode="r|") as tar:
        again = read_head(tar, bundle, expected_name)
        if again[1] != manifest:
            raise BundleError("%s changed while it was read; fix: copy the bundle again, then run again" % bundle)
        _serve(module, tar, name, entries, manifest, signature, bundle, dest, result)


def verify_mirror(module, minisign, public_key, dest, expected_name, result):
    """mode=verify: the mirror's kept manifest verified with `public_key`, then every file under the entries it lists
    hashed and compared; fills `result` and raises BundleError naming every file added, altered or missing."""
    reserve = "fix: serve the site's bundle with playbooks/bundle.yml -e vllm_bundle=<the bundle on this host>"
    manifest = _read_kept(os.path.join(dest, KEPT_MANIFEST), MAX_MANIFEST)
    signature = _read_kept(os.path.join(dest, KEPT_SIGNATURE), MAX_SIGNATURE)
    for kept, data in ((KEPT_MANIFEST, manifest), (KEPT_SIGNATURE, signature)):
        if data is None:
            raise BundleError(
                "%s serves no bundle: %s is not a regular file there, or is too large (playbooks/bundle.yml keeps "
                "the manifest of the bundle it served, and its signature, as %s and %s); %s"
                % (dest, kept, KEPT_MANIFEST, KEPT_SIGNATURE, reserve)
            )
    ok, said = verify_bytes(module, minisign, public_key, manifest, signature)
    if not ok:
        raise BundleError(
            "%s: %s does not verify with the public key %s (minisign: %s): it was altered on the mirror, or served "
            "with another site's key; %s" % (dest, KEPT_MANIFEST, public_key, said, reserve)
        )
    result["trusted_comment"] = said
    match = re.match(r"vllm-fleet bundle ([^,]+),", said)
    result["name"] = match.group(1) if match else ""
    if expected_name and result["name"] != expected_name:
        raise BundleError(
            "%s serves the bundle %s (%s), not the expected %s; %s"
            % (dest, result["name"] or "of no name", said, expected_name, reserve)
        )
    try:
        entries = parse_manifest(manifest.decode("utf-8"), os.path.join(dest, KEPT_MANIFEST))
    except UnicodeDecodeError:
        raise BundleError("%s: %s is not UTF-8 text; %s" % (dest, KEPT_MANIFEST, reserve)) from None
    result["files"] = len(entries)
    found = mirror_entries(dest, entries)
    details = {}
    for path, why in sorted(found.items()):
        if path not in entries:
            result["added"].append(path)
            if why:
                details[path] = why
        elif why:
            result["altered"].append(path)
            details[path] = why
        else:
            got, size = _sha256(os.path.join(dest, path))
            result["bytes"] += size
            if got != entries[path]:
                result["altered"].append(path)
                details[path] = "SHA-256 %s, the signed manifest's %s" % (got, entries[path])
    result["missing"] = sorted(path for path in entries if path not in found)
    if result["added"] or result["altered"] or result["missing"]:
        raise BundleError(
            "%s differs from the signed manifest of the bundle it serves (%s): %s; fix: find out who changed the "
            "mirror, then serve the bundle again with playbooks/bundle.yml -e vllm_bundle=<the bundle on this host>, "
            "which replaces every entry the bundle carries" % (dest, said, differences_text(result, details))
        )


def _sha256(path):
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mode=dict(type="str", choices=["unpack", "verify"], default="unpack"),
            bundle=dict(type="path"),
            public_key=dict(type="path", required=True),
            dest=dict(type="path", required=True),
            name=dict(type="str"),
        ),
        required_if=[("mode", "unpack", ("bundle",))],
        supports_check_mode=True,
    )
    p = module.params
    mode, bundle, public_key, dest = p["mode"], p["bundle"], p["public_key"], p["dest"]
    start = time.time()
    result = {
        "changed": False,
        "files": 0,
        "bytes": 0,
        "swapped": [],
        "trusted_comment": "",
        "name": "",
        "altered": [],
        "added": [],
        "missing": [],
    }
    minisign = module.get_bin_path("minisign")
    if minisign is None:
        module.fail_json(msg="vllm_bundle_unpack: minisign is not on this host's PATH; fix: apt-get install minisign")
    for option, path in (("bundle", bundle), ("public_key", public_key)):
        if path is not None and not os.path.isfile(path):
            module.fail_json(
                msg="vllm_bundle_unpack: %s %s is not a file on this host; fix: copy it there" % (option, path)
            )
    if not os.path.isdir(dest):
        module.fail_json(msg="vllm_bundle_unpack: dest %s is not a folder on this host; fix: create it first" % dest)
    try:
        if mode == "verify":
            verify_mirror(module, minisign, public_key, dest, p["name"], result)
        else:
            unpack(module, minisign, bundle, public_key, dest, p["name"], result)
    except BundleError as exc:
        result["changed"] = False
        module.fail_json(msg="vllm_bundle_unpack: %s" % exc, **result)
    except (tarfile.TarError, EOFError) as exc:
        module.fail_json(
            msg="vllm_bundle_unpack: %s is not a readable tar archive (%s); it may be truncated: %s"
            % (bundle, exc, REBUILD)
        )
    except OSError as exc:
        if mode == "verify":
            module.fail_json(
                msg="vllm_bundle_unpack: checking the mirror %s failed: %s; fix: run it as a user who can read every "
                "file of the mirror (become: true), then run again" % (dest, exc)
            )
        module.fail_json(
            msg="vllm_bundle_unpack: unpacking %s into %s failed: %s (its staging folder is removed, and any entry "
            "already swapped was put back); fix: free the space or correct the permission it names, then run again"
            % (bundle, dest, exc)
        )
    result["seconds"] = round(time.time() - start, 3)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
