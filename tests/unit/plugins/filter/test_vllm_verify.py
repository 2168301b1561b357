"""The vllm_verify filter plugin: thin wrappers over vllm_fleet.verdict and vllm_fleet.report, on REAL vLLM
answers and /metrics pages (tests/unit/fixtures/vllm/), and AnsibleFilterError naming the bad value."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from conftest import ROOT, fixture_json, fixture_text, load_source
from vllm_fleet import fragments, report

IDLE = fixture_text("vllm", "0.32.0-cpu", "metrics_idle.txt")
AFTER = fixture_text("vllm", "0.32.0-cpu", "metrics_after_20_requests.txt")
CHAT = fixture_json("vllm", "0.32.0-cpu", "responses", "chat.json")
MODELS = fixture_json("vllm", "0.32.0-cpu", "responses", "models.json")


plugin = load_source("vllm_verify_filter", ROOT / "plugins" / "filter" / "vllm_verify.py")
F = plugin.FilterModule().filters()
R = load_source("vllm_report_filter", ROOT / "plugins" / "filter" / "vllm_report.py").FilterModule().filters()
PROBES = {
    "health": {"ok": True, "already_up": True},
    "version": {"status": 200, "json": {"version": "0.32.0"}},
    "models": {"status": 200, "json": MODELS},
    "smoke": {"status": 200, "json": CHAT, "elapsed": 0},
    "metrics_before": {"status": 200, "content": IDLE},
    "metrics_after": {"status": 200, "content": AFTER},
}
EXPECT = {"vllm_version": "0.32.0", "served_model_name": "tiny", "profile": None, "plan": None, "latency_budget_s": 10}


def preempted(text: str, value: float) -> str:
    return re.sub(r"(?m)^(vllm:num_preemptions_total\{[^}]*\}) \S+$", r"\g<1> %r" % value, text)


def test_only_what_the_role_uses_is_registered():
    assert sorted(F) == [
        "vllm_probe_url",
        "vllm_verify_result",
        "vllm_verify_snapshot_outputs",
        "vllm_verify_unit_verdict",
    ]
    used = " ".join(p.read_text() for p in (ROOT / "roles" / "vllm_verify").rglob("*.yml"))
    assert all(name in used for name in F)


def test_ansible_doc_reads_the_documentation():
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-doc"), "-t", "filter", "vllm_fleet.fleet.vllm_verify_result"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "vllm_verify_result" in proc.stdout and "thresholds" in proc.stdout


def test_verify_result_and_report_filters():
    """A verification, as the role judges it, through the report filters (plugins/filter/vllm_report.py)."""
    entry = F["vllm_verify_result"](PROBES, "lab-1", EXPECT, {"min_prefix_queries": 100})
    assert entry["ok"] and entry["host"] == "lab-1"
    frag = R["vllm_report_fragment"](entry, "lab-1", "verify")
    assert fragments.fragment_name(frag).endswith("--lab-1--verify.json")
    merged = fragments.merge([frag], run_id="run-1")
    assert merged["summary"]["ok"] == ["lab-1"]
    assert report.render_markdown(merged).startswith("# vLLM rollout report: run-1")
    verdict = F["vllm_verify_unit_verdict"]("ActiveState=active\nSubState=running\nNRestarts=0\n", "vllm@main.service")
    assert verdict["error"] == "" and verdict["restarts"] == 0


@pytest.mark.parametrize(
    "address, url",
    [
        ("", "http://127.0.0.1:8000"),
        (None, "http://127.0.0.1:8000"),
        ("0.0.0.0", "http://127.0.0.1:8000"),
        ("::", "http://127.0.0.1:8000"),
        ("[::]", "http://127.0.0.1:8000"),
        ("10.0.0.5", "http://10.0.0.5:8000"),
        ("127.0.0.1", "http://127.0.0.1:8000"),
        ("fd00::5", "http://[fd00::5]:8000"),
        ("[fd00::5]", "http://[fd00::5]:8000"),
    ],
)
def test_probe_url_reaches_a_wildcard_bind_on_loopback_and_brackets_ipv6(address, url):
    """The one bind-address-to-URL rule: the vllm_verify role's probes and playbooks/benchmark.yml."""
    assert F["vllm_probe_url"](address, 8000) == url
    assert F["vllm_probe_url"](address, 8443, "https") == url.replace("http:", "https:").replace(":8000", ":8443")
    with pytest.raises(AnsibleFilterError, match="vllm_probe_url: scheme must be http or https, got 'ftp'"):
        F["vllm_probe_url"](address, 8000, "ftp")
    benchmark = (ROOT / "playbooks" / "benchmark.yml").read_text()
    assert "vllm_probe_url" in benchmark and "0.0.0.0" not in benchmark


