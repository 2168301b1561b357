"""plugins/filter/vllm_plan.py: the planning filters over vllm_fleet.planner (the filters a role uses, their
errors naming the bad value, the vllm role's defaults filled in, the detected GPUs mapped onto vllm_gpu)."""

import os
import sys

import pytest
import yaml

from conftest import L40, RTX4090
from conftest import ROOT as _ROOT
from vllm_fleet import planner

ROOT = str(_ROOT)


def load_filters():
    pytest.importorskip("ansible", reason="the filter plugin needs ansible-core (the .venv)")
    sys.path.insert(0, os.path.join(ROOT, "plugins", "filter"))
    import vllm_plan

    return vllm_plan


def test_filter_plugin_filters():
    vllm_plan = load_filters()
    from ansible.errors import AnsibleFilterError

    filters = vllm_plan.FilterModule().filters()
    assert set(filters) == {
        "vllm_plan_host",
        "vllm_plan_hosts",
        "vllm_plan_table",
        "vllm_min_driver",
        "vllm_plan_instances",
        "vllm_plan_read",
        "vllm_plan_for_version",
        "vllm_tune_candidates",
        "vllm_lora_sources",
        "vllm_lora_configs",
        "vllm_lora_runtime_change",
    }
    assert filters["vllm_min_driver"]("0.33.0")["driver"] == "580.65.06"
    with pytest.raises(AnsibleFilterError, match="vllm_min_driver: vllm_version='latest'"):
        filters["vllm_min_driver"]("latest")
    hostvars = {
        "a": {
            "vllm_profile_name": "rtx4090-7b-decode",
            "vllm_gpu": RTX4090,
            "vllm_version": "0.33.0",
            "ansible_host": "10.0.0.1",
        },
        "b": {"vllm_profile_name": "l40-14b-awq-prefill", "vllm_gpu": L40, "vllm_version": "0.32.0"},
    }
    whole = filters["vllm_plan_hosts"](hostvars, ["b", "a"], 512, 256)
    assert list(whole["hosts"]) == ["a", "b"] and whole["hosts"]["a"]["capacity"]["kv_cache_tokens"] == 149_888
    with pytest.raises(AnsibleFilterError, match=r"vllm_plan_hosts: host 'c' is not in hostvars"):
        filters["vllm_plan_hosts"](hostvars, ["c"])
    with pytest.raises(AnsibleFilterError, match=r"vllm_plan_hosts: expected a list of host names, got 'a'"):
        filters["vllm_plan_hosts"](hostvars, "a")
    instances = filters["vllm_plan_instances"](hostvars, ["b", "a"])
    assert list(instances) == ["a", "b"] and instances["a"][0]["name"] == "main"
    with pytest.raises(AnsibleFilterError, match=r"vllm_plan_instances: host 'c' is not in hostvars"):
        filters["vllm_plan_instances"](hostvars, ["a", "c"])
    with pytest.raises(AnsibleFilterError, match=r"vllm_plan_instances: expected a list of host names, got 3"):
        filters["vllm_plan_instances"](hostvars, 3)
    # The profile is resolved and rendered in the plan only: the plan's entry has both.
    entry = filters["vllm_plan_host"](dict(hostvars["a"], vllm_profile={"max_num_seqs": 32}), "a")
    assert entry["profile_effective"]["max_num_seqs"] == 32
    assert entry["instances"][0]["args"][entry["instances"][0]["args"].index("--max-num-seqs") + 1] == "32"
    assert {d["flag"] for d in entry["dropped"]} == {"--swap-space", "--calculate-kv-scales"}
    # The plan had the host run another release (the upgrade gate's prediction for the one before), its local
    # label dropped; the host's own variables are read, not changed.
    older = filters["vllm_plan_for_version"](hostvars["a"], "a", "0.32.0+cpu")
    assert (older["vllm_version"], entry["vllm_version"]) == ("0.32.0", "0.33.0") and not older["errors"]
    assert hostvars["a"]["vllm_version"] == "0.33.0"
    with pytest.raises(AnsibleFilterError, match=r"vllm_plan_for_version: expected a vLLM version such as '0.32.0'"):
        filters["vllm_plan_for_version"](hostvars["a"], "a", "")
    with pytest.raises(
        AnsibleFilterError, match=r"vllm_plan_host: expected a mapping of the host's variables, got str"
    ):
        filters["vllm_plan_host"]("x", "h1")
    with pytest.raises(AnsibleFilterError, match=r"vllm_plan_table: expected plan.json's"):
        filters["vllm_plan_table"]([])


