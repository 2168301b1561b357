# Action plugin: the mirror's signed manifest, read and checked on the controller (the documentation is
# plugins/modules/vllm_signed_manifest.py).
from __future__ import annotations

import os
import sys

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# The library of this checkout, beside the plugin (never another installed copy).
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
from vllm_fleet import custody as _custody


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("url", "public_key", "timeout", "collections_paths"))
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)  # refuses an option not in _VALID_ARGS, by name
        args = self._task.args
        url, key = args.get("url"), args.get("public_key")
        if not isinstance(url, str) or not url or not isinstance(key, str) or not key:
            raise AnsibleActionFail(
                "vllm_signed_manifest: url (the mirror's BUNDLE.sha256) and public_key (the site's minisign public "
                "key on the controller) are both needed"
            )
        try:
            timeout = float(args.get("timeout", 30))
            signed = _custody.read(url, key, timeout=timeout)
        except (_custody.CustodyError, ValueError) as exc:
            raise AnsibleActionFail(f"vllm_signed_manifest: {exc}") from exc
        paths = args.get("collections_paths")
        if paths is not None:
            if isinstance(paths, str):
                paths = paths.split(os.pathsep)
            if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
                raise AnsibleActionFail("vllm_signed_manifest: collections_paths must be a list of folders")
            errors, checked = _custody.collection_errors(signed.digests, paths)
            if errors:
                raise AnsibleActionFail("vllm_signed_manifest: " + " | ".join(errors))
            result["collections"] = checked
            errors, fleet = _custody.fleet_collection(signed, paths, timeout=timeout)
            if errors:
                raise AnsibleActionFail("vllm_signed_manifest: " + " | ".join(errors))
            if fleet is not None:
                result["fleet_collection"] = fleet
        # Read-only, and the same in check mode: the roles' checks need it there too.
        return dict(result, changed=False, manifest=signed.as_dict(), files=len(signed.digests))
