"""gpu/bench/answers_drift.py (issue 52) on CPU: the plan (three servers of the 4090's 7B fp8 profile that differ only
in the KV cache), the respelt golden set, the side-by-side memory check, the table and summary of answers.compare, and a
whole run against a stand-in `vllm` whose servers answer with logprobs (the harness's stand-in site, another
`serve`): staggered starts, the measures, the files in $OUT, every server stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_modules import GPU, ROOT, harness, load
from test_gpu_harness import fake_site  # noqa: F401  (the harness's stand-in site and nvidia-smi, a fixture)

drift = load("answers_drift")
answers = drift.answers

H100_SMI = "NVIDIA H100 80GB HBM3, 81559 MiB, 0 MiB, 580.159.04, 1980 MHz, 2619 MHz"
H200_SMI = "NVIDIA H200, 143771 MiB, 0 MiB, 580.159.04, 1980 MHz, 3201 MHz"


@pytest.fixture(scope="module")
def plan() -> dict:
    return drift.build_plan()


def test_committed_plan_is_current(plan):
    """gpu/bench/answers-drift.json is what `answers_drift.py plan` writes today (rerun it after a change to the
    profile, the renderer, plan.py or the golden set)."""
    assert json.loads((GPU / "answers-drift.json").read_text()) == json.loads(json.dumps(plan))


def test_the_three_servers_differ_only_in_the_kv_cache(plan):
    """rtx4090-7b-decode without its draft, at the 4090's budget on each host card: A a bf16 cache, B fp8, C fp8 with
    --calculate-kv-scales (the profile as shipped); change_kind calls A against itself a numerics change and B and C
    precision changes, for the KV cache alone."""
    assert [p["host_gpu"]["name"] for p in plan["hosts"]] == ["H100", "H200"]
    for host in plan["hosts"]:
        a, b, c = (e["args"] for e in host["experiments"])
        for args in (a, b, c):
            assert "--speculative-config" not in args and "--load-format" not in args  # no draft; dummy by harness
            assert args[args.index("--gpu-memory-utilization") + 1] == a[a.index("--gpu-memory-utilization") + 1]
        assert a[a.index("--kv-cache-dtype") + 1] == "auto" and "--calculate-kv-scales" not in a
        assert b[b.index("--kv-cache-dtype") + 1] == "fp8" and "--calculate-kv-scales" not in b
        assert c[c.index("--kv-cache-dtype") + 1] == "fp8" and "--calculate-kv-scales" in c
        assert [answers.change_kind({"args": a}, {"args": x})["kind"] for x in (a, b, c)] == [
            "numerics",
            "precision",
            "precision",
        ]
        util = host["experiments"][0]["emulated_utilization"]
        assert abs(util * host["host_gpu"]["memory_mib"] - 24564 * 0.92) < 0.01  # the 4090's budget
        assert host["side_by_side_share"] == round(3 * util, 6) < 0.9
        assert host["harness_args"][:2] == ["--load-format", "dummy"] and list(host["models"]) == [
            "Qwen/Qwen2.5-7B-Instruct"
        ]
        assert all(e["planner"]["errors"] == [] for e in host["experiments"])
    assert plan["profile"] == "rtx4090-7b-decode" and "not task accuracy" in plan["caveat"]


def test_the_golden_set_is_the_rollout_roles_respelt_for_the_dummy_tokenizer(plan):
    golden = plan["golden"]
    assert golden["source"] == "roles/vllm_rollout/defaults/main.yml" and (golden["tokens"], golden["top_k"]) == (16, 5)
    assert [p["name"] for p in golden["prompts"]] == [p["name"] for p in drift.golden_set()["prompts"]]
    assert len(golden["prompts"]) == 8
    for p in golden["prompts"]:
        assert len(p["sent"].split()) == len(p["prompt"].split())
    sent = [p["sent"] for p in golden["prompts"]]
    assert len(set(sent)) == len(sent)  # as words of the dummy tokenizer's, every prompt stays its own


def test_respell_maps_each_word_to_one_ordinary_token():
    text = drift.respell("the cat saw the dog", 1000)
    words = text.split()
    assert words[0] == words[3] and len(set(words)) == 4
    ids = [int(w[1:]) for w in words]
    assert all(4 <= i < 1000 for i in ids) and drift.respell("the cat saw the dog", 1000) == text
    with pytest.raises(ValueError):
        drift.respell("x", 4)
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_str(json.dumps(harness.tokenizer_files(1000)["tokenizer.json"]))
    assert tok.encode(text).ids == ids  # the harness's tokenizer reads it back as those ids


def test_the_plan_of_this_card_or_why_none(plan):
    assert drift.host_plan(plan, H100_SMI)[0]["host_gpu"]["name"] == "H100"
    assert drift.host_plan(plan, H200_SMI)[0]["host_gpu"]["name"] == "H200"
    none, why = drift.host_plan(plan, "NVIDIA L40S, 46068 MiB, 0 MiB, 580.159.04, 2520 MHz, 9001 MHz")
    assert none is None and "planned: H100 (81559 MiB), H200 (143771 MiB)" in why and "--host-gpu 'NVIDIA L40S" in why
    assert drift.smi_card(H100_SMI) == ("NVIDIA H100 80GB HBM3", 81559) and drift.smi_card("") is None


def test_the_servers_must_fit_side_by_side_in_what_is_free(plan):
    h100 = plan["hosts"][0]
    # 3 x ceil(0.27708628 x 81559) + 3 x 768 = 70,101 MiB
    assert drift.budget_refusal(h100, 81559, 0) is None and drift.budget_refusal(h100, 81559, 11458) is None
    why = drift.budget_refusal(h100, 81559, 11459)
    assert why.startswith("the 3 servers side by side need 70,101 MiB (22,599 + 22,599 + 22,599 MiB of budget")
    assert "70,100 of 81,559 MiB free (11,459 MiB in use); nothing started" in why


def test_the_next_server_starts_once_the_one_before_is_past_its_memory_profile():
    assert not drift.past_profiling("INFO [gpu_worker.py:560] Available KV cache memory: 6.38 GiB\n")
    assert drift.past_profiling("Capturing CUDA graphs (PIECEWISE):   0%|          | 0/51")
    assert drift.past_profiling("INFO [core.py:340] init engine (profile, create kv cache, warmup model) took 9.1 s")


def record_and_scores(shift: float) -> tuple[dict, list[dict]]:
    """A two-prompt record and an instance's scores of it whose logprobs are the record's, the second token of the
    second prompt moved by `shift` (a large shift makes another token its top-1)."""
    record = {"tokens": 2, "top_k": 3, "answers": []}
    scores = []
    for name in ("a", "b"):
        top = [[[5, -1.0], [6, -2.0], [7, -3.0]], [[8, -0.5], [9, -1.5], [10, -4.0]]]
        record["answers"].append(
            {"name": name, "prompt": name, "prompt_ids": [1], "ids": [5, 8], "top": top, "text": ""}
        )
        now = json.loads(json.dumps(top))
        if name == "b":
            now[1] = sorted([[8, -0.5 - shift], [9, -1.5], [10, -4.0]], key=lambda p: -p[1])
        positions = [
            {"rank": 1 + [t for t, _ in at].index(i), "logprob": dict(map(tuple, at))[i], "top": at}
            for i, at in zip([5, 8], now, strict=True)
        ]
        scores.append({"name": name, "positions": positions, "ids": [5, 8] if name == "a" or shift <= 1 else [5, 9]})
    return record, scores


def test_drift_rows_are_compare_and_judge_with_the_default_limits():
    record, same = record_and_scores(0.0)
    args = ["{model:m}", "--kv-cache-dtype", "auto"]
    row = drift.drift(record, {"scores": same}, args, args, "0.26.0", 1.234)
    assert (row["agreement"], row["mean_kl"], row["max_kl"], row["verdict"], row["kind"]) == (
        1.0,
        0.0,
        0.0,
        "go",
        "numerics",
    )
    assert row["same_prefix"] == {"a": 2, "b": 2} and row["measure_s"] == 1.23
    _, moved = record_and_scores(1.5)  # b's second token: 9 is now the top-1
    fp8 = ["{model:m}", "--kv-cache-dtype", "fp8", "--calculate-kv-scales"]
    row = drift.drift(record, {"scores": moved}, args, fp8, "0.26.0", 2.0)
    assert row["agreement"] == 0.75 and row["kind"] == "precision" and row["max_kl"] > row["mean_kl"] > 0
    assert row["kind_reasons"] == ["--calculate-kv-scales changed", "--kv-cache-dtype changed"]
    assert row["verdict"] == "no-go" and row["diverged"] == ["b"] and row["same_prefix"] == {"a": 2, "b": 1}
    assert row["first_disagreement"] == {"a": None, "b": 1}


def test_same_scores_tells_whether_the_scales_changed_anything():
    _, same = record_and_scores(0.0)
    _, moved = record_and_scores(0.1)
    assert drift.same_scores({"scores": same}, {"scores": json.loads(json.dumps(same))})
    assert not drift.same_scores({"scores": same}, {"scores": moved})


def test_flatness_of_a_record():
    record, _ = record_and_scores(0.0)
    flat = drift.flatness(record)
    assert flat == {
        "positions": 4,
        "top1_logprob_median": -0.75,
        "topk_gap_median": 2.75,
        "topk_gap_max": 3.5,
        "top1_tied_share": 0.0,
    }
    record["answers"][0]["top"][0] = [[5, -11.9313], [6, -11.9313], [7, -11.93131]]
    assert drift.flatness(record)["top1_tied_share"] == 0.25


def test_the_table_says_what_it_measures_and_one_row_per_server(plan):
    record, same = record_and_scores(0.0)
    args = ["{model:m}"]
    rows = [
        {
            "measure": "A-self",
            "kv": "auto (bf16)",
            "drift": drift.drift(record, {"scores": same}, args, args, "r", 1.0),
        },
        {"measure": "B", "kv": "fp8, scales 1.0", "error": "B did not start"},
    ]
    summary = drift.summary_doc(plan, rows, drift.flatness(record), host_gpu="H100", vllm_installed="0.26.0")
    summary["prompts"] = [{"name": "a"}, {"name": "b"}]
    text = drift.table(summary)
    assert "NUMERICAL DRIFT ON RANDOM WEIGHTS, NOT TASK ACCURACY" in text and "(H100), vLLM 0.26.0" in text
    assert "same prefix of 16 tokens (a, b)" in text
    (a_row,) = [line for line in text.splitlines() if line.startswith("A-self")]
    assert a_row.split()[3:9] == ["1.0000", "0.000000", "0.000000", "go", "(numerics)", "1.0"]
    assert a_row.endswith("  2 2")
    assert any(line.startswith("B ") and line.endswith("B did not start") for line in text.splitlines())


def test_log_tail_urls_and_capped_files(tmp_path):
    text = "a\nCapturing CUDA graphs:   0%|\rCapturing CUDA graphs: 100%|\n" + "".join(
        f"line {i}\n" for i in range(300)
    )
    tail = drift.log_tail(text, 3)
    assert tail == ["line 297", "line 298", "line 299"]
    assert drift.log_tail(text)[0] == "line 100" and drift.log_tail("x\ry\n") == ["y"]
    assert drift.local_url("http://127.0.0.1:18100/") == "http://127.0.0.1:18100"
    for bad in ("http://10.0.0.2:8000", "https://127.0.0.1:8000", "http://127.0.0.1.example.com:80"):
        with pytest.raises(ValueError):
            drift.local_url(bad)
    path = drift.write_capped(tmp_path / "a-b_c.txt", "x" * 5000, cap=1000)
    data = path.read_text()
    assert path.stat().st_size <= 1000 + 100 and data.startswith("[cut: the first 4,200 of 5,000 bytes left out]")
    with pytest.raises(ValueError):
        drift.write_capped(tmp_path / "a b.txt", "x")


# A stand-in `vllm serve` whose model is a hash: the logprobs of the next token after a context are fixed by the last
# three ids, and a server started with an fp8 cache moves them (without scales by much, with scales a little), so B
# and C drift from A and A from itself not at all. The prompt's words are the dummy tokenizer's t<N>.
FAKE_SERVE = r"""
import hashlib, http.server, json, math, os, re, sys
args = sys.argv[1:]
assert args[0] == "serve"
port = int(args[args.index("--port") + 1])
served = args[args.index("--served-model-name") + 1]
fp8 = args[args.index("--kv-cache-dtype") + 1] == "fp8"
noise = (0.05 if "--calculate-kv-scales" in args else 0.9) if fp8 else 0.0
if os.environ.get("FAKE_REFUSE") and args[args.index("--kv-cache-dtype") + 1] == os.environ["FAKE_REFUSE"]:
    print("ValueError: the stand-in refuses this KV cache", flush=True)
    sys.exit(1)
