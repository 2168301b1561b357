"""plugins/filter/vllm_gateway.py: the gateway filters the roles use, thin over vllm_fleet.gateway (whose own tests
are tests/unit/vllm_fleet/test_gateway.py); here what the plugin adds: its exports and its refusals of bad input."""
import pytest
from ansible.errors import AnsibleFilterError

from conftest import ROOT, load_source

plugin = load_source("vllm_gateway_filter", ROOT / "plugins" / "filter" / "vllm_gateway.py")
USERS = [*(ROOT / "roles").glob("*/tasks/*.yml"), *(ROOT / "roles").glob("*/templates/*.j2"),
         *(ROOT / "roles").glob("*/vars/*.yml"), *(ROOT / "roles").glob("*/defaults/*.yml"),
         *(ROOT / "playbooks").rglob("*.yml"), ROOT / "site.yml"]


def test_exports_only_what_the_roles_and_playbooks_use():
    filters = plugin.FilterModule().filters()
    assert len(filters) == 8 and all(name.startswith("vllm_gateway_") for name in filters)
    text = "\n".join(p.read_text() for p in USERS)
    assert [name for name in filters if name not in text] == []


@pytest.mark.parametrize("call, message", [
    (lambda: plugin.vllm_gateway_servers("not a mapping"), "vllm_gateway_servers: expected vllm_plan_instances"),
    (lambda: plugin.vllm_gateway_tenants("team-a:secret"), "vllm_gateway_api_keys must be a list of"),
    (lambda: plugin.vllm_gateway_clients(["gw"], ["gw"], [], "lab-1"), "vllm_gateway_clients expects hostvars"),
])
def test_bad_input_is_refused_by_name(call, message):
    with pytest.raises(AnsibleFilterError, match=message) as err:
        call()
    assert "secret" not in str(err.value)


def test_a_server_name_joins_host_and_instance():
    # HAProxy's server name for an instance: what the drain and the stats lookups address.
    assert plugin.vllm_gateway_server_name("lab-1", "cpu0") == "lab-1_cpu0"
