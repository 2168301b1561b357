"""plugins/filter/vllm_gateway.py: the gateway filters the roles use, thin over vllm_fleet.gateway (whose own tests
are tests/unit/vllm_fleet/test_gateway.py); here what the plugin adds: its exports and its refusals of bad input."""

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from conftest import ROOT, load_source

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
    assert len(filters) == 10 and all(name.startswith("vllm_gateway_") for name in filters)
    text = "\n".join(p.read_text() for p in USERS)
    assert [name for name in filters if name not in text] == []


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: plugin.vllm_gateway_servers("not a mapping"), "vllm_gateway_servers: expected vllm_plan_instances"),
        (lambda: plugin.vllm_gateway_tenants("team-a:secret"), "vllm_gateway_api_keys must be a list of"),
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
