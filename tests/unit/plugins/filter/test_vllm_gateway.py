"""plugins/filter/vllm_gateway.py: the gateway filters the roles use, thin over vllm_fleet.gateway (whose own tests
are tests/unit/vllm_fleet/test_gateway.py); here what the plugin adds: its exports and its refusals of bad input."""

import json
import os
import sys

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from conftest import ROOT, load_source, run_ansible

plugin = load_source("vllm_gateway_filter", ROOT / "plugins" / "filter" / "vllm_gateway.py")
USERS = [
    *(ROOT / "roles").glob("*/tasks/*.yml"),
    *(ROOT / "roles").glob("*/templates/*.j2"),
    *(ROOT / "roles").glob("*/vars/*.yml"),
    *(ROOT / "roles").glob("*/defaults/*.yml"),
    *(ROOT / "playbooks").rglob("*.yml"),
    ROOT / "site.yml",
]


def test_exports_only_what_the_roles_and_playbooks_use():
    filters = plugin.FilterModule().filters()
    assert len(filters) == 17 and all(name.startswith("vllm_gateway_") for name in filters)
    text = "\n".join(p.read_text() for p in USERS)
    assert [name for name in filters if name not in text] == []


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: plugin.vllm_gateway_servers("not a mapping"), "vllm_gateway_servers: expected vllm_plan_instances"),
        (lambda: plugin.vllm_gateway_tenants("team-a:secret"), "vllm_gateway_api_keys must be a list of"),
        (lambda: plugin.vllm_gateway_routes({"a": 1}, []), "vllm_gateway_routes: expected vllm_gateway_servers' list"),
        (lambda: plugin.vllm_gateway_routes([], "team-a:secret"), "vllm_gateway_api_keys must be a list of"),
        (lambda: plugin.vllm_gateway_route_errors("x", "gw", []), "vllm_gateway_route_errors: expected"),
        (lambda: plugin.vllm_gateway_peers({}, "gw"), "vllm_gateway_peers expects hostvars"),
        (lambda: plugin.vllm_gateway_peers({}, ["gw"]), "vllm_gateway_peers: the gateway 'gw' is not in the inventory"),
        (lambda: plugin.vllm_gateway_clients(["gw"], ["gw"], [], "lab-1"), "vllm_gateway_clients expects hostvars"),
        (lambda: plugin.vllm_gateway_backend_key(["gw"], "gw", ["lab-1"]), "vllm_gateway_backend_key expects hostvars"),
        (
            lambda: plugin.vllm_gateway_backend_key_errors({}, "gw", "lab-1"),
            "vllm_gateway_backend_key_errors expects hostvars",
        ),
        (
            lambda: plugin.vllm_gateway_backend_key({"lab-1": {}}, "gw", ["lab-9"]),
            "vllm_gateway_backend_key: gw's backend host 'lab-9' is not in the inventory",
        ),
    ],
)
def test_bad_input_is_refused_by_name(call, message):
    with pytest.raises(AnsibleFilterError, match=message) as err:
        call()
    assert "secret" not in str(err.value)


def test_a_server_name_joins_host_and_instance():
    # HAProxy's server name for an instance: what the drain and the stats lookups address.
    assert plugin.vllm_gateway_server_name("lab-1", "cpu0") == "lab-1_cpu0"


SECRET = "lab-secret-0123456789abcdefghij"
HOSTVARS = {
    "gw": {"vllm_gateway_port": 443},
    "lab-1": {"vllm_api_key": SECRET},
    "lab-2": {"vllm_api_key": SECRET},
    "lab-3": {},
    "lab-4": {"vllm_api_key": SECRET[::-1]},
}


def test_the_backend_key_is_read_from_the_backend_hosts_hostvars():
    assert plugin.vllm_gateway_backend_key(HOSTVARS, "gw", ["lab-1", "lab-2"]) == SECRET
    assert plugin.vllm_gateway_backend_key(HOSTVARS, "gw", ["lab-3"]) == ""  # none set: vLLM checks no key
    assert plugin.vllm_gateway_backend_key(HOSTVARS, "gw", []) == ""
    assert plugin.vllm_gateway_backend_key_errors(HOSTVARS, "gw", ["lab-1", "lab-2"]) == []


