"""playbooks/tune.yml on the lab, as an operator runs it (this file runs last, after test_sentinel.py's full-path run
left fleet-1 on the inventory's release): a reduced search on fleet-1's cpu1 (vLLM's defaults, the host's profile and
the planner's derived batching, one repeat each) under the site's own load, which the instance's token histograms
give (the requests the lab's clients sent it), while clients stream chat completions through the gateway. The
instance is drained first and, once the search ends, back on its own unit, verified and in the gateway; no request
through the gateway fails or is cut; the search writes its decision, its page and a measured profile, which plan.yml
then takes as the host's profile."""

import json

import pytest
import yaml

from lab import REPORTS, args_of, gateway_state, on, playbook, serves, stream_loop, version_of

HOST, INSTANCE = "fleet-1", "cpu1"
DROPIN = f"/run/systemd/system/vllm@{INSTANCE}.service.d/50-tune.conf"
SEARCH = {
    "vllm_tune_instance": INSTANCE,
    "vllm_tune_repeats": 1,
    "vllm_tune_limit": 2,  # the profile and the derived batching, beside vLLM's defaults
    "vllm_tune_users": 4,
    "vllm_tune_num_prompts": 8,
    "vllm_tune_min_requests": 20,
    "vllm_tune_run_timeout_s": 300,
    "vllm_tune_budget_s": 900,
}


@pytest.fixture(scope="module")
def tuned():
    args_before = args_of(HOST, INSTANCE)
    unit_before = on(HOST, "systemctl", "show", "-p", "FragmentPath,DropInPaths", f"vllm@{INSTANCE}.service")
    loop = stream_loop("tune", seconds=1200, think=6)
    rc, output = playbook("playbooks/tune.yml", "-l", HOST, "-e", json.dumps(SEARCH), timeout=1200)
    through_gateway = loop()
    print(output[-4000:])
    folders = sorted(REPORTS.glob(f"tune-{HOST}-{INSTANCE}-*"))
    return {
        "rc": rc,
        "output": output,
        "gateway": through_gateway,
        "folder": folders[-1] if folders else None,
        "args_before": args_before,
        "unit_before": unit_before,
    }


def test_the_search_ran_each_candidate_and_decided(tuned):
    assert tuned["rc"] == 0, tuned["output"][-4000:]
    assert tuned["output"].count("TASK [vllm_fleet.fleet.vllm : Restart with the candidate's arguments") == 3
    search = json.loads((tuned["folder"] / "search.json").read_text())
    assert search["load"]["source"] == "site" and search["load"]["requests"] >= 20, search["load"]
    assert set(search["measured"]) == {"vllm-defaults", "profile", "derived"}, search["measured"]
    # Each candidate's first start passed the answers gate (harmless changes: batching and limits), none left out.
    assert search["left_out"] == [], search["left_out"]
    assert tuned["output"].count(f"{HOST} ({INSTANCE}): answers go (") == 3, tuned["output"][-4000:]
    for name, runs in search["runs"].items():
        assert len(runs) == 1 and runs[0]["failed"] == 0 and runs[0]["sent"] == 8, (name, runs)
    assert search["decision"]["choice"] in search["measured"], search["decision"]
    page = (tuned["folder"] / "tune.html").read_text()
    # The front plotted (the report's own plotting: PNG figures embedded in the one page) and the decision.
    assert page.startswith("<!DOCTYPE html>") and page.count('src="data:image/png;base64,') >= 1, page[:2000]
    assert f"(choice: {search['decision']['choice']})" in page, page[:2000]


def test_nothing_through_the_gateway_fails_or_is_cut_during_the_search(tuned):
    result = tuned["gateway"]
    assert result["requests"] >= 5, result
    assert (result["failed"], result["cut"]) == (0, 0), result["errors"]


def test_the_instance_is_back_on_its_own_release_verified_and_in_the_gateway(tuned):
    assert on(HOST, "test", "-e", DROPIN, check=False) == "" and "50-tune.conf" not in on(
        HOST, "systemctl", "show", "-p", "DropInPaths", f"vllm@{INSTANCE}.service"
    )
    assert args_of(HOST, INSTANCE) == tuned["args_before"]
    assert (
        on(HOST, "systemctl", "show", "-p", "FragmentPath,DropInPaths", f"vllm@{INSTANCE}.service")
        == tuned["unit_before"]
    )
    assert "TASK [vllm_fleet.fleet.vllm_verify" in tuned["output"] and gateway_state(f"{HOST}_{INSTANCE}") == "UP"
    assert serves(HOST, INSTANCE)


def test_plan_takes_the_measured_profile(tuned):
    assert tuned["rc"] == 0 and tuned["folder"], tuned["output"][-3000:]
    doc = yaml.safe_load((tuned["folder"] / "measured-profile.yml").read_text())
    assert doc["base"] == "cpu-lab-tiny" and (version_of(HOST, INSTANCE) or "").startswith(
        doc["measured"]["vllm_version"]
    )
    taken = REPORTS / "tune-measured-vars.yml"
    taken.write_text(yaml.safe_dump({"vllm_profile_measured": doc}))
    rc, output = playbook("playbooks/plan.yml", "-l", HOST, "-e", f"@{taken}")
    assert rc == 0, output[-3000:]
    plan = json.loads((REPORTS / "plan.json").read_text())
    source = plan["hosts"][HOST]["profile_source"]
    assert source["kind"] == "measured" and source["name"] == doc["name"], source
