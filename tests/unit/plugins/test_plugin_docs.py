"""Every plugin's DOCUMENTATION, EXAMPLES and RETURN are YAML that ansible-doc can read (a stray ': ' in a
description breaks them silently: the plugin still runs, its documentation does not)."""
import ast
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

PLUGINS = sorted((ROOT / "plugins").glob("*/*.py"))


def _docs(path: Path) -> dict:
    tree = ast.parse(path.read_text())
    return {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            for target in node.targets if isinstance(target, ast.Name)
            and target.id in ("DOCUMENTATION", "EXAMPLES", "RETURN") and isinstance(node.value, ast.Constant)}


@pytest.mark.parametrize("path", [p for p in PLUGINS if "DOCUMENTATION" in _docs(p)], ids=lambda p: p.stem)
def test_the_plugins_documentation_is_yaml(path):
    docs = _docs(path)
    documentation = yaml.safe_load(docs["DOCUMENTATION"])
    assert documentation.get("short_description") and documentation.get("description"), path
    assert documentation.get("name") or documentation.get("module"), path
    for part in ("EXAMPLES", "RETURN"):
        if part in docs:
            yaml.safe_load(docs[part])


def test_every_filter_and_module_is_documented():
    undocumented = [p.name for p in PLUGINS if p.parent.name in ("filter", "modules") and "DOCUMENTATION" not in _docs(p)]
    assert undocumented == []