@pytest.mark.parametrize(
    "backends, needle",
    [
        (
            ["lab-1", "lab-2", "lab-3"],
            "gw: its backend hosts do not share the one vllm_api_key the gateway sends them: "
            "lab-1 has a vllm_api_key and lab-3 has none",
        ),
        (["lab-1", "lab-4"], "lab-1 and lab-4 have different vllm_api_key values"),
    ],
)
def test_backend_hosts_that_differ_are_refused_by_name_never_by_key(backends, needle):
    with pytest.raises(AnsibleFilterError, match="fix: the one vllm_api_key of the group vllm_nodes") as err:
        plugin.vllm_gateway_backend_key(HOSTVARS, "gw", backends)
    (error,) = plugin.vllm_gateway_backend_key_errors(HOSTVARS, "gw", backends)
    assert needle in error and str(err.value) == error
    assert SECRET not in error and SECRET[::-1] not in error


def test_the_preflight_reads_the_backend_keys_where_no_result_is_shown():
    """The task that reads every backend's key is no_log; the assert that shows the messages reads only them."""
    tasks = yaml.safe_load((ROOT / "roles" / "vllm_gateway" / "tasks" / "preflight.yml").read_text())
    reading = [t for t in tasks if "vllm_gateway_backend_key_errors(" in yaml.safe_dump(t)]
    assert len(reading) == 1 and reading[0]["no_log"] is True, reading
    (fact,) = reading[0]["ansible.builtin.set_fact"]
    (check,) = [t for t in tasks if fact in str(t.get("ansible.builtin.assert", {}).get("that"))]
    assert "hostvars" not in yaml.safe_dump(check) and "no_log" not in check


# --- where each gateway's vllm_gateway_vrrp_password came from, read by Ansible itself from its data tags ----------
VRRP_PASSWORD = "Vr7q!x2z"  # a test value: it must never appear in the output
# Every gateway shares the vip correctly; only where its password comes from differs (host_vars beat group_vars).
GATEWAYS = {
    # An inline !vault value (ansible-vault encrypt_string): from Vault.
    "gw-inline": None,
    # Plain text in a host's vars file: refused, naming the file and line.
    "gw-plain": "written in plain text in inv/host_vars/gw-plain.yml line 1",
    # The unvault lookup of a vault-encrypted file: from Vault.
    "gw-unvault": None,
    # The file lookup of that file decrypts it too, but strips the text, which drops the tags: refused.
    "gw-file": "the result of a template in inv/host_vars/gw-file.yml line 1 that keeps no mark of Ansible Vault",
    # The group's vars file encrypted whole (ansible-vault encrypt): from Vault.
    "gw-sealed": None,
}
PLAYBOOK = """
- name: Each gateway's vip errors, as the role's preflight reads them
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Write them
      ansible.builtin.copy:
        dest: "{{ out }}"
        mode: "0600"
        content: >-
          {% set ns = namespace(found={}) %}{% for g in groups['vllm_gateways'] %}{% set ns.found = ns.found |
          combine({g: hostvars | vllm_fleet.fleet.vllm_gateway_vip_errors(g, groups['vllm_gateways'])}) %}{% endfor %}{{
          ns.found | to_json }}
"""


