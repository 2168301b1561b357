"""One home per default: the fleet's literal defaults (vLLM's port, the instance name, the unit's name) are written
once, in roles/vllm_defaults/defaults/main.yml, and read from there by every role, play and plugin. The argument
specs' `default:` fields mirror them for the role pages, and test_argument_specs checks that they agree.

The test reads the code (tasks, templates, plays, plugins and the library), not its documentation: YAML comments,
Python docstrings and a plugin's DOCUMENTATION/EXAMPLES/RETURN text describe, they set nothing."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

from conftest import ROOT

HOME = ROOT / "roles" / "vllm_defaults" / "defaults" / "main.yml"
# What each default looks like when written as code.
LITERALS = {
    "port 8000": re.compile(r"(?<![\w.])8000(?![\w.])"),
    "instance name main": re.compile(r"""^main$|default\(\s*['"]main['"]\s*\)"""),
    "unit name vllm@NAME.service": re.compile(r"vllm@\{"),
}
# vLLM's own default port (what `vllm serve` binds without --port), read when a recorded command line has none: a
# fact of vLLM, not of this fleet.
NOT_OURS = {("src/vllm_fleet/endpoints.py", "port 8000")}
DOC_NAMES = {"DOCUMENTATION", "EXAMPLES", "RETURN"}


def _yaml_values(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("description", "short_description", "name", "msg", "fail_msg", "success_msg"):
                continue  # prose
            yield from _yaml_values(value)
    elif isinstance(node, list):
        for value in node:
            yield from _yaml_values(value)
    elif node is not None and not isinstance(node, bool):
        yield str(node)


def _python_values(path: Path):
    """A Python file's values as code: integers, the fallbacks of `x or VALUE` and of `.get(key, VALUE)`, parameters'
    defaults, and f-strings; not docstrings, messages or a plugin's documentation."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in DOC_NAMES for t in node.targets):
            skip.update(id(n) for n in ast.walk(node.value))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Constant) and type(node.value) is int:
            yield str(node.value)
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            yield from (str(v.value) for v in node.values if isinstance(v, ast.Constant))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            yield from (str(a.value) for a in node.args[1:] if isinstance(a, ast.Constant))
        elif isinstance(node, ast.arguments):
            yield from (str(d.value) for d in (*node.defaults, *node.kw_defaults) if isinstance(d, ast.Constant))
        elif isinstance(node, ast.JoinedStr):
            yield "".join(v.value if isinstance(v, ast.Constant) else "{" for v in node.values)


def _code_files():
    for pattern in (
        "site.yml",
        "playbooks/**/*.yml",
        "roles/*/tasks/*.yml",
        "roles/*/defaults/*.yml",
        "roles/*/vars/*.yml",
        "roles/*/handlers/*.yml",
        "roles/*/templates/**/*.j2",
        "templates/**/*.j2",
        "plugins/**/*.py",
        "src/vllm_fleet/**/*.py",
    ):
        yield from sorted(ROOT.glob(pattern))


def _values(path: Path):
    if path.suffix == ".py":
        return list(_python_values(path))
    if path.suffix == ".j2":
        return [line for line in path.read_text().splitlines() if not line.lstrip().startswith(("#", "{#"))]
    return list(_yaml_values(yaml.safe_load(path.read_text())))


def written():
    """{default: [file, ...]} for every place a literal default is written as code."""
    found: dict[str, list[str]] = {name: [] for name in LITERALS}
    for path in _code_files():
        rel = str(path.relative_to(ROOT))
        for value in _values(path):
            for name, pattern in LITERALS.items():
                if (rel, name) not in NOT_OURS and any(pattern.search(v) for v in value.splitlines() or [value]):
                    found[name].append(rel)
    return found


def test_each_literal_default_is_written_once_in_its_home():
    found = written()
    for name, places in found.items():
        assert places == [str(HOME.relative_to(ROOT))], f"{name} is written in {places}; its one home is {HOME}"


def test_the_home_holds_the_defaults_the_test_looks_for():
    home = yaml.safe_load(HOME.read_text())
    assert home["vllm_port"] == 8000 and home["vllm_instance"] == "main"
    assert home["vllm_unit_format"].replace("{name}", "x") == "vllm@x.service"