def test_the_filter_fills_what_the_inventory_leaves_from_the_vllm_roles_defaults():
    """The planner sees the role's defaults (state folder, bind address, port) where the inventory says nothing,
    so plan.json's arguments are the deployed ones on a plain inventory too."""
    filters = load_filters()
    defaults = {}
    for role in ("vllm_defaults", "vllm"):  # the fleet's shared defaults' one home, and the vllm role's own
        with open(os.path.join(ROOT, "roles", role, "defaults", "main.yml")) as handle:
            defaults.update(yaml.safe_load(handle))
    hostvars = {
        "h1": {
            "vllm_profile_name": "cpu-lab-tiny",
            "vllm_version": "0.32.0",
            "vllm_gpu": {"name": "cpu", "memory_mib": 1024, "bandwidth_gb_s": 20, "count": 0},
        }
    }
    entry = filters.vllm_plan_hosts(hostvars, ["h1"])["hosts"]["h1"]
    args = entry["instances"][0]["args"]
    assert args[0] == "%s/models/lab--tiny-qwen2" % defaults["vllm_state_dir"]
    assert args[args.index("--host") + 1] == defaults["vllm_bind_address"]
    assert args[args.index("--port") + 1] == str(defaults["vllm_port"])
    hostvars["h1"]["vllm_port"] = 9000
    assert "9000" in filters.vllm_plan_hosts(hostvars, ["h1"])["hosts"]["h1"]["instances"][0]["args"]


# A lab host's settings (the lab's CPU profile and release), as its inventory gives them.
LAB_HOST = {
    "vllm_profile_name": "cpu-lab-tiny",
    "vllm_version": "0.32.0",
    "vllm_gpu": {"name": "cpu", "memory_mib": 1024, "bandwidth_gb_s": 20, "count": 0},
    "group_names": ["vllm_nodes"],
}


def test_numbers_given_on_the_command_line_are_taken_as_their_specs_type():
    """-e gives every value as text: `-e vllm_shutdown_timeout=25` and `-e vllm_port=9000` plan as 25 and 9000, as
    Ansible's own argument specs take them, for the host's plan and for the instances a gateway reads; a text that is
    no number still gets the plan's message."""
    filters = load_filters()
    host = dict(LAB_HOST, vllm_shutdown_timeout="25", vllm_port="9000")
    entry = filters.vllm_plan_hosts({"h1": host}, ["h1"])["hosts"]["h1"]
    assert entry["errors"] == []
    args = entry["instances"][0]["args"]
    assert args[args.index("--shutdown-timeout") + 1] == "25" and args[args.index("--port") + 1] == "9000"
    assert filters.vllm_plan_instances({"h1": host}, ["h1"])["h1"][0]["port"] == 9000
    refused = filters.vllm_plan_hosts({"h1": dict(host, vllm_shutdown_timeout="25s")}, ["h1"])["hosts"]["h1"]
    assert any("vllm_shutdown_timeout='25s'" in error for error in refused["errors"]), refused["errors"]


