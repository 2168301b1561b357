# A thin Ansible filter over vllm_fleet.custody: the SHA-256 the site signed for a file a host takes from the mirror.
from __future__ import annotations

DOCUMENTATION = r"""
name: vllm_signed_digest
short_description: The SHA-256 the site's signed manifest lists for a file in a folder of the mirror
description:
  - C(vllm_signed_digest) (manifest, location, name, host, setting) gives the SHA-256 that the signed manifest (the
    C(vllm_signed_manifest) action's RV(manifest)) lists for O(name) in the folder at O(location), a URL under the
    mirror's root.
  - Raises AnsibleFilterError naming the host, the setting, its value and the fix when the folder is not under that
    mirror or the file is not listed (the site did not sign it).
options:
  _input:
    description: The signed manifest, from the C(vllm_signed_manifest) action.
    type: dict
    required: true
  location:
    description: The folder's URL, for example the value of C(vllm_wheelhouse_url) or C(vllm_model_url).
    type: str
    required: true
  name:
    description: The file in that folder, for example C(requirements.lock) or C(SHA256SUMS).
    type: str
    required: true
  host:
    description: The host it is for, named in an error.
    type: str
    required: true
  setting:
    description: The setting that gave O(location), named in an error.
    type: str
    required: true
requirements:
  - The C(vllm_fleet) package (this repository's C(src/)).
"""

EXAMPLES = r"""
- name: The lock's SHA-256, as the site signed it
  ansible.builtin.set_fact:
    _lock_sha256: >-
      {{ signed.manifest | vllm_signed_digest(vllm_wheelhouse_url, 'requirements.lock', inventory_hostname,
      'vllm_wheelhouse_url') }}
"""

RETURN = r"""
_value:
  description: A SHA-256, in hexadecimal.
  type: str
"""

import os
import sys
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
from vllm_fleet import custody as _custody  # (the standard library only)


def vllm_signed_digest(manifest, location, name, host, setting):
    if not isinstance(manifest, Mapping) or not {"base", "digests", "url"} <= set(manifest):
        raise AnsibleFilterError("vllm_signed_digest expects the vllm_signed_manifest action's manifest")
    try:
        return _custody.digest_of(dict(manifest), str(location), str(name))
    except _custody.CustodyError as exc:
        raise AnsibleFilterError(f"{host}: {setting}={location!r}: {exc}") from exc


class FilterModule:
    """The chain of custody's filter."""

    def filters(self):
        return {"vllm_signed_digest": vllm_signed_digest}
