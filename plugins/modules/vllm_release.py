#!/usr/bin/python
# -*- coding: utf-8 -*-
# Part of the vllm-fleet Ansible package. Runs on the managed host; standard library only.

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: vllm_release
short_description: Keep the verified releases of a vLLM instance as a history, and choose one to go back to
description:
  - Each verified configuration of an instance (its unit, environment file and arguments) is kept in its
    own folder under O(path), named by the time it was first verified and a digest of its files, with a
    C(release.json) that says which virtualenv (vLLM release) and profile it runs. C(path/current) names
    the entry that runs now.
  - V(recorded) keeps the files given in O(files) as the instance's running release. A configuration that
    is already the current entry changes nothing; one that matches an older entry (a rollout back to it)
    makes that entry current again; a new one is added. Entries beyond O(keep) are removed, oldest
    verification first; the current entry is never removed.
  - V(query) reads the history and resolves O(id), or the release before the current one when O(id) is
    empty, as RV(target). It changes nothing.
  - V(current) makes the entry O(id) current (after a rollback to it was verified). It does not reorder the
    history, so a second rollback goes one release further back.
version_added: "0.1.0"
author:
  - vllm-fleet maintainers
options:
  path:
    description: The instance's history folder, for example C(/etc/vllm/releases/main). Root only.
    type: path
    required: true
  state:
    description: What to do.
    type: str
    choices: [recorded, query, current]
    default: query
  files:
    description: With V(recorded), the files that make the release (copied by their base names).
    type: list
    elements: path
    default: []
  release:
    description: With V(recorded), the release (virtualenv name) the configuration runs, e.g. C(vllm-0.33.0).
    type: str
    default: ""
  profile:
    description: With V(recorded), the profile name, for the history's listing.
    type: str
    default: ""
  keep:
    description: With V(recorded), how many entries to keep (at least 2, so that there is one to go back to).
    type: int
    default: 2
  id:
    description:
      - With V(current), the entry to make current. With V(query), the entry to resolve as RV(target);
        empty means the release before the current one.
    type: str
    default: ""
  legacy_dir:
    description:
      - A folder of the layout before this history (one C(last-good) copy). With V(recorded) and no history
        yet, its files are imported as the oldest entry, so that a host upgraded from that layout keeps its
        release to go back to.
    type: path
notes:
  - Supports check mode.
  - The environment file can hold an API key; entries are written mode 0600 in 0700 folders, and the module
    returns names and digests, never file contents.
"""

EXAMPLES = r"""
- name: Keep the verified configuration in the history
  vllm_fleet.fleet.vllm_release:
    path: /etc/vllm/releases/main
    state: recorded
    files: [/etc/systemd/system/vllm@main.service, /etc/vllm/main.env, /etc/vllm/main.args.json]
    release: vllm-0.33.0
    profile: l40-14b-awq-prefill
    keep: 3

- name: Find the release before the running one
  vllm_fleet.fleet.vllm_release:
    path: /etc/vllm/releases/main
  register: history
