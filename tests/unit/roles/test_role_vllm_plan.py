"""The vllm_plan role: its argument spec covers its defaults."""

import os

import yaml

from conftest import ROOT as _ROOT

ROOT = str(_ROOT)


def test_argument_specs_cover_the_role_defaults():
    role = os.path.join(ROOT, "roles", "vllm_plan")
    with open(os.path.join(role, "defaults", "main.yml"), encoding="utf-8") as f:
        defaults = yaml.safe_load(f)
    with open(os.path.join(role, "meta", "argument_specs.yml"), encoding="utf-8") as f:
        options = yaml.safe_load(f)["argument_specs"]["main"]["options"]
    for name, value in defaults.items():
        assert name in options, f"{name} has no argument spec"
        assert options[name]["default"] == value, name
