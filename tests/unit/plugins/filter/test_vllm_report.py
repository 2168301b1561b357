"""plugins/filter/vllm_report.py: the run report's one filter, thin over vllm_fleet.fragments (tested in
tests/unit/vllm_fleet/): its export and its refusal of bad input. The report's files are written by the
vllm_report_write action (tests/unit/plugins/action/test_vllm_report_write.py)."""

import pytest
from ansible.errors import AnsibleFilterError

from conftest import ROOT, load_source

R = load_source("vllm_report_filter", ROOT / "plugins" / "filter" / "vllm_report.py").FilterModule().filters()


def test_exports_only_what_the_roles_and_playbooks_use():
    assert sorted(R) == ["vllm_report_fragment"]
    used = " ".join(p.read_text() for p in [*(ROOT / "roles").rglob("*.yml"), *(ROOT / "playbooks").rglob("*.yml")])
    assert [name for name in R if name not in used] == []


def test_a_kind_that_is_not_a_word_is_named():
    with pytest.raises(AnsibleFilterError) as err:
        R["vllm_report_fragment"]({}, "h", "../x")
    assert "kind must be a word" in str(err.value)


def test_a_fragment_names_its_host_instance_and_kind():
    frag = R["vllm_report_fragment"]({"ok": True, "errors": []}, "lab-1", "verify", "cpu0")
    assert (frag["host"], frag["instance"], frag["kind"], frag["data"]) == (
        "lab-1",
        "cpu0",
        "verify",
        {"ok": True, "errors": []},
    ), frag