if os.environ.get("FAKE_HANG") and args[args.index("--kv-cache-dtype") + 1] == os.environ["FAKE_HANG"]:
    import signal, time  # a start that never ends; exits on TERM as vLLM does
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    time.sleep(600)
print("INFO GPU KV cache size: 1,000 tokens", flush=True)
print("Capturing CUDA graphs (PIECEWISE):   0%|    | 0/51\rCapturing CUDA graphs (PIECEWISE): 100%|", flush=True)
VOCAB = range(4, 44)

def h(*parts):
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "big") / 2**32

def logprobs(context):
    key = tuple(context[-3:])
    logits = {t: 4 * h(key, t) + noise * h("fp8", key, t) for t in VOCAB}
    top = max(logits.values())
    norm = top + math.log(sum(math.exp(v - top) for v in logits.values()))
    return {t: v - norm for t, v in logits.items()}

def ranked(lp):
    return sorted(lp, key=lambda t: (-lp[t], t))

class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, body, ctype="application/json"):
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/metrics":
            self._send('vllm:cache_config_info{cache_dtype="%s",kv_cache_size_tokens="1000"} 1.0\n'
                       % ("fp8" if fp8 else "auto"), "text/plain")
        elif self.path == "/version":
            self._send(json.dumps({"version": "0.26.0"}))
        else:
            self._send("{}")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        assert body["model"] == served and body["temperature"] == 0
        prompt = body["prompt"]
        ids = list(prompt) if isinstance(prompt, list) else [int(w[1:]) for w in prompt.split()]
        if body.get("prompt_logprobs"):
            plp = [None]
            for i in range(1, len(ids)):
                lp = logprobs(ids[:i])
                order = ranked(lp)
                lp.setdefault(ids[i], -30.0)  # a prompt word outside the stand-in's vocabulary
                order = ranked(lp)
                keep = set(order[: body["prompt_logprobs"]]) | {ids[i]}
                plp.append({str(t): {"logprob": lp[t], "rank": order.index(t) + 1, "decoded_token": "t%d" % t}
                            for t in keep})
            self._send(json.dumps({"choices": [{"text": "", "prompt_logprobs": plp}]}))
            return
        out, tops = [], []
        for _ in range(body["max_tokens"]):
            lp = logprobs(ids + out)
            order = ranked(lp)
            tops.append({"token_id:%d" % t: lp[t] for t in order[: body["logprobs"]]})
            out.append(order[0])
        choice = {"text": " ".join("t%d" % t for t in out), "token_ids": out, "prompt_token_ids": ids,
                  "logprobs": {"top_logprobs": tops}}
        self._send(json.dumps({"choices": [choice]}))

