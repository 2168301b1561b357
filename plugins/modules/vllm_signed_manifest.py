#!/usr/bin/python
# -*- coding: utf-8 -*-
# Part of the vllm-fleet Ansible package. The documentation of an action plugin
# (plugins/action/vllm_signed_manifest.py), which runs on the controller: nothing here runs on a host.

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: vllm_signed_manifest
short_description: Read the mirror's signed manifest on the controller and check its signature
description:
  - Runs on the controller, in the task's own worker (an action plugin); no module is sent to a host.
  - Reads O(url) (the mirror's C(BUNDLE.sha256), which C(playbooks/bundle.yml) keeps at the mirror's root) and its
    minisign signature (O(url) with C(.minisig) added), checks the signature with C(minisign -V) and O(public_key)
    before reading the manifest, and returns every file it lists with its SHA-256.
  - The C(vllm) role then checks on each host, before it uses them, a wheelhouse's C(requirements.lock) and a model's
    C(SHA256SUMS) against the digests the site signed (C(vllm_fleet.custody), docs/air-gap.md).
  - Fails, naming the URL, the key and the fix, when either file cannot be read, the signature does not verify, or
    a line of the manifest is not C(<sha256>  <path>) with a path inside the mirror. Changes nothing; runs in check
    mode too.
version_added: "0.1.0"
author:
  - vllm-fleet maintainers
options:
  url:
    description: The mirror's C(BUNDLE.sha256), for example C(http://mirror.site/BUNDLE.sha256).
    type: str
    required: true
  public_key:
    description: The site's minisign public key, a file on the controller (C(site.pub)).
    type: path
    required: true
  timeout:
    description: Seconds to wait for each of the two files.
    type: float
    default: 30
  collections_paths:
    description:
      - The controller's collections paths, in Ansible's order
        (C(lookup('ansible.builtin.config', 'COLLECTIONS_PATHS'))). Each collection the manifest carries
        (C(collections/ansible_collections/NS/NAME/)) is found where Ansible loads it from (the first path that has
        it) and every file there compared with the signed digests; one altered,
        missing or added (byte-code caches aside) fails the task, naming the collection, the files and the fix.
      - Where the manifest carries this project's collection tarball (C(collection/)), it is read from the mirror and
        checked against its signed digest, and the copy Ansible loads is compared with it file for file (a checkout,
        with C(galaxy.yml) and no C(MANIFEST.json), is named and not compared); see RV(fleet_collection).
    type: list
    elements: path
requirements:
  - minisign on the controller
"""

EXAMPLES = r"""
- name: Read the site's signed manifest
  vllm_fleet.fleet.vllm_signed_manifest:
    url: http://mirror.site/BUNDLE.sha256
    public_key: /etc/vllm-site/site.pub
  register: signed
  run_once: true
"""

RETURN = r"""
manifest:
  description: >-
    The manifest (C(url), C(base), C(digests) by relative path, C(trusted_comment), C(manifest_sha256)) and C(bundle),
    what the trusted comment names (C(name), C(commit), C(version): the vllm-fleet version it carries, empty for a
    bundle built before 0.2.0; C(manifest_sha256)).
  type: dict
  returned: success
files:
  description: How many files the manifest lists.
  type: int
  returned: success
collections:
  description: With O(collections_paths), the collections checked (C(namespace.name)), each as the site signed it.
  type: list
  elements: str
  returned: when collections_paths is given
fleet_collection:
  description:
    - With O(collections_paths), where the manifest carries this project's collection tarball (C(collection/)), the
      collection (C(collection)), its C(version), the C(tarball)'s path in the bundle, the folder Ansible loads it
      from (C(path)), and its C(state) there.
    - C(state) is C(signed) (file for file the tarball), C(checkout) (a development checkout, not compared) or
      C(not installed).
  type: dict
  returned: when collections_paths is given and the manifest carries the collection
  sample: {collection: vllm_fleet.fleet, version: 0.3.0, tarball: collection/vllm_fleet-fleet-0.3.0.tar.gz,
           path: /home/ops/.ansible/collections/ansible_collections/vllm_fleet/fleet, state: signed}
"""