def test_detected_gpus_replace_the_groups_assumption_with_its_bandwidth_for_the_same_card():
    """The nvidia_driver role publishes nvidia_driver_gpus; the plan sizes the host with them: the detected name,
    count, smallest memory and compute capability, the group's bandwidth when the group names the same card (by
    nvidia-smi name or catalog model), else the catalog's, else the group's, else 0."""
    l40s = {
        "model": "L40",
        "name": "NVIDIA L40",
        "count": 4,
        "memory_mib": 46068,
        "compute_cap": "8.9",
        "bandwidth_gb_s": 864,
        "driver_version": "580.159.04",
        "uuids": [],
    }
    wanted = {"name": "NVIDIA L40", "memory_mib": 46068, "count": 4, "compute_cap": "8.9"}
    assert planner.detected_gpu(dict(L40, bandwidth_gb_s=900), l40s) == dict(wanted, bandwidth_gb_s=900)
    assert planner.detected_gpu({"name": "L40", "bandwidth_gb_s": 850}, l40s) == dict(wanted, bandwidth_gb_s=850)
    # a group that assumed another card: the catalog's figure for the detected one
    assert planner.detected_gpu(RTX4090, l40s) == dict(wanted, bandwidth_gb_s=864)
    assert planner.detected_gpu(None, l40s) == dict(wanted, bandwidth_gb_s=864)
    unknown = dict(l40s, model="NVIDIA RTX 6000", name="NVIDIA RTX 6000", bandwidth_gb_s=None)
    assert planner.detected_gpu(RTX4090, unknown)["bandwidth_gb_s"] == 1008
    assert planner.detected_gpu({}, unknown)["bandwidth_gb_s"] == 0
    # The filter plugin plans a host with its detected cards once the role has published them.
    filters = load_filters().FilterModule().filters()
    host = {"vllm_profile_name": "l40-14b-awq-prefill", "vllm_gpu": RTX4090, "vllm_version": "0.32.0"}
    assumed = filters["vllm_plan_host"](host, "a")
    detected = filters["vllm_plan_host"](dict(host, nvidia_driver_gpus=dict(l40s, count=1)), "a")
    assert assumed["gpu"] == {"name": "NVIDIA GeForce RTX 4090", "count": 1, "memory_mib": 24564}
    assert detected["gpu"] == {"name": "NVIDIA L40", "count": 1, "memory_mib": 46068, "compute_cap": "8.9"}
    assert (
        detected["capacity"]
        == filters["vllm_plan_host"](dict(host, vllm_gpu=dict(L40, compute_cap="8.9")), "a")["capacity"]
    )


BAD_HOSTS = {
    "extra-shutdown": {"vllm_extra_args": {"shutdown_timeout": 20}},
    "extra-host": {"vllm_extra_args": {"host": "0.0.0.0"}},
    "extra-api-key": {"vllm_extra_args": {"api_key": "sk-filter-0123"}},
    "extra-list": {"vllm_extra_args": ["--enforce-eager"]},
    "speculative-list": {"vllm_profile": {"speculative": [{"model": "Qwen/Qwen2.5-0.5B-Instruct"}]}},
    "served-name-u2028": {"vllm_profile": {"served_model_name": "a\u2028b"}},
    "version-list": {"vllm_version": ["0.33.0"]},
    "profile-name-dict": {"vllm_profile_name": {"a": 1}},
    "model-config-list": {"vllm_model_config": ["/x"]},
    "allow-nested": {"vllm_environment_allow": [["PYTHONPATH"]]},
}


def test_no_filter_surfaces_a_python_exception_for_bad_input():
    """Each of these raised a TypeError or AttributeError out of a filter (vllm_plan_instances too: a gateway planned
    with -l <gateway> died on a host's vllm_extra_args.host); each is now a message naming the host, and
    vllm_plan_instances gives the host no instances (its own plan names the error)."""
    filters = load_filters().FilterModule().filters()
    good = {"vllm_profile_name": "rtx4090-7b-decode", "vllm_gpu": RTX4090, "vllm_version": "0.33.0"}
    hostvars = {"good": good, **{name: dict(good, **bad) for name, bad in BAD_HOSTS.items()}}
    instances = filters["vllm_plan_instances"](hostvars, list(hostvars))
    assert instances["good"][0]["name"] == "main"
    assert all(instances[name] == [] for name in BAD_HOSTS), instances
    whole = filters["vllm_plan_hosts"](hostvars, list(hostvars))
    assert whole["hosts"]["good"]["errors"] == []
    for name in BAD_HOSTS:
        errors = whole["hosts"][name]["errors"]
        assert errors and all(e.startswith(f"{name}: ") and "fix:" in e for e in errors), errors
        assert not any("could not be made" in e for e in errors), errors
        assert filters["vllm_plan_host"](hostvars[name], name)["errors"] == errors
    assert "sk-filter-0123" not in str(whole)


