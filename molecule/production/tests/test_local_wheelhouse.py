"""A wheelhouse in a local folder of the hosts (issue #49), planned on the controller: playbooks/plan.yml on the
production example as shipped (inventories/production, its egress on), with the install source switched to
``vllm_install_source=wheelhouse`` and ``vllm_wheelhouse_url`` an absolute path, as an operator whose wheelhouse is
copied onto each host sets it (gpu/inventory does). pip reads such a folder on the host itself, so the plan passes
and each host's egress rules hold nothing for it; a relative path is refused at plan time, named with its fix.

Controller only, nothing reaches a host: plan.yml's plays gather no facts and run their tasks on the controller
(the example's hosts are names that resolve nowhere, so any connection would show as UNREACHABLE). The plan is
limited to the vLLM hosts (-l vllm_nodes), whose group_vars give the wheelhouse: the gateway's own checks need the
example's Vault values and certificate file, which it does not ship. Independent of the scenario's lab hosts.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
INVENTORY = ROOT / "inventories" / "production"
VLLM_HOSTS = (
    "gpu-4090-01.example.internal",
    "gpu-4090-02.example.internal",
    "gpu-l40-01.example.internal",
    "gpu-l40-02.example.internal",
    "gpu-l40-03.example.internal",
)
WHEELHOUSE = "/srv/vllm-site/wheelhouse/vllm-0.33.0-cp312-manylinux_2_34_x86_64"
# The example's egress (group_vars/all.yml) as each vLLM host's rules hold it: its allow list, its fleet networks,
# the monitoring host by its address, its resolver. The mirror's URLs (the models) are covered by the mirror's entry.
EXAMPLE_RULES = [
    ("10.0.0.0/16", "any", []),
    ("10.0.0.53/32", "tcp", [53]),
    ("10.0.0.53/32", "udp", [53]),
    ("10.0.20.10/32", "any", []),
    ("192.0.2.10/32", "tcp", [80]),
    ("192.0.2.20/32", "tcp", [443]),
    ("192.0.2.25/32", "tcp", [587]),
]


def plan(tmp_path, wheelhouse, book="playbooks/plan.yml"):
    """(return code, output) of `book` on the production example's vLLM hosts, installing from `wheelhouse`."""
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
    )
    extra = {"vllm_install_source": "wheelhouse", "vllm_wheelhouse_url": wheelhouse, "vllm_report_dir": str(tmp_path)}
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(INVENTORY), str(book)]
    cmd += ["-l", "vllm_nodes", "-e", json.dumps(extra)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def test_a_local_folder_wheelhouse_plans_with_egress_on_and_no_rule_for_it(tmp_path):
    """plan.yml as is, then one play that writes each host's egress rules to a file on the controller, made as
    site.yml's egress play makes them: the host's profile taken from the plan (vllm_profile_effective, which the
    example's model URLs are built from), then the vllm_egress_rules filter."""
    book = tmp_path / "plan-then-egress.yml"
    profile = {
        "name": "Take the host's profile from the plan, as the vllm_firewall role's egress entry point does",
        "ansible.builtin.set_fact": {
            "vllm_profile_effective": "{{ vllm_plan.hosts[inventory_hostname].profile_effective }}",
        },
    }
    write = {
        "name": "Write this host's egress rules on the controller",
        "ansible.builtin.copy": {
            "content": "{{ hostvars | vllm_fleet.fleet.vllm_egress_rules(inventory_hostname, groups) | to_json }}",
            "dest": f"{tmp_path}/egress-{{{{ inventory_hostname }}}}.json",
            "mode": "0644",
        },
        "delegate_to": "localhost",
        "become": False,
    }
    book.write_text(
        yaml.safe_dump(
            [
                {"ansible.builtin.import_playbook": str(ROOT / "playbooks" / "plan.yml")},
                {
                    "name": "The egress rules the plan checked",
                    "hosts": "vllm_nodes",
                    "gather_facts": False,
                    "tasks": [profile, write],
                },
            ],
            sort_keys=False,
        )
    )
    rc, out = plan(tmp_path, WHEELHOUSE, book)
    assert rc == 0, out[-4000:]
    assert "PLAY [Check each fleet host's egress (controller only)]" in out, out[-4000:]
    assert "UNREACHABLE" not in out and "Gathering Facts" not in out
    planned = json.loads((tmp_path / "plan.json").read_text())["hosts"]
    assert sorted(planned) == sorted(VLLM_HOSTS)
    assert all(entry["errors"] == [] for entry in planned.values())
    for host in VLLM_HOSTS:
        found = json.loads((tmp_path / f"egress-{host}.json").read_text())
        assert found["errors"] == [], (host, found["errors"])
        assert not any("vllm_wheelhouse_url" in rule["why"] for rule in found["rules"]), (host, found["rules"])
        assert [(r["to"], r["proto"], r["ports"]) for r in found["rules"]] == EXAMPLE_RULES, (host, found["rules"])


def test_a_relative_wheelhouse_path_is_refused_at_plan_time_with_its_fix(tmp_path):
    rc, out = plan(tmp_path, "wheelhouse/vllm-0.33.0")
    out = " ".join(out.split())
    assert rc != 0
    assert "UNREACHABLE" not in out and "Gathering Facts" not in out
    for host in VLLM_HOSTS:
        assert (
            f"{host}: vllm_wheelhouse_url='wheelhouse/vllm-0.33.0' has no host and port egress could admit; fix: a "
            "URL such as http://10.0.10.5:8080/path, or a local folder as an absolute path" in out
        ), out[-4000:]
