"""site.yml (playbooks/site.yml): the plays that take the hosts with something to do keep the inventory's order.

group_by fills vllm_nodes_to_roll_out in the order its results come back, which changes from run to run (the lab
once rolled out its second host as the canary). The rollout's host pattern must give the canary and the batches
in vllm_nodes' order whatever that fill order was. Ansible's own inventory, with the group filled the way the
strategy fills it (InventoryManager.add_dynamic_group), resolves each play's pattern.
"""

import yaml
from ansible.inventory.host import Host
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader

from conftest import ROOT

NODES = [f"node-{i}" for i in range(1, 7)]


def plays_taking(group):
    return [
        play
        for play in yaml.safe_load((ROOT / "playbooks" / "site.yml").read_text())
        if group in str(play.get("hosts", ""))
    ]


def test_the_canary_and_the_batches_follow_the_inventory_not_group_bys_order(tmp_path):
    source = tmp_path / "hosts.yml"
    source.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "vllm_nodes": {"hosts": {name: {} for name in NODES}},
                        "vllm_gateways": {"hosts": {"gw": {}}},
                    }
                }
            }
        )
    )
    inventory = InventoryManager(loader=DataLoader(), sources=[str(source)])
    for name in ("node-5", "node-2", "node-6", "node-1", "node-3"):  # node-4 is unchanged: not in the group
        inventory.add_dynamic_group(Host(name), {"add_group": "vllm_nodes_to_roll_out", "parent_groups": ["all"]})
    assert next(h.name for h in inventory.groups["vllm_nodes_to_roll_out"].get_hosts()) == "node-5"

    plays = plays_taking("vllm_nodes_to_roll_out")
    assert [play["name"] for play in plays] == [
        "Install and stage vLLM before the batches",
        "Roll out vLLM host by host",
    ]
    for play in plays:
        taken = [host.name for host in inventory.get_hosts(play["hosts"])]
        assert taken == ["node-1", "node-2", "node-3", "node-5", "node-6"], (play["name"], play["hosts"], taken)
        # A run limited to some hosts keeps that order too.
        inventory.subset(["node-6", "node-2"])
        assert [host.name for host in inventory.get_hosts(play["hosts"])] == ["node-2", "node-6"]
        inventory.subset(None)
