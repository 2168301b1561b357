"""Every filter has its own documentation: plugins/filter/<name>.yml beside the plugin, with DOCUMENTATION, EXAMPLES
and RETURN (Ansible's convention for filters, which ansible-doc reads: ansible.builtin's and community.general's
filters are documented so). The filters are those each plugins/filter/*.py exports (FilterModule.filters()), so a
filter added without its file fails here, named, and so does an option the file names that the function does not
take, or one it takes that the file leaves out."""

from __future__ import annotations

import ast
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, load_source

FILTERS = ROOT / "plugins" / "filter"
# The collection this checkout is (galaxy.yml), and its filters' folder as Ansible finds it (ansible.cfg's
# collections_path: collections/ansible_collections/vllm_fleet/fleet, a link to this checkout).
COLLECTION = "vllm_fleet.fleet"
AS_COLLECTION = ROOT / "collections" / "ansible_collections" / "vllm_fleet" / "fleet" / "plugins" / "filter"
DOC_NAMES = ("DOCUMENTATION", "EXAMPLES", "RETURN")


def _exported() -> dict[str, tuple]:
    """{filter name: (its function, the plugin file)} for every plugins/filter/*.py."""
    found: dict[str, tuple] = {}
    for path in sorted(FILTERS.glob("*.py")):
        module = load_source(f"filter_docs_{path.stem}", path)
        for name, function in module.FilterModule().filters().items():
            assert name not in found, f"{name} is exported by {found[name][1].name} and {path.name}"
            found[name] = (function, path)
    return found


EXPORTED = _exported()
NAMES = sorted(EXPORTED)


def _doc_file(name: str) -> dict:
    path = FILTERS / f"{name}.yml"
    plugin = EXPORTED[name][1].name
    assert path.is_file(), (
        f"the filter {name} ({plugin}) has no documentation: write {path.relative_to(ROOT)} with DOCUMENTATION, "
        "EXAMPLES and RETURN (ansible-doc -t filter reads it)"
    )
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _not_text(node, where=""):
    """Where a description is not text: a ': ' inside a plain scalar makes it a mapping, which YAML accepts and
    ansible-doc refuses."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("description", "short_description"):
                items = value if isinstance(value, list) else [value]
                yield from (f"{where}/{key}" for item in items if not isinstance(item, str))
            yield from _not_text(value, f"{where}/{key}")
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from _not_text(item, f"{where}[{index}]")


def test_the_plugins_export_filters():
    assert len(NAMES) > 50, NAMES


@pytest.mark.parametrize("name", NAMES)
def test_each_filter_has_its_documentation_examples_and_return(name):
    docs = _doc_file(name)
    assert isinstance(docs, dict) and set(DOC_NAMES) <= set(docs), f"{name}.yml needs {', '.join(DOC_NAMES)}"
    documentation = docs["DOCUMENTATION"]
    assert documentation["name"] == name
    for key in ("short_description", "description", "version_added", "author", "options"):
        assert documentation.get(key), f"{name}.yml: DOCUMENTATION has no {key}"
    assert "_input" in documentation["options"], f"{name}.yml: the input (_input) is not documented"
    for option, spec in documentation["options"].items():
        assert spec.get("description") and spec.get("type"), f"{name}.yml: option {option} needs a description and type"
    examples = docs["EXAMPLES"]
    assert isinstance(examples, str) and name in examples, f"{name}.yml: EXAMPLES must show the filter in use"
    assert yaml.safe_load(examples), f"{name}.yml: EXAMPLES is not YAML"
    value = (docs["RETURN"] or {}).get("_value") or {}
    assert value.get("description") and value.get("type"), f"{name}.yml: RETURN needs _value with description and type"
    assert list(_not_text(docs)) == [], f"{name}.yml: descriptions that are not text"


def _default(value):
    """A Python default as the documentation writes it (a tuple is a YAML list)."""
    return list(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize("name", NAMES)
def test_the_documented_options_are_the_functions_arguments(name):
    """_input is the first argument (what is piped in); every other argument is an option of the same name, required
    where it has no default and with the same default where it has one (an argument that defaults to None has no
    default in the documentation: its description says what its absence means)."""
    function, plugin = EXPORTED[name]
    parameters = list(inspect.signature(function).parameters.values())
    options = dict(_doc_file(name)["DOCUMENTATION"]["options"])
    options.pop("_input", None)
    arguments = {p.name: p for p in parameters[1:]}
    assert sorted(options) == sorted(arguments), f"{name}.yml documents {sorted(options)}; {plugin.name} takes"
    for argument in arguments.values():
        spec = options[argument.name]
        if argument.default is inspect.Parameter.empty:
            assert spec.get("required") is True, f"{name}.yml: {argument.name} has no default, so it is required"
        else:
            assert not spec.get("required"), f"{name}.yml: {argument.name} has a default, so it is not required"
            if argument.default is not None:
                assert spec.get("default") == _default(argument.default), (
                    f"{name}.yml: {argument.name}'s default is {argument.default!r} in {plugin.name}"
                )
            else:
                assert spec.get("default") is None, f"{name}.yml: {argument.name} defaults to None in {plugin.name}"
    positional = _doc_file(name)["DOCUMENTATION"].get("positional")
    if positional is not None:
        assert [p.strip() for p in positional.split(",")] == ["_input", *arguments], f"{name}.yml: positional"


def test_every_documentation_file_is_a_filters():
    orphans = sorted(p.name for p in FILTERS.glob("*.yml") if p.stem not in EXPORTED)
    assert orphans == [], "documentation of no exported filter (renamed or removed?)"


def test_no_plugin_file_holds_documentation_of_its_own():
    """ansible-doc reads a plugin file's DOCUMENTATION before the filter's own .yml: one left in a file that exports
    several filters would be shown for each of them."""
    holding = []
    for path in sorted(FILTERS.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if hasattr(t, "id")}
        holding += [f"{path.name}: {n}" for n in DOC_NAMES if n in names]
    assert holding == [], "move these into plugins/filter/<filter>.yml, one file per filter"


def _ansible_doc(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-doc"), "-t", "filter", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_ansible_doc_renders_every_filter_from_its_own_file():
    """ansible-doc, from this checkout (ansible.cfg: the checkout as the collection vllm_fleet.fleet), reads each
    filter's .yml and renders it, as text and as JSON, with no error or warning."""
    fqcns = [f"{COLLECTION}.{name}" for name in NAMES]
    shown = _ansible_doc(*fqcns)
    assert shown.returncode == 0 and "ERROR" not in shown.stderr and "WARNING" not in shown.stderr, shown.stderr
    missing = [
        name for name in NAMES if f"> FILTER {COLLECTION}.{name} ({AS_COLLECTION}/{name}.yml)" not in shown.stdout
    ]
    assert missing == [], f"ansible-doc did not render these from their own .yml: {missing}\n{shown.stderr}"
    read = _ansible_doc("--json", *fqcns)
    assert read.returncode == 0 and "ERROR" not in read.stderr, read.stderr
    docs = json.loads(read.stdout)
    assert {
        name: docs[f"{COLLECTION}.{name}"]["doc"]["filename"] for name in NAMES if f"{COLLECTION}.{name}" in docs
    } == {name: f"{AS_COLLECTION}/{name}.yml" for name in NAMES}
