#!/usr/bin/python
# -*- coding: utf-8 -*-
# Part of the vllm-fleet Ansible package. The documentation of an action plugin
# (plugins/action/vllm_collection_install.py), which runs on the controller: nothing here runs on a host.

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: vllm_collection_install
short_description: Install the collection a signed bundle carries on the controller, checked file for file
description:
  - Runs on the controller, in the task's own worker (an action plugin); no module is sent to a host.
  - Reads the mirror's signed manifest O(url) and checks its signature with O(public_key) (as
    M(vllm_fleet.fleet.vllm_signed_manifest) does), then reads the collection tarball it lists under C(collection/)
    from the same mirror and checks it against the signed SHA-256 before anything else.
  - Compares the copy already in O(path) (C(ansible_collections/NS/NAME)) with the tarball file for file (its
    C(FILES.json); byte-code caches aside). The same copy changes nothing. Another version, or a file altered,
    missing or added, is replaced with C(ansible-galaxy collection install --offline --no-deps --force), and the copy
    is compared again.
  - The collection's dependencies (C(ansible.posix), C(community.general)) come from the bundle's C(collections/)
    folder, which C(playbooks/plan.yml) checks; they are not installed here.
  - In check mode, says whether it would install and what differs, and writes nothing.
version_added: "0.3.0"
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
  path:
    description: The collections path to install into (the folder that holds or will hold C(ansible_collections/)).
    type: path
    required: true
  timeout:
    description: Seconds to wait for each file read from the mirror.
    type: float
    default: 30
requirements:
  - minisign on the controller
"""

EXAMPLES = r"""
- name: Install the bundle's collection on the controller
  vllm_fleet.fleet.vllm_collection_install:
    url: http://mirror.site/BUNDLE.sha256
    public_key: /etc/vllm-site/site.pub
    path: ~/.ansible/collections
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
collection:
  description: The collection's full name.
  returned: always
  type: str
  sample: vllm_fleet.fleet
version:
  description: Its version, from the tarball's MANIFEST.json.
  returned: always
  type: str
  sample: 0.3.0
dest:
  description: The folder it is installed in.
  returned: always
  type: str
  sample: /home/ops/.ansible/collections/ansible_collections/vllm_fleet/fleet
tarball:
  description: The tarball's path in the bundle.
  returned: always
  type: str
  sample: collection/vllm_fleet-fleet-0.3.0.tar.gz
bundle:
  description: The signed manifest's trusted comment (the bundle's name, project commit and version).
  returned: always
  type: str
files:
  description: How many files the tarball lists.
  returned: always
  type: int
  sample: 411
differed:
  description: What differed in the copy that was there (or C(not installed)), where it was installed again.
  returned: changed
  type: list
  elements: str
"""
