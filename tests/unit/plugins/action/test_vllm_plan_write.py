"""plugins/action/vllm_plan_write.py, run by a real ansible-playbook on this machine with the project's ansible.cfg:
plan.json written from the fact vllm_plan with the very text Ansible's to_nice_json(indent=2) gave before (the task it
replaces), the table and the errors returned, written in check mode too, and a missing or broken plan refused by
name, not with a traceback."""

import json

import pytest
import yaml

from conftest import L40, RTX4090, ansible_env, run_ansible
from vllm_fleet import __version__

pytestmark = pytest.mark.integration

HOSTS = {
    "gpu-4090.invalid": {"vllm_profile_name": "rtx4090-7b-decode", "vllm_gpu": RTX4090, "vllm_version": "0.33.0"},
    # Above 0.95: the plan's error for this host.
    "gpu-l40.invalid": {
        "vllm_profile_name": "l40-14b-awq-prefill",
        "vllm_gpu": L40,
        "vllm_version": "0.32.0",
        "vllm_profile": {"gpu_memory_utilization": 0.99},
    },
}
PLAN = {
    "name": "Compute the plan of every host",
    "ansible.builtin.set_fact": {"vllm_plan": "{{ hostvars | vllm_fleet.fleet.vllm_plan_hosts(ansible_play_hosts) }}"},
    "run_once": True,
}


def play(tmp_path, tasks, *extra):
    """`tasks` on HOSTS (fictitious: nothing connects) in one play; (rc, output)."""
    inventory = {"all": {"hosts": {h: dict(v, ansible_connection="local") for h, v in HOSTS.items()}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": tasks}]))
    proc = run_ansible(
        "ansible-playbook", "-i", "hosts.yml", "play.yml", *extra, cwd=tmp_path, env=ansible_env(tmp_path), timeout=300
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_plan_json_is_the_text_to_nice_json_wrote_with_the_table_and_the_errors(tmp_path):
    rc, out = play(
        tmp_path,
        [
            PLAN,
            {
                "vllm_fleet.fleet.vllm_plan_write": {"dest": str(tmp_path / "reports" / "plan.json")},
                "register": "written",
                "run_once": True,
            },
            # The task the action replaced, for the comparison.
            {
                "ansible.builtin.copy": {
                    "content": "{{ vllm_plan | to_nice_json(indent=2) }}\n",
                    "dest": str(tmp_path / "before.json"),
                    "mode": "0644",
                },
                "delegate_to": "localhost",
                "run_once": True,
            },
            {"ansible.builtin.copy": {"content": "{{ written | to_json }}", "dest": str(tmp_path / "result.json")}},
        ],
    )
    assert rc == 0, out[-3000:]
    text = (tmp_path / "reports" / "plan.json").read_text()
    assert text == (tmp_path / "before.json").read_text()
    assert sorted(json.loads(text)["hosts"]) == sorted(HOSTS)
    assert json.loads(text)["vllm_fleet_version"] == __version__, "plan.json names the vllm-fleet that planned"
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["changed"] is False and result["hosts"] == 2 and result["path"] == str(tmp_path / "reports/plan.json")
    assert any(line.startswith("gpu-4090.invalid  rtx4090-7b-decode") for line in result["table"]), result["table"]
    assert len(result["errors"]) == 1 and result["errors"][0].startswith(
        "gpu-l40.invalid: gpu_memory_utilization=0.99 is above 0.95"
    ), result["errors"]


def test_written_in_check_mode_too(tmp_path):
    """plan.json is the run's output: `--check` plans, and writes it."""
    rc, out = play(
        tmp_path,
        [PLAN, {"vllm_fleet.fleet.vllm_plan_write": {"dest": str(tmp_path / "plan.json")}, "run_once": True}],
        "--check",
    )
    assert rc == 0, out[-3000:]
    assert sorted(json.loads((tmp_path / "plan.json").read_text())["hosts"]) == sorted(HOSTS)


@pytest.mark.parametrize(
    "tasks, message",
    [
        (
            [{"vllm_fleet.fleet.vllm_plan_write": {"dest": "{{ playbook_dir }}/plan.json"}}],
            "the fact vllm_plan is not the fleet's plan",
        ),
        (
            [
                {"ansible.builtin.set_fact": {"vllm_plan": {"hosts": {"h": "x"}}}},
                {"vllm_fleet.fleet.vllm_plan_write": {"dest": "{{ playbook_dir }}/plan.json"}},
            ],
            "the plan's host entries are not plan entries",
        ),
        ([PLAN, {"vllm_fleet.fleet.vllm_plan_write": {"dest": ""}}], "dest must be the path of plan.json"),
        (
            [PLAN, {"vllm_fleet.fleet.vllm_plan_write": {"dest": "/proc/no-such/plan.json"}}],
            "could not write /proc/no-such/plan.json",
        ),
        (
            [PLAN, {"vllm_fleet.fleet.vllm_plan_write": {"dest": "x", "mode": "0600"}}],
            "Invalid options for vllm_fleet.fleet.vllm_plan_write: mode",
        ),
    ],
)
def test_bad_input_is_refused_by_name(tmp_path, tasks, message):
    rc, out = play(tmp_path, [dict(t, run_once=True) for t in tasks])
    assert rc == 2, out[-3000:]
    assert message in " ".join(out.split()), out[-3000:]
    assert "Traceback" not in out
