"""The configurations the vllm_monitoring role writes, rendered from its own templates, defaults and vars with the
production example's groups and group_vars (inventories/production, its commented monitoring host added as the
example says), then checked by Prometheus' and Alertmanager's own checkers (promtool check config, amtool
check-config), as the role checks them before it installs them. Runs ansible-playbook on the controller only."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, run_ansible

pytestmark = pytest.mark.integration
PROMTOOL, AMTOOL = shutil.which("promtool"), shutil.which("amtool")


def render(tmp_path: Path) -> Path:
    """Render prometheus.yml, alertmanager.yml and the rules into tmp_path/etc (the role's config folder there)."""
    etc = tmp_path / "etc"
    (etc / "rules").mkdir(parents=True)
    role = ROOT / "roles" / "vllm_monitoring"
    # The role's defaults as the group all's variables: below the example's group_vars, as role defaults are.
    # And the fleet's shared defaults (vllm_defaults, the role's dependency) below them.
    defaults = yaml.safe_load((ROOT / "roles" / "vllm_defaults" / "defaults" / "main.yml").read_text())
    defaults.update(yaml.safe_load((role / "defaults" / "main.yml").read_text()))
    (tmp_path / "monitoring.yml").write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": defaults,
                    "children": {
                        "vllm_monitoring": {
                            "hosts": {
                                "mon-01.example.internal": {"ansible_host": "10.0.20.10", "ansible_connection": "local"}
                            }
                        }
                    },
                }
            }
        )
    )
    (tmp_path / "render.yml").write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Render the monitoring configuration",
                    "hosts": "vllm_monitoring",
                    "gather_facts": False,
                    "vars_files": [str(role / "vars" / "main.yml")],
                    "vars": {"role_path": str(role)},
                    "tasks": [
                        {
                            "name": "Rules",
                            "ansible.builtin.copy": {
                                "content": (
                                    "{{ _vllm_monitoring_rules | to_nice_yaml(indent=2, width=120, sort_keys=false) }}"
                                ),
                                "dest": "{{ _vllm_monitoring_rules_path }}",
                                "mode": "0644",
                            },
                        },
                        {
                            "name": "Prometheus",
                            "ansible.builtin.template": {
                                "src": "{{ vllm_monitoring_prometheus_template }}",
                                "dest": f"{etc}/prometheus.yml",
                                "mode": "0644",
                            },
                        },
                        {
                            "name": "Alertmanager",
                            "ansible.builtin.template": {
                                "src": "{{ vllm_monitoring_alertmanager_template }}",
                                "dest": f"{etc}/alertmanager.yml",
                                "mode": "0644",
                            },
                        },
                    ],
                }
            ]
        )
    )
    env = {
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
        "HOME": str(tmp_path),
        "ANSIBLE_FORCE_COLOR": "0",
    }
    proc = run_ansible(
        "ansible-playbook",
        "-i",
        str(ROOT / "inventories" / "production"),
        "-i",
        str(tmp_path / "monitoring.yml"),
        "-e",
        json.dumps({"_vllm_monitoring_config_dir": str(etc)}),
        str(tmp_path / "render.yml"),
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return etc


def test_the_production_examples_monitoring_passes_promtool_and_amtool(tmp_path):
    if PROMTOOL is None or AMTOOL is None:
        pytest.fail(
            "promtool or amtool is missing: scripts/bootstrap.sh installs Debian's prometheus and "
            "prometheus-alertmanager"
        )
    etc = render(tmp_path)
    checked = subprocess.run(
        [PROMTOOL, "check", "config", str(etc / "prometheus.yml")], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    checked = subprocess.run(
        [AMTOOL, "check-config", str(etc / "alertmanager.yml")], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    prometheus = yaml.safe_load((etc / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    # Every host of the example's GPU groups, one target per planned instance, with the plan's labels.
    instances = {entry["labels"]["instance"]: entry for entry in jobs["vllm"]["static_configs"]}
    assert {name.split("/")[0] for name in instances} == {
        "gpu-4090-01.example.internal",
        "gpu-4090-02.example.internal",
        "gpu-l40-01.example.internal",
        "gpu-l40-02.example.internal",
        "gpu-l40-03.example.internal",
    }
    l40 = next(entry for name, entry in instances.items() if name.startswith("gpu-l40-01"))
    assert l40["labels"]["card"].startswith("NVIDIA L40") and l40["labels"]["vllm_release"]
    # The example's gateway, by its name (it has no ansible_host) and the exporter's port.
    assert jobs["haproxy"]["static_configs"] == [{"targets": ["gw-01.example.internal:8405"]}]
    alertmanager = yaml.safe_load((etc / "alertmanager.yml").read_text())
    assert alertmanager["route"]["receiver"] == "oncall"
    assert alertmanager["route"]["routes"][0]["receiver"] == "ops-mail"
    assert {r["name"] for r in alertmanager["receivers"]} == {"oncall", "ops-mail"}
    assert alertmanager["global"]["smtp_smarthost"] == "smtp.example.internal:587"
    assert "smtp_auth_password" not in alertmanager["global"]  # the example leaves it to a Vault file
