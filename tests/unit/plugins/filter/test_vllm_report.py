"""plugins/filter/vllm_report.py: the run report's filters, thin over vllm_fleet.fragments and vllm_fleet.report
(tested in tests/unit/vllm_fleet/): what the plugin adds, its exports and its refusals of bad input."""

import pytest
from ansible.errors import AnsibleFilterError

from conftest import ROOT, load_source

R = load_source("vllm_report_filter", ROOT / "plugins" / "filter" / "vllm_report.py").FilterModule().filters()


def test_exports_only_what_the_roles_and_playbooks_use():
    assert sorted(R) == [
        "vllm_report_fragment",
        "vllm_report_fragment_name",
        "vllm_report_html",
        "vllm_report_markdown",
        "vllm_report_merge",
    ]
    used = " ".join(p.read_text() for p in [*(ROOT / "roles").rglob("*.yml"), *(ROOT / "playbooks").rglob("*.yml")])
    assert [name for name in R if name not in used] == []


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: R["vllm_report_fragment"]({}, "h", "../x"), "kind must be a word"),
        (lambda: R["vllm_report_fragment_name"]({"host": "h"}), "expects the output of vllm_report_fragment"),
        (lambda: R["vllm_report_merge"]("hosts/"), "expects a list of fragments, got 'hosts/'"),
        (lambda: R["vllm_report_merge"]([{"host": "h"}]), "not a report fragment: {'host': 'h'}"),
        (lambda: R["vllm_report_markdown"]([]), "expects the output of vllm_report_merge, got []"),
        (lambda: R["vllm_report_html"]({"run": 1}), "expects the output of vllm_report_merge"),
    ],
)
def test_bad_values_are_named(call, message):
    with pytest.raises(AnsibleFilterError) as err:
        call()
    assert message in str(err.value)


def test_a_fragment_merged_and_rendered():
    frag = R["vllm_report_fragment"]({"ok": True, "errors": []}, "lab-1", "verify", "cpu0")
    assert R["vllm_report_fragment_name"](frag).endswith("--lab-1_cpu0--verify.json")
    merged = R["vllm_report_merge"]([frag], "run-2", {"playbook": "verify.yml"})
    assert merged["summary"]["ok"] == ["lab-1/cpu0"] and merged["meta"] == {"playbook": "verify.yml"}
    assert "lab-1/cpu0" in R["vllm_report_markdown"](merged)
