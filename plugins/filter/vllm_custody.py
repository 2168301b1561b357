# A thin Ansible filter over vllm_fleet.custody: the SHA-256 the site signed for a file a host takes from the mirror.
from __future__ import annotations

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


# Each filter is documented in plugins/filter/<filter>.yml, which ansible-doc -t filter reads.
class FilterModule:
    """The chain of custody's filter."""

    def filters(self):
        return {"vllm_signed_digest": vllm_signed_digest}
