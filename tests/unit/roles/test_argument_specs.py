"""Every role's meta/argument_specs.yml and defaults/main.yml stay in step, and the README's variable
tables are the ones generated from the specs (scripts/role-docs.py)."""

import subprocess
import sys

import pytest
import yaml

from conftest import ROOT

ROLES = sorted(p.parent.parent.name for p in ROOT.glob("roles/*/defaults/main.yml"))


def _load(role):
    defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    return defaults, specs


@pytest.mark.parametrize("role", ROLES)
def test_every_default_is_specified_with_the_same_default(role):
    defaults, specs = _load(role)
    options = specs["main"]["options"]
    assert sorted(set(defaults) - set(options)) == [], f"{role}: defaults without an argument spec"
    for name, value in defaults.items():
        templated = isinstance(value, str) and "{{" in value
        # A templated default may be described in words instead; a literal one must match exactly.
        if not templated or "default" in options[name]:
            assert options[name].get("default") == value or templated, (
                f"{role}: {name} default differs between spec and defaults"
            )
        assert options[name].get("description"), f"{role}: {name} has no description"


@pytest.mark.parametrize("role", ROLES)
def test_a_shared_default_mirrored_in_a_spec_is_its_homes_value(role):
    """A role's spec may show a default whose one home is roles/vllm_defaults (for its page); it must be that
    home's value, and the role must depend on vllm_defaults to get it."""
    shared, _ = _load("vllm_defaults")
    defaults, specs = _load(role)
    mirrored = [
        (entry, name, option["default"])
        for entry, spec in specs.items()
        for name, option in (spec.get("options") or {}).items()
        if name in shared and name not in defaults and "default" in option
    ]
    for entry, name, value in mirrored:
        assert value == shared[name], f"{role}/{entry}: {name} shows {value!r}; its home says {shared[name]!r}"
    assert mirrored or role != "vllm"  # the vllm role's page shows vllm_port, vllm_instance...: the test sees them
    if mirrored:
        deps = yaml.safe_load((ROOT / "roles" / role / "meta" / "main.yml").read_text())["dependencies"]
        assert {"role": "vllm_fleet.fleet.vllm_defaults"} in deps, (
            f"{role} shows vllm_defaults' values but does not depend on it"
        )


@pytest.mark.parametrize("role", ROLES)
def test_every_specified_option_has_a_default_or_says_it_comes_from_the_inventory(role):
    defaults, specs = _load(role)
    for entry, spec in specs.items():
        for name, option in spec.get("options", {}).items():
            assert name in defaults or "required" in option or "default" in option, (
                f"{role}/{entry}: {name} is neither in defaults/main.yml nor says whether it is required"
            )


def test_readme_variable_tables_are_generated_from_the_specs():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "role-docs.py"), "--check"], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_roles_metadata_agrees():
    """One author, one namespace and the ansible-core the project pins (requirements/controller.txt), everywhere."""
    metas = {
        p.parent.parent.name: yaml.safe_load(p.read_text())["galaxy_info"]
        for p in sorted(ROOT.glob("roles/*/meta/main.yml"))
    }
    pinned = next(
        line.split("==")[1]
        for line in (ROOT / "requirements" / "controller.txt").read_text().split()
        if line.startswith("ansible-core==")
    )
    assert len(metas) == 10
    for role, meta in metas.items():
        assert meta["role_name"] == role
        assert (meta["namespace"], meta["author"], meta["license"]) == (
            "vllm_fleet",
            "vllm-fleet maintainers",
            "Apache-2.0",
        ), role
        assert pinned.startswith(meta["min_ansible_version"] + "."), (role, meta["min_ansible_version"], pinned)

    def platforms(role):
        return {(p["name"], str(v)) for p in metas[role]["platforms"] for v in p["versions"]}

    # The vllm role includes the firewall role on its hosts: the firewall goes wherever vllm goes.
    assert platforms("vllm") <= platforms("vllm_firewall")
    # Every role runs on Debian 12 and Ubuntu 22.04/24.04; EL 9 is named only by the GPU host's own roles.
    for role in metas:
        assert {("Debian", "bookworm"), ("Ubuntu", "jammy"), ("Ubuntu", "noble")} <= platforms(role), role