def test_an_exception_the_plan_did_not_foresee_is_an_error_naming_the_host(monkeypatch):
    vllm_plan = load_filters()

    def broken(host, hostvars):
        raise KeyError("sk-leaked-value")

    monkeypatch.setattr(vllm_plan.planner, "plan_host", broken)
    entry = vllm_plan.vllm_plan_host({"vllm_version": "0.33.0"}, "h1")
    (message,) = entry["errors"]
    assert message.startswith("h1: the plan could not be made") and "KeyError" in message and "fix:" in message
    assert "sk-leaked-value" not in message and entry["instances"] == []
    assert vllm_plan.vllm_plan_hosts({"h1": {}}, ["h1"])["hosts"]["h1"]["errors"] == [message]
    assert vllm_plan.vllm_plan_instances({"h1": {}}, ["h1"]) == {"h1": []}


def test_the_table_and_the_host_lists_refuse_what_they_cannot_read_with_a_filter_error():
    vllm_plan = load_filters()
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match=r"vllm_plan_table: plan\.json's host entries are not plan entries"):
        vllm_plan.vllm_plan_table({"hosts": {"h1": {"errors": []}}})
    with pytest.raises(AnsibleFilterError, match=r"vllm_plan_hosts: expected hostvars \(a mapping"):
        vllm_plan.vllm_plan_hosts(["h1"], ["h1"])
    with pytest.raises(AnsibleFilterError, match=r"vllm_plan_instances: hostvars\['h1'\] is a str"):
        vllm_plan.vllm_plan_instances({"h1": "x"}, ["h1"])
    with pytest.raises(AnsibleFilterError, match=r"vllm_plan_hosts: host \['a'\] is not in hostvars"):
        vllm_plan.vllm_plan_hosts({"h1": {}}, [["a"]])


def test_ansibles_own_errors_pass_through_as_they_are(monkeypatch):
    """An undefined variable that a host's setting names is Ansible's to report, with its own message."""
    vllm_plan = load_filters()
    from ansible.errors import AnsibleUndefinedVariable

    def undefined(host, hostvars):
        raise AnsibleUndefinedVariable("'lab_gateway' is undefined")

    monkeypatch.setattr(vllm_plan.planner, "plan_host", undefined)
    with pytest.raises(AnsibleUndefinedVariable, match="lab_gateway"):
        vllm_plan.vllm_plan_host({"vllm_version": "0.33.0"}, "h1")
    with pytest.raises(AnsibleUndefinedVariable, match="lab_gateway"):
        vllm_plan.vllm_plan_instances({"h1": {}}, ["h1"])


