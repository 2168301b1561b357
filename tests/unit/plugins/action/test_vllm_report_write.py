"""plugins/action/vllm_report_write.py, run by a real ansible-playbook on this machine with the project's ansible.cfg:
fragments written per host, the report merged from all of them (hosts that render at once take turns), every file
replaced whole, nothing written in check mode, and bad input refused by name, not with a traceback."""

import json

import pytest
import yaml

from conftest import ansible_env, run_ansible
from vllm_fleet import __version__

pytestmark = pytest.mark.integration

HOSTS = [f"node-{n}" for n in range(4)]


def play(tmp_path, tasks, *extra):
    """`tasks` on HOSTS (each a local connection) in one play; (rc, output)."""
    inventory = {"all": {"hosts": {h: {"ansible_connection": "local"} for h in HOSTS}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": tasks}]))
    env = ansible_env(tmp_path, ANSIBLE_FORKS="4")
    proc = run_ansible("ansible-playbook", "-i", "hosts.yml", "play.yml", *extra, cwd=tmp_path, env=env, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def fragment_task(run_dir):
    return {
        "name": "Write this host's fragment",
        "vllm_fleet.fleet.vllm_report_write": {
            "run_dir": str(run_dir),
            "fragment": "{{ {'ok': true, 'errors': []}"
            " | vllm_fleet.fleet.vllm_report_fragment(inventory_hostname, 'verify', 'cpu0') }}",
            "render": False,
        },
    }


def test_each_hosts_fragment_then_one_report_of_all_of_them(tmp_path):
    run_dir = tmp_path / "reports" / "run-1"
    rc, out = play(
        tmp_path,
        [
            fragment_task(run_dir),
            {"vllm_fleet.fleet.vllm_report_write": {"run_dir": str(run_dir), "run_id": "run-1"}, "run_once": True},
        ],
    )
    assert rc == 0, out[-3000:]
    assert len(list((run_dir / "hosts").glob("*.json"))) == len(HOSTS)
    report = json.loads((run_dir / "report.json").read_text())
    assert report["run_id"] == "run-1" and sorted(report["summary"]["ok"]) == [f"{h}/cpu0" for h in HOSTS], report
    md = (run_dir / "report.md").read_text()
    assert md.startswith("# vLLM rollout report: run-1")
    html = (run_dir / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and all(h in html for h in HOSTS)
    # Each of the three files names the vllm-fleet version that wrote it.
    assert report["vllm_fleet_version"] == __version__
    assert f" by vllm-fleet {__version__}. Hosts: 4;" in md and f" by vllm-fleet {__version__}. Instances: 4;" in html
    assert "changed=0" in out and "changed=1" not in out  # a report is output, not a host's state
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".report.") and p.name != ".report.lock"]


def test_hosts_that_render_at_once_leave_a_report_of_every_fragment(tmp_path):
    """No run_once: the four hosts merge and write at once, each after its own fragment; under the lock the last
    writer's report holds all four (without it, a host that merged early could write last)."""
    run_dir = tmp_path / "run-2"
    task = fragment_task(run_dir)
    task["vllm_fleet.fleet.vllm_report_write"] = dict(task["vllm_fleet.fleet.vllm_report_write"], render=True)
    rc, out = play(tmp_path, [task])
    assert rc == 0, out[-3000:]
    report = json.loads((run_dir / "report.json").read_text())
    assert sorted(report["summary"]["ok"]) == [f"{h}/cpu0" for h in HOSTS], report["summary"]


def test_check_mode_writes_nothing(tmp_path):
    run_dir = tmp_path / "run-3"
    rc, out = play(
        tmp_path, [fragment_task(run_dir), {"vllm_fleet.fleet.vllm_report_write": {"run_dir": str(run_dir)}}], "--check"
    )
    assert rc == 0, out[-3000:]
    assert not run_dir.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (
            {"run_dir": "{{ playbook_dir }}/r", "fragment": {"host": "h"}},
            "fragment must be vllm_report_fragment's output",
        ),
        ({"run_dir": ""}, "run_dir must be the run's folder"),
        ({"run_dir": "{{ playbook_dir }}/r", "render": False}, "nothing to write"),
        (
            {"run_dir": "{{ playbook_dir }}/r", "format": "pdf"},
            "Invalid options for vllm_fleet.fleet.vllm_report_write: format",
        ),
        ({"run_dir": "/proc/no-such/run"}, "could not write the report in /proc/no-such/run"),
    ],
)
def test_bad_input_is_refused_by_name(tmp_path, args, message):
    rc, out = play(tmp_path, [{"vllm_fleet.fleet.vllm_report_write": args, "run_once": True}])
    assert rc == 2, out[-3000:]
    assert message in " ".join(out.split()), out[-3000:]
    assert "Traceback" not in out
