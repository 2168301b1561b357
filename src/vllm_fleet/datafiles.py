"""The package's data (src/vllm_fleet/data/), read the one way, as package data; a role's argument spec; and the roles'
defaults the plan shares with them.

The roles' defaults have one home, the roles' own defaults/main.yml, which Ansible reads. The package carries the ones
the plan needs as data/role_defaults/ROLE.yml, each a link to that file: read through the link in a checkout (an
editable install included), and copied into the wheel when the package is built (setuptools follows the link), so an
installed library reads the same values without the checkout (tests/unit/test_install.py)."""

from __future__ import annotations

import os
from functools import cache
from importlib import resources
from typing import Any

import yaml

# The roles whose defaults the plan renders a host's units with, in the order they apply (data/role_defaults/ROLE.yml).
DEFAULTS_ROLES = ("vllm_defaults", "vllm")


def load(name: str) -> Any:
    """The parsed YAML of data/NAME (NAME may name a file in a folder of data/: role_defaults/vllm.yml)."""
    with resources.files("vllm_fleet").joinpath("data", *name.split("/")).open("r", encoding="utf-8") as f:
        return yaml.safe_load(f)


@cache
def role_defaults() -> dict[str, Any]:
    """The defaults the plan renders a host's units with wherever its inventory does not say otherwise: those the
    fleet's roles share (roles/vllm_defaults, their one home: instance name, port, unit name...) and the vllm role's
    own (where it stages models, what it binds)."""
    values: dict[str, Any] = {}
    for role in DEFAULTS_ROLES:
        values.update(load(f"role_defaults/{role}.yml") or {})
    return values


@cache
def role_options(roles_dir: str, role: str) -> dict[str, Any]:
    """The options of a role's main entry point (ROLES_DIR/ROLE/meta/argument_specs.yml): the caller's roles, the
    filter plugins' own (beside them in the checkout or the collection)."""
    with open(os.path.join(roles_dir, role, "meta", "argument_specs.yml"), encoding="utf-8") as handle:
        options: dict[str, Any] = yaml.safe_load(handle)["argument_specs"]["main"]["options"]
    return options