def test_readers_take_the_plan_this_run_made_and_plan_only_a_host_it_did_not():
    """The gateways and Prometheus read each host's entry of its fact vllm_plan (made once per run by the vllm_plan
    role, replaced on the host when its GPUs were detected); a host this run did not plan (a run limited to other
    hosts) is planned from its settings, as plan.yml would."""
    filters = load_filters()
    settings = {
        "vllm_profile_name": "cpu-lab-tiny",
        "vllm_version": "0.32.0",
        "vllm_gpu": {"name": "cpu", "memory_mib": 1024, "bandwidth_gb_s": 20, "count": 0},
    }
    planned = filters.vllm_plan_hosts({"a": settings}, ["a"])
    made = dict(planned["hosts"]["a"], instances=[{"name": "as-made", "port": 9100}])  # not what planning gives
    hostvars = {"a": dict(settings, vllm_plan={"hosts": {"a": made}}), "b": dict(settings)}
    read = filters.vllm_plan_read(hostvars, ["b", "a"])
    assert list(read["hosts"]) == ["a", "b"] and read["hosts"]["a"] == made
    assert read["hosts"]["b"] == filters.vllm_plan_hosts({"b": settings}, ["b"])["hosts"]["b"]
    instances = filters.vllm_plan_instances(hostvars, ["a", "b"])
    assert instances["a"] == [{"name": "as-made", "port": 9100}]
    assert instances["b"] == read["hosts"]["b"]["instances"] and instances["b"][0]["name"] == "main"
    # a fact that holds another host's plan only, or no instances, is not this host's entry
    hostvars["b"]["vllm_plan"] = {"hosts": {"a": made}}
    assert filters.vllm_plan_read(hostvars, ["b"])["hosts"]["b"] == read["hosts"]["b"]


def test_the_answers_gates_settings_are_checked_in_the_plan_with_the_host_and_the_fix():
    """A site prompt named like one of the product's, and limits that are no numbers, stop the plan (the spec checks
    the types first: a prompt without its text is the argument spec's error)."""
    filters = load_filters()
    host = dict(LAB_HOST)
    assert filters.vllm_plan_hosts({"h1": host}, ["h1"])["hosts"]["h1"]["errors"] == []
    bad = dict(
        host,
        vllm_rollout_answers_site_prompts=[{"name": "capital", "prompt": "La capitale de la France est"}],
        vllm_rollout_answers_limits={"precision": {"max_kl": "small"}},
    )
    errors = filters.vllm_plan_hosts({"h1": bad}, ["h1"])["hosts"]["h1"]["errors"]
    assert any(
        e.startswith("h1: vllm_rollout_answers_site_prompts[0].name='capital' is also a prompt of") for e in errors
    )
    assert any(e.startswith("h1: vllm_rollout_answers_limits: limits.precision.max_kl='small'") for e in errors)
    no_text = dict(host, vllm_rollout_answers_site_prompts=[{"name": "mine"}])
    errors = filters.vllm_plan_hosts({"h1": no_text}, ["h1"])["hosts"]["h1"]["errors"]
    assert any("vllm_rollout_answers_site_prompts" in e and "vllm_rollout role's argument spec" in e for e in errors), (
        errors
    )


def test_the_plan_reads_each_adapters_config_once_from_the_mirror_or_the_controller(tmp_path):
    """vllm_lora_sources: each adapter folder once, over hosts; vllm_lora_configs: the uri loop's answers and the
    controller's folders, a failed read kept as its error (the plan names it with the host and the fix)."""
    filters = load_filters().FilterModule().filters()
    adapters = [{"name": "a", "url": "http://m/a/"}, {"name": "b", "src": str(tmp_path / "b")}]
    hostvars = {
        h: {"vllm_profile_name": "cpu-lab-tiny", "vllm_lora_adapters": adapters[:n]} for h, n in (("x", 1), ("y", 2))
    }
    sources = filters["vllm_lora_sources"](hostvars, ["x", "y"])
    assert sources == [
        {"source": "controller", "location": str(tmp_path / "b")},
        {"source": "url", "location": "http://m/a"},
    ]
    read = [
        {"item": sources[1], "status": 200, "content": '{"r": 8}'},
        {"item": {"location": "http://m/z"}, "status": -1, "msg": "refused"},
    ]
    assert filters["vllm_lora_configs"](read, sources[:1]) == {
        "http://m/a": '{"r": 8}',
        "http://m/z": {"error": "refused"},
        str(tmp_path / "b"): {"error": f"{tmp_path / 'b' / 'adapter_config.json'}: No such file or directory"},
    }
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "adapter_config.json").write_text("{}")
    assert filters["vllm_lora_configs"]([], sources[:1]) == {str(tmp_path / "b"): "{}"}