"""

RETURN = r"""
history:
  description: The kept entries, newest verification first.
  returned: always
  type: list
  elements: dict
  contains:
    id: {description: The entry's name., type: str}
    release: {description: The virtualenv (vLLM release) it runs., type: str}
    profile: {description: Its profile name., type: str}
    first_verified: {description: "When it was first verified (UTC, ISO 8601).", type: str}
    last_verified: {description: When it was last made current by a verified rollout., type: str}
    files: {description: The base names of its files., type: list}
current:
  description: The entry that runs now, or null.
  returned: always
  type: str
target:
  description: With V(query), the entry O(id) names, or the one before the current one; null when there is none.
  returned: always
  type: dict
releases_in_use:
  description: The releases (virtualenv names) that a kept entry runs; the others may be removed.
  returned: always
  type: list
  elements: str
pruned:
  description: The entries removed beyond O(keep).
  returned: always
  type: list
  elements: str
"""

import datetime
import hashlib
import json
import os
import shutil

from ansible.module_utils.basic import AnsibleModule

META = "release.json"
CURRENT = "current"


def _stamp(seconds=None):
    """UTC, ISO 8601 with microseconds: entries verified within one second still sort in order."""
    moment = (
        datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
        if seconds is not None
        else datetime.datetime.now(datetime.timezone.utc)
    )
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def fingerprint(files):
    """A digest over the files' base names and contents, in name order."""
    digest = hashlib.sha256()
    for path in sorted(files, key=os.path.basename):
        digest.update(os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as handle:
            digest.update(hashlib.sha256(handle.read()).digest())
    return digest.hexdigest()


def read_history(path):
    """The entries under ``path``, newest verification first, and the current entry's id (or None)."""
    entries = []
    if os.path.isdir(path):
        for name in os.listdir(path):
            meta = os.path.join(path, name, META)
            if os.path.isfile(meta):
                with open(meta) as handle:
                    entry = json.load(handle)
                entry["id"] = name
                entries.append(entry)
    entries.sort(key=lambda e: (e.get("last_verified", ""), e["id"]), reverse=True)
    current = None
    pointer = os.path.join(path, CURRENT)
    if os.path.isfile(pointer):
        with open(pointer) as handle:
            current = handle.read().strip() or None
    if current not in {e["id"] for e in entries}:
        current = None
    return entries, current


def public(entry):
    return {key: entry.get(key) for key in ("id", "release", "profile", "first_verified", "last_verified", "files")}


def previous_of(entries, current):
    """The newest entry verified before the current one (entries are newest first)."""
    ids = [e["id"] for e in entries]
    if current is None:
        return entries[1] if len(entries) > 1 else None
    position = ids.index(current)
    return entries[position + 1] if position + 1 < len(entries) else None


def _write_json(path, data):
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _set_current(path, entry_id):
    tmp = os.path.join(path, CURRENT + ".tmp")
    with open(tmp, "w") as handle:
        handle.write(entry_id + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, os.path.join(path, CURRENT))


def _add_entry(path, files, release, profile, verified_at, digest):
    entry_id = "%s-%s" % (verified_at[:19].replace("-", "").replace(":", "") + "Z", digest[:8])
    folder = os.path.join(path, entry_id)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    for src in files:
        dest = os.path.join(folder, os.path.basename(src))
        shutil.copyfile(src, dest)
        os.chmod(dest, 0o600)
    _write_json(
        os.path.join(folder, META),
        {
            "release": release,
            "profile": profile,
            "fingerprint": digest,
            "first_verified": verified_at,
            "last_verified": verified_at,
            "files": sorted(os.path.basename(f) for f in files),
        },
    )
    return entry_id


def record(module, path, files, release, profile, keep, legacy_dir):
    missing = [f for f in files if not os.path.isfile(f)]
    if not files or missing:
        module.fail_json(msg="vllm_release: files to record are missing: %s" % (missing or "none given"))
    entries, current = read_history(path)
    changed = False
    if not entries and legacy_dir and os.path.isdir(legacy_dir):
        legacy = sorted(
            os.path.join(legacy_dir, n) for n in os.listdir(legacy_dir) if os.path.isfile(os.path.join(legacy_dir, n))
        )
        if legacy:
            changed = True
            if not module.check_mode:
                os.makedirs(path, mode=0o700, exist_ok=True)
                at = _stamp(max(os.path.getmtime(f) for f in legacy))
                _add_entry(path, legacy, "", "(before the release history)", at, fingerprint(legacy))
                entries, current = read_history(path)
    digest = fingerprint(files)
    same = [e for e in entries if e.get("fingerprint") == digest]
    if same and same[0]["id"] == current:
        entry_id = current
    elif module.check_mode:
        return {
            "changed": True,
            "history": [public(e) for e in entries],
            "current": current,
            "releases_in_use": sorted({e.get("release") for e in entries if e.get("release")} | {release}),
            "pruned": [],
            "target": None,
        }
    else:
        changed = True
        os.makedirs(path, mode=0o700, exist_ok=True)
        os.chmod(path, 0o700)
        if same:
            entry_id = same[0]["id"]
            meta = dict(same[0])
            meta.pop("id")
            meta["last_verified"] = _stamp()
            _write_json(os.path.join(path, entry_id, META), meta)
        else:
            entry_id = _add_entry(path, files, release, profile, _stamp(), digest)
        _set_current(path, entry_id)
        entries, current = read_history(path)
    pruned = []
    for entry in entries[max(int(keep), 2) :]:
        if entry["id"] == current:
            continue
        pruned.append(entry["id"])
        if not module.check_mode:
            shutil.rmtree(os.path.join(path, entry["id"]))
    if pruned:
        changed = True
        entries = [e for e in entries if e["id"] not in pruned]
    return {
        "changed": changed,
        "history": [public(e) for e in entries],
        "current": current,
        "releases_in_use": sorted({e.get("release") for e in entries if e.get("release")}),
        "pruned": pruned,
        "target": None,
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", choices=["recorded", "query", "current"], default="query"),
            files=dict(type="list", elements="path", default=[]),
            release=dict(type="str", default=""),
            profile=dict(type="str", default=""),
            keep=dict(type="int", default=2),
            id=dict(type="str", default=""),
            legacy_dir=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    path, state = p["path"], p["state"]
    if state == "recorded":
        module.exit_json(**record(module, path, p["files"], p["release"], p["profile"], p["keep"], p["legacy_dir"]))
    entries, current = read_history(path)
    ids = [e["id"] for e in entries]
    result = {
        "changed": False,
        "history": [public(e) for e in entries],
        "current": current,
        "releases_in_use": sorted({e.get("release") for e in entries if e.get("release")}),
        "pruned": [],
        "target": None,
    }
    if p["id"] and p["id"] not in ids:
        module.fail_json(
            msg="vllm_release: no release %r in %s; the kept ones are: %s" % (p["id"], path, ", ".join(ids) or "none"),
            **result,
        )
    if state == "query":
        target = next(e for e in entries if e["id"] == p["id"]) if p["id"] else previous_of(entries, current)
        result["target"] = public(target) if target else None
        module.exit_json(**result)
    if not p["id"]:
        module.fail_json(msg="vllm_release: state=current needs id", **result)
    if p["id"] != current:
        result["changed"] = True
        if not module.check_mode:
            _set_current(path, p["id"])
        result["current"] = p["id"]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
