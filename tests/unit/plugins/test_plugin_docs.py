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
    return {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
        and target.id in ("DOCUMENTATION", "EXAMPLES", "RETURN")
        and isinstance(node.value, ast.Constant)
    }


def _bad_descriptions(node, where=""):
    """Where a description is not text: a ': ' inside a list item makes it a mapping, which YAML accepts and
    ansible-doc refuses ("expected string or bytes-like object")."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "description":
                items = value if isinstance(value, list) else [value]
                yield from (f"{where}/description" for item in items if not isinstance(item, str))
            yield from _bad_descriptions(value, f"{where}/{key}")
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _bad_descriptions(item, f"{where}[{index}]")


@pytest.mark.parametrize("path", [p for p in PLUGINS if "DOCUMENTATION" in _docs(p)], ids=lambda p: p.stem)
def test_the_plugins_documentation_is_yaml(path):
    docs = _docs(path)
    documentation = yaml.safe_load(docs["DOCUMENTATION"])
    assert documentation.get("short_description") and documentation.get("description"), path
    assert documentation.get("name") or documentation.get("module"), path
    assert list(_bad_descriptions(documentation)) == [], path
    if "RETURN" in docs:
        assert list(_bad_descriptions(yaml.safe_load(docs["RETURN"]))) == [], path
    if "EXAMPLES" in docs:
        yaml.safe_load(docs["EXAMPLES"])


def test_every_module_is_documented():
    """A module documents itself; a filter has a file of its own, plugins/filter/<name>.yml
    (tests/unit/plugins/filter/test_filter_docs.py)."""
    undocumented = [p.name for p in PLUGINS if p.parent.name == "modules" and "DOCUMENTATION" not in _docs(p)]
    assert undocumented == []