class Server(http.server.ThreadingHTTPServer):
    request_queue_size = 64  # the answers gate sends 16 at once (vLLM's uvicorn listens with a backlog of 2048)

Server(("127.0.0.1", port), H).serve_forever()
"""


def run_drift(
    site: Path, tmp_path: Path, plan: dict, budget_s: int = 300, **env_extra: str
) -> tuple[subprocess.CompletedProcess, Path]:
    (site / "gpu-site" / "vllm" / "vllm" / "entrypoints" / "cli" / "main.py").write_text(FAKE_SERVE)
    tmp_path.mkdir(parents=True, exist_ok=True)
    small = json.loads(json.dumps(plan))
    for host in small["hosts"]:
        host["tokenizer_vocab_size"] = 64  # a small tokenizer folder: the stand-in reads t<N> itself
        host["port"] = 19000 + (os.getpid() % 300) * 3
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(small))
    out = tmp_path / "out"
    jit = tmp_path / "jit"  # where the plan's JIT cache is unpacked, if .gpu/ holds it
    env = dict(os.environ, GPU_HARNESS_TMP=str(site), OUT=str(out), CUDA_CACHE_PATH=str(jit), **env_extra)
    proc = subprocess.run(
        [sys.executable, str(GPU / "answers_drift.py"), "run", "--plan", str(plan_file), "--budget-s", str(budget_s)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    return proc, out


def test_a_whole_run_against_a_stand_in(fake_site, tmp_path, plan):  # noqa: F811
    proc, out = run_drift(fake_site, tmp_path, plan)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "answers-drift-measures.json",
        "answers-drift-servers.log",
        "answers-drift-summary.json",
        "answers-drift-table.txt",
    ]
    summary = json.loads((out / "answers-drift-summary.json").read_text())
    run = summary["run"]
    assert run["status"] == "measured" and run["host_gpu"] == "H200" and summary["measures"].startswith("NUMERICAL")
    assert run["jit_cache"]["restored"] == (ROOT / ".gpu" / "h200-jit-cache.part-00").exists()
    assert [s["status"] for s in run["servers"]] == ["healthy"] * 3
    assert all(
        s["profiled_s"] is not None and s["cache_config"]["kv_cache_size_tokens"] == "1000" for s in run["servers"]
    )
    assert run["servers"][2]["argv"][-2:] == ["--port", str(19000 + (os.getpid() % 300) * 3 + 2)]
    assert "--load-format" in run["servers"][0]["argv"] and "{model:" not in " ".join(run["servers"][0]["argv"])
    rows = {r["measure"]: r["drift"] for r in summary["rows"]}
    assert list(rows) == ["A-self", "B", "C"]
    assert (rows["A-self"]["agreement"], rows["A-self"]["mean_kl"], rows["A-self"]["verdict"]) == (1.0, 0.0, "go")
    assert rows["A-self"]["kind"] == "numerics" and rows["B"]["kind"] == rows["C"]["kind"] == "precision"
    assert rows["B"]["mean_kl"] > rows["C"]["mean_kl"] > 0 and rows["B"]["agreement"] < 1.0
    assert summary["rows"][2]["same_scores_as_B"] is False
    assert rows["A-self"]["same_prefix"] == dict.fromkeys([p["name"] for p in plan["golden"]["prompts"]], 16)
    assert summary["flatness"]["positions"] == 8 * 16
    raw = json.loads((out / "answers-drift-measures.json").read_text())
    assert list(raw) == ["A-record", "A-self", "B", "C"] and raw["B"]["result"]["reference"] == "A-record"
    assert raw["A-record"]["result"]["answers"][0]["prompt"] == plan["golden"]["prompts"][0]["sent"]
    logs = (out / "answers-drift-servers.log").read_text()
    assert logs.count("===== server ") == 3 and "Capturing CUDA graphs (PIECEWISE): 100%|" in logs
    table = (out / "answers-drift-table.txt").read_text()
    assert table in proc.stdout and "NUMERICAL DRIFT ON RANDOM WEIGHTS, NOT TASK ACCURACY" in table
    for port in (19000 + (os.getpid() % 300) * 3 + i for i in range(3)):  # every server stopped
        assert harness.http_get(f"http://127.0.0.1:{port}/health", 2)[0] == -1


def test_a_run_stops_at_a_refused_reference_and_at_a_full_card(fake_site, tmp_path, plan):  # noqa: F811
    proc, out = run_drift(fake_site, tmp_path / "a", plan, FAKE_REFUSE="auto")
    assert proc.returncode == 1
    run = json.loads((out / "answers-drift-summary.json").read_text())["run"]
    assert run["status"] == "refused" and run["message"].startswith("A (the reference) did not start: ValueError")
    assert [s["variant"] for s in run["servers"]] == ["A"]  # B and C were never started
    smi = fake_site / "bin" / "nvidia-smi"
    smi.write_text(smi.read_text().replace("echo 0;;", "echo 100000;;"))
    proc, out = run_drift(fake_site, tmp_path / "b", plan)
    run = json.loads((out / "answers-drift-summary.json").read_text())["run"]
    assert proc.returncode == 1 and run["status"] == "refused" and run["servers"] == []
    assert "but the card has 43,771 of 143,771 MiB free (100,000 MiB in use); nothing started" in run["message"]


def test_a_start_that_does_not_end_is_bounded_and_stopped(fake_site, tmp_path, plan):  # noqa: F811
    """B never gets past its start: the wait ends at the budget less the measures' reserve (100 - 90 s), C is not
    started any more, A is measured against itself, and B's process is stopped."""
    proc, out = run_drift(fake_site, tmp_path, plan, budget_s=100, FAKE_HANG="fp8")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = json.loads((out / "answers-drift-summary.json").read_text())
    run = summary["run"]
    assert run["status"] == "incomplete" and run["not_started"] == ["drift-C"]
    assert [(s["variant"], s["status"]) for s in run["servers"]] == [("A", "healthy"), ("B", "start-timeout")]
    assert run["total_s"] < 60
    rows = {r["measure"]: r for r in summary["rows"]}
    assert rows["A-self"]["drift"]["verdict"] == "go" and rows["B"]["error"] == rows["C"]["error"].replace("C", "B")
    for server in run["servers"]:
        with pytest.raises(ProcessLookupError):
            os.kill(server["pid"], 0)


