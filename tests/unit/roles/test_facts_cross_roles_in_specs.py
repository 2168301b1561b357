"""No fact crosses a role boundary without being in a spec: a fact a role sets (set_fact, register) that another role
or a play reads is named in the setting role's meta/argument_specs.yml (an entry point's description says what it
outputs), so that a reader of the spec knows what the role leaves behind. Names starting with _ are a role's own."""

from __future__ import annotations

import re

import yaml

from conftest import ROOT

ROLES = sorted(p.parent.parent for p in ROOT.glob("roles/*/meta/argument_specs.yml"))
PLAYS = [ROOT / "site.yml", *sorted((ROOT / "playbooks").rglob("*.yml"))]


def _tasks(node):
    if isinstance(node, list):
        for item in node:
            yield from _tasks(item)
    elif isinstance(node, dict):
        yield node
        for key in ("block", "rescue", "always"):
            yield from _tasks(node.get(key))


def facts_set(role):
    names = set()
    for path in (role / "tasks").glob("*.yml"):
        for task in _tasks(yaml.safe_load(path.read_text())):
            facts = task.get("ansible.builtin.set_fact") or task.get("set_fact")
            if isinstance(facts, dict):
                names.update(k for k in facts if k != "cacheable")
            if isinstance(task.get("register"), str):
                names.add(task["register"])
    return {n for n in names if not n.startswith("_")}


def readers(name, role):
    pattern = re.compile(rf"(?<![\w.]){re.escape(name)}\b")
    files = [
        p
        for other in ROLES
        if other != role
        for sub in ("tasks", "templates", "defaults", "vars")
        for p in (other / sub).rglob("*")
        if p.is_file()
    ] + PLAYS
    return sorted(str(p.relative_to(ROOT)) for p in files if pattern.search(p.read_text()))


def test_every_fact_another_role_or_a_play_reads_is_in_the_setting_roles_spec():
    missing = []
    crossing = 0
    for role in ROLES:
        spec = (role / "meta" / "argument_specs.yml").read_text()
        for name in sorted(facts_set(role)):
            where = readers(name, role)
            if where:
                crossing += 1
                if not re.search(rf"\b{re.escape(name)}\b", spec):
                    missing.append(f"{role.name} sets {name}, read by {', '.join(where[:4])}")
    assert crossing > 5  # the test sees the facts the rollout passes along
    assert not missing, "facts that cross a role boundary without being in the setting role's spec:\n" + "\n".join(
        missing
    )
