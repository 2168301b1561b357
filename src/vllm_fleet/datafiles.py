"""The package's data tables (src/vllm_fleet/data/*.yml), read the one way."""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml


def load(name: str) -> Any:
    """The parsed YAML of data/NAME."""
    with resources.files("vllm_fleet").joinpath("data", name).open("r", encoding="utf-8") as f:
        return yaml.safe_load(f)
