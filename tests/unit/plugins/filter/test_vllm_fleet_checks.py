"""The plan's one-pass checks of every host (plugins/filter/vllm_egress.py's vllm_egress_errors_hosts and
plugins/filter/vllm_sentinel.py's vllm_sentinel_errors_hosts): each gives, for the whole play in one call, exactly the
errors the per-host filters give host by host, with the roles' defaults where the inventory says nothing and each
vLLM host's profile from the plan. The playbook's own messages are tested in tests/unit/playbooks."""

import os
import sys

import pytest

from conftest import ROOT

pytest.importorskip("ansible", reason="the filter plugins need ansible-core (the .venv)")
sys.path.insert(0, os.path.join(str(ROOT), "plugins", "filter"))
import vllm_egress
import vllm_sentinel
from ansible.errors import AnsibleFilterError

MIRROR = {"to": "10.89.77.2", "ports": [8080], "why": "the mirror"}
HOSTVARS = {
    "gpu-1": {"ansible_host": "10.89.77.21", "vllm_egress_allow": [MIRROR]},
    # A URL whose host is a name: an error for this host only.
    "gpu-2": {"ansible_host": "10.89.77.22", "vllm_model_url": "http://mirror.example.internal/models/m"},
    # Egress off: no rules, so no errors, whatever it sets.
    "gpu-3": {"ansible_host": "10.89.77.25", "vllm_egress": "no", "vllm_model_url": "http://elsewhere.internal/m"},
    "gw": {"ansible_host": "10.89.77.20"},
    "mon": {"ansible_host": "10.89.77.23", "vllm_monitoring_receivers": [{"to": "bad"}]},
}
GROUPS = {"vllm_nodes": ["gpu-1", "gpu-2", "gpu-3"], "vllm_gateways": ["gw"], "vllm_monitoring": ["mon"]}
PLAN = {
    "hosts": {
        h: {"instances": [{"name": "main", "port": 8000}], "profile_effective": {"model": "org/model"}}
        for h in GROUPS["vllm_nodes"]
    }
}


def test_egress_in_one_pass_gives_each_hosts_own_errors():
    hosts = ["gpu-1", "gpu-2", "gpu-3", "gw", "mon"]
    one_pass = vllm_egress.vllm_egress_errors_hosts(HOSTVARS, hosts, GROUPS, PLAN)
    host_by_host = [
        e
        for h in hosts
        if HOSTVARS[h].get("vllm_egress", True) is True
        for e in vllm_egress.vllm_egress_rules(HOSTVARS, h, GROUPS)["errors"]
    ]
    assert one_pass == host_by_host and one_pass, one_pass
    assert any(e.startswith("gpu-2: vllm_model_url='http://mirror.example.internal/models/m'") for e in one_pass)
    assert not [e for e in one_pass if e.startswith(("gpu-1:", "gpu-3:", "gw:"))], one_pass


def test_egress_gives_a_vllm_host_its_profile_from_the_plan():
    """A model URL built from the profile (vllm_profile_effective), as the production example builds it: resolved with
    the plan's profile; a host that has its own keeps it."""
    hostvars = {
        "gpu-1": {"ansible_host": "10.89.77.21", "vllm_egress_allow": [MIRROR]},
        "gpu-2": dict(HOSTVARS["gpu-2"], vllm_profile_effective={"model": "own/model"}),
    }
    groups = {"vllm_nodes": ["gpu-1", "gpu-2"]}
    seen = {}

    class Recording(dict):
        def get(self, name, default=None):
            if name == "vllm_model_url":
                seen[self["ansible_host"]] = self.get("vllm_profile_effective")
            return super().get(name, default)

    wrapped = {h: Recording(v) for h, v in hostvars.items()}
    original = vllm_egress._variables
    try:
        vllm_egress._variables = lambda view, host, plan=None: Recording(original(view, host, plan))
        vllm_egress.vllm_egress_errors_hosts(wrapped, ["gpu-1", "gpu-2"], groups, PLAN)
    finally:
        vllm_egress._variables = original
    assert seen == {"10.89.77.21": {"model": "org/model"}, "10.89.77.22": {"model": "own/model"}}


@pytest.mark.parametrize("value", ["maybe", 3])
def test_egress_refuses_a_vllm_egress_that_is_not_a_boolean(value):
    hostvars = {"gpu-1": {"ansible_host": "10.89.77.21", "vllm_egress": value}}
    errors = vllm_egress.vllm_egress_errors_hosts(hostvars, ["gpu-1"], {"vllm_nodes": ["gpu-1"]}, PLAN)
    assert errors == ["gpu-1: vllm_egress is not a boolean or cannot be resolved; fix: true or false"]


def test_egress_in_one_pass_refuses_what_is_not_a_host_list():
    with pytest.raises(AnsibleFilterError, match="expected a list of host names"):
        vllm_egress.vllm_egress_errors_hosts(HOSTVARS, "gpu-1", GROUPS)
    with pytest.raises(AnsibleFilterError, match="vllm_egress_errors_hosts expects hostvars"):
        vllm_egress.vllm_egress_errors_hosts([], ["gpu-1"], GROUPS)


def test_sentinel_in_one_pass_gives_each_hosts_own_errors_with_the_defaults():
    hostvars = {
        "gpu-1": {},
        "gpu-2": {"vllm_sentinel_agent_port": 8000, "vllm_sentinel_interval_s": 0},
        "gpu-3": {"vllm_sentinel_metrics_port": "9300"},  # a text, as -e gives it: a port all the same
    }
    errors = vllm_sentinel.vllm_sentinel_errors_hosts(hostvars, list(hostvars), PLAN)
    assert [e.split(":", 1)[0] for e in errors] == ["gpu-2", "gpu-2"], errors
    assert "vllm_sentinel_agent_port=8000 is also the port of one of the host's vLLM instances" in errors[0] + errors[1]
    defaults = {name: vllm_sentinel.datafiles.role_defaults()[name] for name in vllm_sentinel.sentinel.SETTINGS}
    assert errors == [
        e for h, v in hostvars.items() for e in vllm_sentinel.vllm_sentinel_errors({**defaults, **v}, h, [8000])
    ]


def test_sentinel_in_one_pass_needs_the_plan():
    with pytest.raises(AnsibleFilterError, match="expected the plan"):
        vllm_sentinel.vllm_sentinel_errors_hosts({"h": {}}, ["h"], None)


def test_each_hosts_rules_from_the_peers_read_once_are_the_rules_it_read_itself():
    """The egress entry point reads every fleet host's address once (vllm_egress_peers) and gives it to each host's
    vllm_egress_rules: the same rules and errors as a host that reads every other host itself."""
    hostvars = {**HOSTVARS, "gw": {"ansible_host": "10.89.77.20", "vllm_gateway_vip": "10.89.77.100/24"}}
    peers = vllm_egress.vllm_egress_peers(hostvars, GROUPS)
    assert peers["gw"] == {"ansible_host": "10.89.77.20", "vllm_gateway_vip": "10.89.77.100/24"}
    assert set(peers) == set(hostvars)
    for host in hostvars:
        assert vllm_egress.vllm_egress_rules(hostvars, host, GROUPS, peers) == vllm_egress.vllm_egress_rules(
            hostvars, host, GROUPS
        )
    with pytest.raises(AnsibleFilterError, match="peers must be vllm_egress_peers' output"):
        vllm_egress.vllm_egress_rules(hostvars, "gw", GROUPS, ["gw"])