def test_a_term_stops_the_servers_and_leaves_the_files(fake_site, tmp_path, plan):  # noqa: F811
    """A TERM (the device command's time limit) while A starts: the files written as the run went say so, and A's
    process is stopped."""
    (fake_site / "gpu-site" / "vllm" / "vllm" / "entrypoints" / "cli" / "main.py").write_text(FAKE_SERVE)
    plan_file, out = tmp_path / "plan.json", tmp_path / "out"
    small = json.loads(json.dumps(plan))
    for host in small["hosts"]:
        host["tokenizer_vocab_size"] = 64
        host["port"] = 19900 + os.getpid() % 90
    plan_file.write_text(json.dumps(small))
    env = dict(os.environ, GPU_HARNESS_TMP=str(fake_site), CUDA_CACHE_PATH=str(tmp_path / "jit"), FAKE_HANG="auto")
    cmd = [sys.executable, str(GPU / "answers_drift.py"), "run", "--plan", str(plan_file), "--out", str(out)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    summary = out / "answers-drift-summary.json"
    for _ in range(300):
        if summary.exists() and json.loads(summary.read_text() or "{}").get("run", {}).get("status") == "starting":
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    run = json.loads(summary.read_text())["run"]
    assert proc.returncode == 1 and run["status"] == "error" and run["message"] == "SystemExit: 143", output
    (server,) = run["servers"]
    with pytest.raises(ProcessLookupError):
        os.kill(server["pid"], 0)


def test_run_sh_has_the_entry():
    text = (GPU / "run.sh").read_text()
    assert "answers-drift)" in text and 'gpu/bench/answers_drift.py run --out "$OUT"' in text
    assert subprocess.run(["bash", "-n", str(GPU / "run.sh")], check=False).returncode == 0
    assert (ROOT / "gpu" / "bench" / "README.md").read_text().count("answers-drift") >= 2
