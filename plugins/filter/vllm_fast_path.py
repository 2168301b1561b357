# Ansible filters for site.yml's fast path of a re-run: what a host runs now, and the digest of what it should run.
from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError
from jinja2 import Undefined

# The library of this checkout, beside the plugin (never another installed copy): every filter plugin loads it so.
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
from vllm_fleet import datafiles, endpoints, fingerprint, inputs

ROOTDIR = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
ROLES = os.path.join(ROOTDIR, "roles")


def vllm_deployed_instances(slurped, inventory_address, unit_format):
    """The instances a host runs now (vllm_fleet.endpoints.deployed), from the results of slurping each one's
    <instance>.args.json (looped over the instance names); an instance without a readable file counts with the
    default port. unit_format: vllm_unit_format (its {name} is the instance's)."""
    if isinstance(slurped, Mapping):
        slurped = slurped.get("results")
    if not isinstance(slurped, (list, tuple)):
        raise AnsibleFilterError(f"vllm_deployed_instances: expected the slurp results, got {slurped!r:.200}")
    out = []
    for result in slurped:
        args = []
        if isinstance(result, Mapping) and result.get("content"):
            try:
                args = json.loads(base64.b64decode(result["content"]))
            except ValueError:
                args = []
        try:
            out.append(endpoints.deployed(str(result["item"]), args, str(inventory_address), str(unit_format)))
        except (KeyError, TypeError, ValueError) as exc:
            raise AnsibleFilterError(f"vllm_deployed_instances: {result!r:.200}: {exc}") from exc
    return out


# What the vllm role's work on a host derives from besides its variables: its tasks, files and templates, those of
# the roles it runs with (the firewall of its ports, the host's sentinel), the modules it runs, and the project's
# templates (vllm_fleet.fingerprint: a new version of the project is a change).
ROLE_CODE = [
    os.path.join(ROOTDIR, part)
    for part in (
        "roles/vllm",
        "roles/vllm_firewall",
        "roles/vllm_sentinel",
        "templates",
        "plugins/modules",
        "plugins/module_utils",
    )
]
# The roles whose argument specs name the variables of what a vLLM host runs: the vllm role's, and the sentinel's
# (where its units' templates are).
ROLE_SPECS = ("vllm", "vllm_sentinel")


# The role's variables that say how a run goes, not what the host runs.
_NOT_STATE = {"vllm_fast_path", "vllm_driver_ready"}


def vllm_fingerprint(variables, host, plan_entry, extra=None):
    """The digest of what `host` should run: every variable of the vllm and vllm_sentinel roles' argument specs as
    the host has it (secrets by their digest only), its plan entry, `extra` (what the role derives from other hosts:
    the gateways its firewall admits) and the roles' code."""
    if not hasattr(variables, "get") or not isinstance(plan_entry, Mapping):
        raise AnsibleFilterError(f"vllm_fingerprint: {host}: expected the host's variables and its plan entry")
    values = {}
    options = {name: option for role in ROLE_SPECS for name, option in datafiles.role_options(ROLES, role).items()}
    for name, option in options.items():
        if name in _NOT_STATE:
            continue
        value = variables.get(name)
        if isinstance(value, Undefined):
            continue
        value = inputs.plain(value)
        if inputs.is_secret(name, option):
            value = fingerprint.digest(value)
        values[name] = value
    return fingerprint.digest(
        {
            "variables": values,
            "plan": inputs.plain(plan_entry),
            "extra": inputs.plain(extra),
            "code": fingerprint.tree_digest(ROLE_CODE),
        }
    )


# Each filter is documented in plugins/filter/<filter>.yml, which ansible-doc -t filter reads.
class FilterModule:
    """The fast path's filters."""

    def filters(self):
        return {"vllm_fingerprint": vllm_fingerprint, "vllm_deployed_instances": vllm_deployed_instances}
