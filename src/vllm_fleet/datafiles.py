"""The package's data tables (src/vllm_fleet/data/*.yml), read the one way; and a role's argument spec."""

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


@cache
def role_options(roles_dir: str, role: str) -> dict[str, Any]:
    """The options of a role's main entry point (ROLES_DIR/ROLE/meta/argument_specs.yml)."""
    with open(os.path.join(roles_dir, role, "meta", "argument_specs.yml"), encoding="utf-8") as handle:
        options: dict[str, Any] = yaml.safe_load(handle)["argument_specs"]["main"]["options"]
    return options
