"""The package's data tables (src/vllm_fleet/data/*.yml), read the one way; a role's argument spec; and the roles'
defaults the plan shares with them."""

from __future__ import annotations

import os
from functools import cache
from importlib import resources
from typing import Any

import yaml


def load(name: str) -> Any:
    """The parsed YAML of data/NAME."""
    with resources.files("vllm_fleet").joinpath("data", name).open("r", encoding="utf-8") as f:
        return yaml.safe_load(f)


# The checkout's roles, beside the library (the plugins load this library from the same checkout).
ROLES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "roles")


@cache
def role_defaults() -> dict[str, Any]:
    """The defaults the plan renders a host's units with wherever its inventory does not say otherwise: those the
    fleet's roles share (roles/vllm_defaults, their one home: instance name, port, unit name...) and the vllm role's
    own (where it stages models, what it binds)."""
    values: dict[str, Any] = {}
    for role in ("vllm_defaults", "vllm"):
        with open(os.path.join(ROLES_DIR, role, "defaults", "main.yml"), encoding="utf-8") as handle:
            values.update(yaml.safe_load(handle) or {})
    return values


@cache
def role_options(roles_dir: str, role: str) -> dict[str, Any]:
    """The options of a role's main entry point (ROLES_DIR/ROLE/meta/argument_specs.yml)."""
    with open(os.path.join(roles_dir, role, "meta", "argument_specs.yml"), encoding="utf-8") as handle:
        options: dict[str, Any] = yaml.safe_load(handle)["argument_specs"]["main"]["options"]
    return options
