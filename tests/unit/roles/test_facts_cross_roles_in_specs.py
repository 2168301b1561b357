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


def _role_calls():
    """(file, role, entry point) of every include_role/import_role with tasks_from in the plays and the roles."""
    for path in [*PLAYS, *sorted(ROOT.glob("roles/*/tasks/*.yml"))]:
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, list):
            continue  # a vars file
        is_play = all(isinstance(p, dict) and ("hosts" in p or "ansible.builtin.import_playbook" in p) for p in data)
        plays = data if is_play else [{"tasks": data}]  # a play file, or a task file
        for play in plays:
            for section in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                for task in _tasks(play.get(section)):
                    for action in ("ansible.builtin.include_role", "ansible.builtin.import_role"):
                        call = task.get(action)
                        if isinstance(call, dict) and "tasks_from" in call:
                            yield (
                                str(path.relative_to(ROOT)),
                                call["name"].removeprefix("vllm_fleet.fleet."),
                                call["tasks_from"],
                            )


def test_every_entry_point_entered_with_tasks_from_has_an_argument_spec():
    calls = list(_role_calls())
    assert len(calls) > 20
    missing = [
        f"{where}: {role} tasks_from {entry}"
        for where, role, entry in calls
        if entry
        not in yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    ]
    assert not missing, "entry points without an argument spec:\n" + "\n".join(missing)


def test_site_yml_is_a_list_of_plays_of_roles():
    """Each play of site.yml imports a playbook, lists roles, or calls one role's entry point: the work is in roles."""
    for play in yaml.safe_load((ROOT / "site.yml").read_text()):
        if "ansible.builtin.import_playbook" in play:
            continue
        tasks = [t for section in ("pre_tasks", "tasks", "post_tasks") for t in play.get(section) or []]
        assert play.get("roles") or tasks, play["name"]
        for task in tasks:
            assert set(task) <= {"name", "ansible.builtin.import_role", "tags"}, (play["name"], task)