def test_thresholds_reach_the_findings():
    """A real scrape pair with preemptions grown by 4: a finding at the default threshold, none at 10."""
    probes = dict(PROBES, metrics_after={"status": 200, "content": preempted(AFTER, 4.0)})
    found = F["vllm_verify_result"](probes, "h", EXPECT)["findings"]
    assert [f["id"] for f in found if f["id"] == "preemptions_growing"] == ["preemptions_growing"]
    assert not [
        f
        for f in F["vllm_verify_result"](probes, "h", EXPECT, {"max_preemption_increase": 10})["findings"]
        if f["id"] == "preemptions_growing"
    ]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: F["vllm_verify_result"]([], "h", {}), "probes must be a dict, got []"),
        (lambda: F["vllm_verify_result"]({}, "", {}), "host must be a name, got ''"),
        (lambda: F["vllm_verify_result"]({}, "h", []), "expect must be a dict, got []"),
        (lambda: F["vllm_verify_result"]({}, "h", {}, {"min_hit_rate": 0.5}), "unknown threshold 'min_hit_rate'"),
        (
            lambda: F["vllm_verify_result"]({}, "h", {}, {"min_acceptance_rate": "high"}),
            "threshold min_acceptance_rate must be a number, got 'high'",
        ),
        (
            lambda: F["vllm_verify_result"]({}, "h", {}, {"max_preemption_increase": True}),
            "threshold max_preemption_increase must be a number, got True",
        ),
        (lambda: F["vllm_verify_unit_verdict"](None, "u"), "expects the stdout of systemctl show, got None"),
        (lambda: F["vllm_verify_unit_verdict"]("", "u", -1), "max_restarts must be 0 or more, got -1"),
    ],
)
def test_bad_values_are_named(call, message):
    with pytest.raises(AnsibleFilterError) as err:
        call()
    assert message in str(err.value)


def test_long_bad_values_are_shortened():
    with pytest.raises(AnsibleFilterError) as err:
        F["vllm_verify_result"](["x" * 500], "h", {})
    assert len(str(err.value)) < 300 and "..." in str(err.value)


def test_a_missing_library_is_explained(monkeypatch):
    monkeypatch.setattr(plugin, "_IMPORT_ERROR", ImportError("No module named 'prometheus_client'"))
    with pytest.raises(AnsibleFilterError, match=r"needs the vllm_fleet package .* `pip install -e \.`"):
        F["vllm_verify_result"](PROBES, "h", EXPECT)


def test_snapshot_outputs_take_each_prompts_text_or_say_why_there_is_none():
    """The snapshot's looped uri results (a 200 with a choice, a 500, a 200 without choices) become one
    {prompt, text, error} each; anything but a list fails naming what it got."""
    from ansible.errors import AnsibleFilterError

    results = [
        {"item": "The capital of France is", "status": 200, "json": {"choices": [{"text": " Paris."}]}},
        {"item": "def f():", "status": 500, "msg": "Status code was 500 and not [200]"},
        {"item": "Hi", "status": 200, "json": {"choices": []}},
    ]
    out = F["vllm_verify_snapshot_outputs"](results)
    assert out[0] == {"prompt": "The capital of France is", "text": " Paris.", "error": None}
    assert out[1]["text"] is None and out[1]["error"].startswith("HTTP 500: Status code was 500")
    assert out[2]["text"] is None and out[2]["error"].startswith("HTTP 200")
    with pytest.raises(AnsibleFilterError, match="expects the looped uri results"):
        F["vllm_verify_snapshot_outputs"]({"results": results})
