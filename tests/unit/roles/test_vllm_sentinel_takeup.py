"""Which of the sentinel's units a run takes up anew (roles/vllm_sentinel/tasks/main.yml, "Take up the changed units
that ran before"): only one that was active before the run's start task and whose file changed. A first install starts
its units once and restarts none (a restart right after the start, with connections coming, once failed a CI run's
converge); a change to the service that answers a socket's connections alone takes up no socket (the next task
stops that service, and its socket starts it again). The task's own loop expression, rendered by ansible-core's
templar over results shaped as ansible.builtin.systemd_service and template register them;
molecule/fleet/tests/test_sentinel.py runs the take-up itself on a real systemd."""

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from conftest import ROOT

UNITS = ["vllm-sentinel-agent.socket", "vllm-sentinel-metrics.socket", "vllm-sentinel.timer"]
FILES = [*UNITS, "vllm-sentinel.service", "vllm-sentinel-agent.service", "vllm-sentinel-metrics.service"]


def take_up_loop():
    install = yaml.safe_load((ROOT / "roles/vllm_sentinel/tasks/main.yml").read_text())[0]["block"]
    (task,) = [task for task in install if task["name"] == "Take up the changed units that ran before"]
    return task["loop"]


def taken_up(active_before, changed, skipped=False):
    """The units the task would take up, given each unit's ActiveState before the start task and the changed files."""
    run = [
        {"item": unit, "skipped": True, "changed": False}
        if skipped
        else {"item": unit, "changed": False, "status": {"ActiveState": active_before.get(unit, "inactive")}}
        for unit in UNITS
    ]
    files = [{"item": {"key": name, "value": f"{name}.j2"}, "changed": name in changed} for name in FILES]
    variables = {"__vllm_sentinel_run": {"results": run}, "__vllm_sentinel_units": {"results": files}}
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(take_up_loop()))


ALL_ACTIVE = dict.fromkeys(UNITS, "active")


@pytest.mark.parametrize(
    ("active_before", "changed", "expected"),
    [
        pytest.param({}, set(FILES), [], id="first install: started once, nothing restarted"),
        pytest.param(ALL_ACTIVE, set(), [], id="nothing changed"),
        pytest.param(ALL_ACTIVE, {"vllm-sentinel-agent.service"}, [], id="only an answering service changed"),
        pytest.param(
            ALL_ACTIVE, {"vllm-sentinel-agent.socket"}, ["vllm-sentinel-agent.socket"], id="the agent's port changed"
        ),
        pytest.param(
            ALL_ACTIVE,
            {"vllm-sentinel-metrics.socket", "vllm-sentinel.timer"},
            ["vllm-sentinel-metrics.socket", "vllm-sentinel.timer"],
            id="the metrics port and the interval changed",
        ),
        pytest.param(
            {"vllm-sentinel.timer": "active"},
            set(UNITS),
            ["vllm-sentinel.timer"],
            id="sockets that were stopped are started by the start task, not taken up",
        ),
    ],
)
def test_only_changed_units_that_ran_before_are_taken_up(active_before, changed, expected):
    assert taken_up(active_before, changed) == expected


def test_nothing_is_taken_up_when_the_start_task_was_skipped():
    """Check mode with changed files skips the start task (its units do not exist yet): nothing to take up."""
    assert taken_up(ALL_ACTIVE, set(FILES), skipped=True) == []
