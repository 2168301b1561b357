"""plugins/filter/vllm_monitoring.py: the monitoring filters the vllm_monitoring role and playbooks/diagnose.yml use,
thin over vllm_fleet.monitoring and vllm_fleet.inputs (tested in tests/unit/vllm_fleet/); here what the plugin adds:
its exports, its refusals of bad input, and the firewall networks it folds by family."""

import pytest
from ansible.errors import AnsibleFilterError

from conftest import ROOT, load_source

plugin = load_source("vllm_monitoring_filter", ROOT / "plugins" / "filter" / "vllm_monitoring.py")
USERS = [
    *(ROOT / "roles").rglob("*.yml"),
    *(ROOT / "roles").rglob("*.j2"),
    *(ROOT / "templates").glob("*.j2"),
    *(ROOT / "playbooks").rglob("*.yml"),
    ROOT / "site.yml",
]


def test_exports_only_what_the_roles_and_playbooks_use():
    filters = plugin.FilterModule().filters()
    assert len(filters) == 8
    text = "\n".join(p.read_text() for p in USERS)
    assert [name for name in filters if name not in text] == []


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: plugin.vllm_monitoring_targets({"lab-1": {}}), "expected plan.json's"),
        (lambda: plugin.vllm_monitoring_gateway_targets("lab-gw"), "expected the gateways' hostvars, a list"),
        (lambda: plugin.vllm_monitoring_rules([], {}), "expected the rules file's groups"),
        (lambda: plugin.vllm_monitoring_rules({"groups": []}, {"NoSuchAlert": "1m"}), "fix: name shipped alerts only"),
        (lambda: plugin.vllm_monitoring_findings([1, 2], "10m"), "expected {counter: increase}"),
    ],
)
def test_bad_input_is_refused_by_name(call, message):
    with pytest.raises(AnsibleFilterError, match=message):
        call()


def test_firewall_networks_by_family_and_a_bad_entry_named():
    got = plugin.vllm_firewall_networks(
        ["10.0.0.0/8", "192.168.1.7", "2001:db8::/32", "10.0.0.0/8"], "lab-mon", "vllm_monitoring_allowed_networks"
    )
    assert got == {"ipv4": ["10.0.0.0/8", "192.168.1.7/32"], "ipv6": ["2001:db8::/32"]}
    with pytest.raises(AnsibleFilterError) as err:
        plugin.vllm_firewall_networks(["10.0.0.300"], "lab-mon", "vllm_monitoring_allowed_networks")
    assert all(part in str(err.value) for part in ("lab-mon", "vllm_monitoring_allowed_networks", "10.0.0.300"))


def test_the_settings_check_fills_the_roles_defaults_where_the_inventory_is_silent():
    assert plugin.vllm_monitoring_errors({}, "lab-mon") == []
    # The alertmanager's default port (9093) is taken: the check sees the default beside the inventory's value.
    (error,) = plugin.vllm_monitoring_errors({"vllm_monitoring_prometheus_port": 9093}, "lab-mon")
    assert error.startswith(
        "lab-mon: vllm_monitoring_prometheus_port and vllm_monitoring_alertmanager_port are both 9093"
    )
    with pytest.raises(AnsibleFilterError, match="vllm_monitoring_errors expects hostvars"):
        plugin.vllm_monitoring_errors(["lab-mon"], "lab-mon")


def test_the_settings_check_never_shows_a_webhook_url():
    token = "hook-T0KEN-0123456789"
    (error,) = plugin.vllm_monitoring_errors(
        {"vllm_monitoring_receivers": [{"name": "chat", "webhook_url": f"chat.example.org/{token}"}]}, "lab-mon"
    )
    assert "webhook_url (value not shown: it may hold a token)" in error and token not in error
