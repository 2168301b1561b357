"""gpu/host/site.sh: what its site.yml runs set passes the plan and changes what each step says (site2 a
first-class setting that restarts the service, site3 a fault the plan accepts), and gpu/host/evidence.py,
which each step's verdict rests on, read against the real outputs of run C on the H200 host
(results/gpu-host-site/2026-12-01/run-c) and against outputs that must not count."""

import json
import os
import shutil
import subprocess

import pytest
import yaml

from conftest import ROOT, load_source, run_ansible

SITE = ROOT / "gpu" / "host" / "site.sh"
RUN_C = ROOT / "results" / "gpu-host-site" / "2026-12-01" / "run-c"
RELEASE_2 = "20261201T163443Z-d55755f1"

evidence = load_source("gpu_host_evidence", ROOT / "gpu" / "host" / "evidence.py")


def site_settings():
    """SET1, SET2, SET3 and BAD_TOKENIZER as site.sh sets them (its settings block, evaluated by bash)."""
    block = subprocess.run(
        ["sed", "-n", "/^SET1=/,/^STEPS=/p", str(SITE)], capture_output=True, text=True, check=True
    ).stdout
    block = "\n".join(line for line in block.splitlines() if not line.startswith(("#", "STEPS=")))
    out = subprocess.run(
        ["bash", "-c", block + '\nprintf "%s\\0" "$SET1" "$SET2" "$SET3" "$BAD_TOKENIZER"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    return json.loads(out[0]), json.loads(out[1]), json.loads(out[2]), out[3]


def plan(settings):
    """The gpu-host's plan with site.sh's -e settings over the inventory, as the plan play makes it."""
    plugin = load_source("vllm_plan_filter_for_site", ROOT / "plugins" / "filter" / "vllm_plan.py")
    hostvars = yaml.safe_load((ROOT / "gpu" / "inventory" / "group_vars" / "lent_gpu_nodes.yml").read_text())
    hostvars.update(settings)
    return plugin.vllm_plan_host(hostvars, "gpu-host")


def option(args, flag):
    return args[args.index(flag) + 1] if flag in args else None


def test_site_settings_pass_the_plan_and_change_what_each_step_says():
    set1, set2, set3, bad = site_settings()
    plans = [plan(s) for s in (set1, set2, set3)]
    for entry in plans:
        assert entry["errors"] == []
    args1, args2, args3 = (entry["instances"][0]["args"] for entry in plans)
    # Release 1 has no drain backstop (what `restart` measures); release 2 has it, and a profile change.
    assert option(args1, "--shutdown-timeout") is None
    assert (option(args2, "--shutdown-timeout"), option(args2, "--max-num-seqs")) == ("20", "32")
    assert option(args1, "--max-num-seqs") != "32"
    # site3 is release 2 with the one fault: a tokenizer folder the host lacks.
    assert option(args3, "--tokenizer") == bad != option(args2, "--tokenizer")
    assert [a for a in args3 if a != bad] == [a for a in args2 if a != option(args2, "--tokenizer")]


def test_no_site_run_passes_a_managed_setting_through_vllm_extra_args():
    for settings in site_settings()[:3]:
        assert "shutdown_timeout" not in settings.get("vllm_extra_args", {})
        assert "CUDA_VISIBLE_DEVICES" not in settings.get("vllm_environment", {})


def test_the_faults_site3_does_not_use_are_refused_by_the_plan():
    assert plan({"vllm_environment": {"CUDA_VISIBLE_DEVICES": "7"}})["errors"]
    assert plan({"vllm_profile": {"gpu_memory_utilization": 0.05}})["errors"]


def test_the_site3_fault_folder_is_not_the_inventory_tokenizer():
    inventory = yaml.safe_load((ROOT / "gpu" / "inventory" / "group_vars" / "lent_gpu_nodes.yml").read_text())
    assert site_settings()[3] != inventory["vllm_extra_args"]["tokenizer"]


def test_reports_are_packed_from_where_the_run_writes_them():
    text = SITE.read_text()
    assert "REPORTS=$WORK/reports" in text
    assert '-e "vllm_report_dir=$REPORTS"' in text
    assert 'cp -r "$REPORTS" "$d/reports"' in text
    assert "$ROOT/reports" not in text


@pytest.mark.parametrize("script", ["site.sh", "namespace.sh"])
def test_scripts_parse(script):
    subprocess.run(["bash", "-n", str(ROOT / "gpu" / "host" / script)], check=True)


def test_report_of_run_c_rollback_counts_for_site3():
    good, said = evidence.check_report(
        RUN_C / "state" / "reports" / "site-3",
        "gpu-host",
        ok=True,
        rolled_back_to=RELEASE_2,
        reason_contains="crashed during start",
    )
    assert good, said
    assert "rolled back to vllm-0.26.0 (20261201T163443Z-d55755f1)" in said


def test_report_rollback_to_another_release_or_for_another_reason_does_not_count():
    folder = RUN_C / "state" / "reports" / "site-3"
    assert not evidence.check_report(folder, "gpu-host", ok=True, rolled_back_to="20261201T163004Z-067aa0db")[0]
    assert not evidence.check_report(
        folder, "gpu-host", ok=True, rolled_back_to=RELEASE_2, reason_contains="verification"
    )[0]
    assert not evidence.check_report(folder, "gpu-host", ok=True, no_rollback=True)[0]


def test_report_wrong_expectation_counts_only_for_the_kv_cache_dtype():
    folder = RUN_C / "state" / "reports" / "verify-wrong"
    assert evidence.check_report(folder, "gpu-host", ok=False, error_contains="kv_cache_dtype")[0]
    assert not evidence.check_report(folder, "gpu-host", ok=False, error_contains="max_num_seqs")[0]
    assert not evidence.check_report(
        RUN_C / "state" / "reports" / "site-2", "gpu-host", ok=False, error_contains="kv_cache_dtype"
    )[0]


def test_report_keyed_by_instance_and_an_unverified_one(tmp_path):
    report = json.loads((RUN_C / "state" / "reports" / "site-2" / "report.json").read_text())
    entry = dict(report["hosts"].pop("gpu-host"), instance="main")
    report["hosts"]["gpu-host/main"] = entry
    (tmp_path / "site-2").mkdir()
    (tmp_path / "site-2" / "report.json").write_text(json.dumps(report))
    assert evidence.check_report(tmp_path / "site-2", "gpu-host", ok=True, no_rollback=True)[0]
    assert not evidence.check_report(tmp_path / "site-2", "gpu-host", instance="gpu1", ok=True)[0]
    del entry["ok"]
    (tmp_path / "site-2" / "report.json").write_text(json.dumps(report))
    good, said = evidence.check_report(tmp_path / "site-2", "gpu-host", ok=False)
    assert not good and "not verified" in said
    with pytest.raises(evidence.Unreadable):
        evidence.check_report(tmp_path / "none", "gpu-host")


def test_restored_reads_the_rollouts_stop_message():
    assert evidence.check_restored(RUN_C / "site3.log", RELEASE_2)[0]
    assert not evidence.check_restored(RUN_C / "site3.log", "20261201T163004Z-067aa0db")[0]
    assert not evidence.check_restored(RUN_C / "site2.log", RELEASE_2)[0]


def test_streams_in_flight_at_the_restart_and_finished():
    cut = json.loads((RUN_C / "streams-no-backstop.json").read_text())
    at = min(s["t_start"] for s in cut["streams"]) + 4
    good, said = evidence.check_streams(RUN_C / "streams-no-backstop.json", 4, at=at)
    assert good and "4 of 4 streams in flight at the restart, 0 finished" in said, said
    assert not evidence.check_streams(RUN_C / "streams-no-backstop.json", 4, at=at, all_finished=True)[0]
    drained = json.loads((RUN_C / "streams-backstop-20s.json").read_text())
    at = min(s["t_start"] for s in drained["streams"]) + 4
    assert evidence.check_streams(RUN_C / "streams-backstop-20s.json", 4, at=at, all_finished=True)[0]
    # A restart issued after the streams ended had none in flight.
    late = max(s["t_end"] for s in drained["streams"]) + 1
    assert not evidence.check_streams(RUN_C / "streams-backstop-20s.json", 4, at=late, all_finished=True)[0]
    assert not evidence.check_streams(RUN_C / "streams-backstop-20s.json", 2)[0]


def test_streams_that_got_no_token_do_not_count(tmp_path):
    record = {
        "wanted_tokens": 16,
        "finished": 0,
        "streams": [{"tokens": 0, "finish_reason": None, "error": "URLError: refused", "t_start": 1.0, "t_end": 1.1}],
    }
    (tmp_path / "s.json").write_text(json.dumps(record))
    good, said = evidence.check_streams(tmp_path / "s.json", 1, all_finished=True)
    assert not good and "URLError: refused" in said


def test_args_with_and_without(tmp_path):
    args = tmp_path / "main.args.json"
    args.write_text(json.dumps(["/m", "--max-num-seqs", "32", "--shutdown-timeout=20", "--port", "8000"]))
    assert evidence.check_args(args, [("max-num-seqs", "32"), ("shutdown-timeout", "20")], ["tokenizer"])[0]
    assert not evidence.check_args(args, [("shutdown-timeout", "30")], [])[0]
    assert not evidence.check_args(args, [], ["shutdown-timeout"])[0]


def test_command_line_exit_codes(tmp_path):
    cli = [str(ROOT / "gpu" / "host" / "evidence.py")]
    ok = subprocess.run([*cli, "restored", str(RUN_C / "site3.log"), RELEASE_2], capture_output=True, text=True)
    assert ok.returncode == 0 and "restored vllm-0.26.0" in ok.stdout
    missing = subprocess.run([*cli, "report", str(tmp_path), "gpu-host", "--ok"], capture_output=True, text=True)
    assert missing.returncode == 2
    shutil.copytree(RUN_C / "state" / "reports" / "site-2", tmp_path / "site-2")
    failed = subprocess.run(
        [*cli, "report", str(tmp_path / "site-2"), "gpu-host", "--failed"], capture_output=True, text=True
    )
    assert failed.returncode == 1 and "NOT AS NEEDED" in failed.stdout


@pytest.mark.parametrize("card", ["H100", "H200"])
def test_the_gpu_inventory_plans_on_either_lent_card_with_egress_on(tmp_path, card):
    """`playbooks/plan.yml` on gpu/inventory as site.sh's site1 runs it, with egress on as a site has it, the card
    being what the driver role's detection finds (the catalogue's H100 or H200). At 13bb0d4 this stopped at plan time
    on any card: the egress check refused the wheelhouse in a local folder (`has no host and port egress could
    admit`), and the group took an H200 only."""
    catalog = yaml.safe_load((ROOT / "roles" / "nvidia_driver" / "defaults" / "main.yml").read_text())
    entry = catalog["nvidia_driver_gpu_catalog"][card]
    inventory = yaml.safe_load((ROOT / "gpu" / "inventory" / "group_vars" / "lent_gpu_nodes.yml").read_text())
    assert card in inventory["nvidia_driver_group_gpus"]["lent_gpu_nodes"]
    gpu = {"name": entry["names"][0], "memory_mib": entry["memory_mib"], "bandwidth_gb_s": entry["bandwidth_gb_s"]}
    settings = site_settings()[0] | {"vllm_gpu": gpu | {"count": 1, "compute_cap": "9.0"}}
    settings["vllm_report_dir"] = str(tmp_path)
    settings["vllm_egress"] = True  # the check a site runs (the lent host itself has no nftables to apply it with)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    done = run_ansible(
        "ansible-playbook",
        "-i",
        "gpu/inventory",
        "playbooks/plan.yml",
        "-e",
        json.dumps(settings),
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "failed=0" in done.stdout
    planned = json.loads((tmp_path / "plan.json").read_text())
    host = planned["hosts"]["gpu-host"] if "hosts" in planned else planned["gpu-host"]
    assert entry["names"][0] in json.dumps(host)


def test_kv_measures_the_engine_against_both_predictions_of_the_latest_report(tmp_path):
    """evidence.py kv, as site.sh's kv_line runs it after each start: the engine's KV from a real vLLM 0.26.0 CUDA
    scrape (tests/unit/fixtures/vllm/0.26.0-cuda-h200, 219,712 tokens) served on loopback, the start's kind from its
    journal, the predictions from a report.json keyed as the vllm_verify role keys it, host/instance (numbers made up;
    run D on 2026-12-06 found the first version of this reader looking the host up alone)."""
    import http.server
    import threading

    page = (
        ROOT / "tests" / "unit" / "fixtures" / "vllm" / "0.26.0-cuda-h200" / "metrics_fp8_kv_after_bench.txt"
    ).read_bytes()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        report = tmp_path / "report.json"
        report.write_text(
            json.dumps(
                {
                    "hosts": {
                        "gpu-host/main": {"kv_cache": {"predicted_tokens": 210000, "predicted_tokens_warm": 230000}}
                    }
                }
            )
        )
        journal = tmp_path / "journal.txt"
        journal.write_text("INFO ... Directly load the compiled graph(s) for compile range (1, 2048) from the cache\n")
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        assert evidence.main(["kv", url, str(journal), str(report), "gpu-host"]) == 0
        said = evidence.measure_kv(url, journal, report, "gpu-host")
        assert said == (
            "engine 219,712 tokens, compile cache warm; planner (first start) 210,000 (-4.42 %); "
            "planner (warm restart) 230,000 (+4.68 %)"
        )
        journal.write_text("INFO ... Compiling a graph for compile range (1, 2048)\n")
        assert "compile cache cold" in evidence.measure_kv(url, journal, report, "gpu-host")
        assert evidence.main(["kv", url, str(journal), str(tmp_path / "none.json"), "gpu-host"]) == 2
    finally:
        server.shutdown()