def _vault_inventory(tmp_path):
    """The inventory of GATEWAYS in tmp_path (its Vault password file: tmp_path/vp), and the environment to run it."""
    # This test's Vault password only (scripts/env.sh adds the lab's Vault identity to the environment).
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_VAULT")}
    env.update(
        ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
        ANSIBLE_VAULT_PASSWORD_FILE=str(tmp_path / "vp"),
    )
    (tmp_path / "ansible.cfg").write_text(f"[defaults]\ncollections_path = {ROOT / 'collections'}\n")
    (tmp_path / "vp").write_text("vault-test-password\n")
    (tmp_path / "p.yml").write_text(PLAYBOOK)
    inventory = tmp_path / "inv"
    (inventory / "host_vars").mkdir(parents=True)
    (inventory / "group_vars" / "vllm_gateways").mkdir(parents=True)
    hosts = {
        name: {"ansible_host": f"10.89.77.{11 + i}", "vllm_gateway_vrrp_priority": 150 - i}
        for i, name in enumerate(GATEWAYS)
    }
    (inventory / "hosts.yml").write_text(yaml.safe_dump({"vllm_gateways": {"hosts": hosts}}))
    (inventory / "group_vars" / "vllm_gateways" / "main.yml").write_text(
        "vllm_gateway_vip: 10.89.77.9/24\nvllm_gateway_vrrp_version: 2\n"
    )
    (inventory / "group_vars" / "vllm_gateways" / "vault.yml").write_text(
        f"vllm_gateway_vrrp_password: {VRRP_PASSWORD}\n"
    )
    (tmp_path / "password.vault").write_text(VRRP_PASSWORD)  # no trailing newline: the unvault lookup keeps it
    sealed = run_ansible(
        "ansible-vault", "encrypt", "inv/group_vars/vllm_gateways/vault.yml", "password.vault", cwd=tmp_path, env=env
    )
    inline = run_ansible(
        "ansible-vault", "encrypt_string", "--name", "vllm_gateway_vrrp_password", VRRP_PASSWORD, cwd=tmp_path, env=env
    )
    assert sealed.returncode == 0 and inline.returncode == 0, sealed.stderr + inline.stderr
    lookup = "vllm_gateway_vrrp_password: \"{{{{ lookup('ansible.builtin.{}', '%s') }}}}\"\n" % (
        tmp_path / "password.vault"
    )
    (inventory / "host_vars" / "gw-inline.yml").write_text(inline.stdout)
    (inventory / "host_vars" / "gw-plain.yml").write_text(f"vllm_gateway_vrrp_password: {VRRP_PASSWORD}\n")
    (inventory / "host_vars" / "gw-unvault.yml").write_text(lookup.format("unvault"))
    (inventory / "host_vars" / "gw-file.yml").write_text(lookup.format("file"))
    return env


def _vip_errors_by_ansible(tmp_path, env, *args):
    out = tmp_path / "errors.json"
    done = run_ansible("ansible-playbook", "-i", "inv", "p.yml", "-e", f"out={out}", *args, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert VRRP_PASSWORD not in done.stdout + done.stderr
    return json.loads(out.read_text())


@pytest.mark.integration
def test_the_vrrp_password_must_come_from_vault_as_ansible_tags_it(tmp_path):
    env = _vault_inventory(tmp_path)
    found = _vip_errors_by_ansible(tmp_path, env)
    assert sorted(found) == sorted(GATEWAYS)
    for name, source in GATEWAYS.items():
        if source is None:
            assert found[name] == [], (name, found[name])
        else:
            (error,) = found[name]
            assert error.startswith(
                f"{name}: vllm_gateway_vrrp_password (value not shown) must come from Ansible Vault"
            )
            assert f"where it came from: {source}" in error, error
    assert VRRP_PASSWORD not in json.dumps(found)
    # -e (extra vars) beats every inventory value: a password on the command line is refused on every gateway.
    found = _vip_errors_by_ansible(tmp_path, env, "-e", f"vllm_gateway_vrrp_password={VRRP_PASSWORD}")
    assert all(
        len(errors) == 1 and "where it came from: given on the command line (-e); fix:" in errors[0]
        for errors in found.values()
    ), found
    assert VRRP_PASSWORD not in json.dumps(found)


def test_without_data_tags_no_password_is_taken_as_from_vault(monkeypatch):
    """An ansible-core without 2.19's data tags cannot tell where a value came from: the check refuses, saying so."""
    monkeypatch.setitem(sys.modules, "ansible.module_utils._internal._datatag", None)
    hostvars = {
        name: {
            "ansible_host": address,
            "vllm_gateway_vip": "10.89.77.9/24",
            "vllm_gateway_vrrp_priority": priority,
            "vllm_gateway_vrrp_version": 2,
            "vllm_gateway_vrrp_password": VRRP_PASSWORD,
        }
        for name, address, priority in (("gw-1", "10.89.77.11", 150), ("gw-2", "10.89.77.12", 100))
    }
    (error,) = plugin.vllm_gateway_vip_errors(hostvars, "gw-1", ["gw-1", "gw-2"])
    assert "where it came from: cannot tell whether it came from Vault (ansible-core without data tags)" in error
    assert VRRP_PASSWORD not in error
