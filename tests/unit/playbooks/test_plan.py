"""playbooks/plan.yml (the vllm_plan role) on hosts that cannot be reached: the table, plan.json, and the stop
on a host's error after the report is written."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from conftest import L40, RTX4090
from conftest import ROOT as _ROOT
from vllm_fleet import __version__

ROOT = str(_ROOT)


def write_inventory(path, rtx_profile="rtx4090-7b-decode", l40_overrides=None):
    (path / "group_vars").mkdir(parents=True)
    (path / "hosts.yml").write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "vllm_nodes": {
                            "children": {
                                "rtx4090_nodes": {"hosts": {"gpu-4090-01.invalid": {}, "gpu-4090-02.invalid": {}}},
                                "l40_nodes": {"hosts": {"gpu-l40-01.invalid": {}}},
                            }
                        }
                    }
                }
            }
        )
    )
    (path / "group_vars" / "all.yml").write_text(
        # Hosts known by names: their egress rules admit the fleet by its network (vllm_egress_fleet_networks).
        yaml.safe_dump(
            {
                "vllm_version": "0.33.0",
                "ansible_user": "nobody",
                "ansible_become": True,
                "vllm_egress_fleet_networks": ["192.0.2.0/24"],
            }
        )
    )
    (path / "group_vars" / "rtx4090_nodes.yml").write_text(
        yaml.safe_dump({"vllm_profile_name": rtx_profile, "vllm_gpu": RTX4090})
    )
    (path / "group_vars" / "l40_nodes.yml").write_text(
        yaml.safe_dump(
            {"vllm_profile_name": "l40-14b-awq-prefill", "vllm_gpu": L40, "vllm_profile": l40_overrides or {}}
        )
    )


def run_plan(inventory, report_dir):
    ansible_playbook = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    if not os.path.exists(ansible_playbook):
        pytest.skip("ansible-playbook is not in this Python's venv")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [
            ansible_playbook,
            "-i",
            str(inventory),
            os.path.join(ROOT, "playbooks", "plan.yml"),
            "-e",
            f"vllm_report_dir={report_dir}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.integration
def test_plan_playbook_on_unreachable_hosts(tmp_path):
    pytest.importorskip("ansible")
    write_inventory(tmp_path / "inv")
    result = run_plan(tmp_path / "inv", tmp_path / "out")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "unreachable=0" in result.stdout and "failed=0" in result.stdout
    assert "gpu-4090-01.invalid  rtx4090-7b-decode" in result.stdout  # the table
    with open(tmp_path / "out" / "plan.json", encoding="utf-8") as f:
        written = json.load(f)
    assert sorted(written["hosts"]) == ["gpu-4090-01.invalid", "gpu-4090-02.invalid", "gpu-l40-01.invalid"]
    assert written["hosts"]["gpu-4090-01.invalid"]["capacity"]["kv_cache_tokens"] == 149_888
    assert written["vllm_fleet_version"] == __version__


@pytest.mark.integration
def test_plan_playbook_fails_on_a_host_error_after_writing_the_report(tmp_path):
    pytest.importorskip("ansible")
    write_inventory(tmp_path / "inv", l40_overrides={"gpu_memory_utilization": 0.99})
    result = run_plan(tmp_path / "inv", tmp_path / "out")
    assert result.returncode != 0
    assert "gpu-l40-01.invalid: gpu_memory_utilization=0.99 is above 0.95" in result.stdout
    assert "1 planning error(s)" in result.stdout and "failed=1" in result.stdout
    with open(tmp_path / "out" / "plan.json", encoding="utf-8") as f:
        written = json.load(f)
    assert written["hosts"]["gpu-l40-01.invalid"]["errors"]


@pytest.mark.integration
def test_plan_playbook_takes_a_measured_profile_with_the_readmes_one_line(tmp_path):
    """The 4090 group takes run 10's measured profile (results/gpu/2026-12-04-run10-tune-rtx4090) with the README's
    line, a file lookup beside the inventory: the table marks both 4090 hosts' profile measured and says where and
    when; plan.json's entries say so too and run with its settings. Given to the L40 group, the plan refuses it, names
    the profile it was measured for and stops."""
    pytest.importorskip("ansible")
    inventory = tmp_path / "inv"
    write_inventory(inventory, rtx_profile="rtx4090-7b-prefill")
    (inventory / "measured").mkdir()
    measured = _ROOT / "results" / "gpu" / "2026-12-04-run10-tune-rtx4090" / "measured-profile.yml"
    (inventory / "measured" / "rtx4090.yml").write_text(measured.read_text())
    line = (
        "vllm_profile_measured: \"{{ lookup('ansible.builtin.file', inventory_dir ~ '/measured/rtx4090.yml')"
        ' | from_yaml }}"\n'
    )
    with open(inventory / "group_vars" / "rtx4090_nodes.yml", "a", encoding="utf-8") as f:
        f.write(line)
    result = run_plan(inventory, tmp_path / "out")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "gpu-4090-01.invalid  rtx4090-7b-prefill (measured)" in result.stdout
    assert (
        "profile rtx4090-7b-prefill-measured-2026-12-04 measured on RTX 4090 (emulated on an H200) on 2026-12-04 "
        "(vLLM 0.26.0, driver 580.159.04, Qwen/Qwen2.5-7B-Instruct, load: reference 64 users): vLLM's defaults win"
    ) in result.stdout
    written = json.loads((tmp_path / "out" / "plan.json").read_text())
    entry = written["hosts"]["gpu-4090-01.invalid"]
    assert entry["profile_source"]["kind"] == "measured" and entry["profile_effective"]["max_num_seqs"] == 256
    assert written["hosts"]["gpu-l40-01.invalid"]["profile_source"] == {"kind": "shipped"}
    # The same line in the L40 group: measured for another profile and another card.
    with open(inventory / "group_vars" / "l40_nodes.yml", "a", encoding="utf-8") as f:
        f.write(line)
    refused = run_plan(inventory, tmp_path / "out2")
    assert refused.returncode != 0
    assert (
        "gpu-l40-01.invalid: vllm_profile_measured (rtx4090-7b-prefill-measured-2026-12-04) was measured for the "
        "profile rtx4090-7b-prefill, and this host's vllm_profile_name is l40-14b-awq-prefill"
    ) in refused.stdout
