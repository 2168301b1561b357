# Action plugin: the collection tarball of a signed bundle, installed on the controller (the documentation is
# plugins/modules/vllm_collection_install.py).
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

# The library of this collection, beside the plugin (never another installed copy).
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
from vllm_fleet import custody as _custody


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("url", "public_key", "path", "timeout"))
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)  # refuses an option not in _VALID_ARGS, by name
        args = self._task.args
        url, key, path = args.get("url"), args.get("public_key"), args.get("path")
        for name, value, what in (
            ("url", url, "the mirror's BUNDLE.sha256"),
            ("public_key", key, "the site's minisign public key on the controller"),
            ("path", path, "the collections path to install into"),
        ):
            if not isinstance(value, str) or not value:
                raise AnsibleActionFail(f"vllm_collection_install: {name} is needed ({what})")
        path = os.path.expanduser(path)
        try:
            timeout = float(args.get("timeout", 30))
            signed = _custody.read(url, key, timeout=timeout)
            with tempfile.TemporaryDirectory(prefix="vllm-collection-") as work:
                carried, tarball = _custody.fetch_tarball(signed, work, timeout=timeout)
                collection = _custody.read_tarball(tarball)
                folder = os.path.join(path, "ansible_collections", collection.namespace, collection.name)
                said = _custody.installed_errors(collection, folder) if os.path.isdir(folder) else ["not installed"]
                out = dict(result, collection=collection.fqcn, version=collection.version, dest=folder, tarball=carried)
                out.update(files=len(collection.files), bundle=signed.trusted_comment)
                if not said:
                    return dict(out, changed=False)
                out["differed"] = said
                if self._task.check_mode:
                    return dict(out, changed=True)
                self._install(tarball, path)
        except (_custody.CustodyError, ValueError) as exc:
            raise AnsibleActionFail(f"vllm_collection_install: {exc}") from None  # the message says it all
        left = _custody.installed_errors(collection, folder)
        if left:
            raise AnsibleActionFail(
                f"vllm_collection_install: {folder} is not the signed collection after its install: {'; '.join(left)}"
            )
        return dict(out, changed=True)

    @staticmethod
    def _install(tarball: str, path: str) -> None:
        galaxy = Path(sys.executable).parent / "ansible-galaxy"
        command = [
            str(galaxy) if galaxy.is_file() else "ansible-galaxy",
            *("collection", "install", "--offline", "--no-deps", "--force", "-p", path, tarball),
        ]
        env = dict(os.environ, ANSIBLE_NOCOLOR="1")
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False, env=env)
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines()
            raise AnsibleActionFail(
                f"vllm_collection_install: ansible-galaxy could not install {os.path.basename(tarball)} into {path}: "
                f"{lines[-1] if lines else done.returncode}; fix: mend what it names (for a folder this user may not "
                "write, set vllm_bundle_collections_path to one it may)"
            )
