"""vllm_fleet.bench, the load generator of playbooks/benchmark.yml, against a stand-in server.

The stand-in streams /v1/completions the way vLLM does (server-sent events, one text chunk per token,
a final usage chunk, [DONE]) and serves /metrics counters that move with the traffic, so the
latencies, the bounds and the server-side deltas are checked on real sockets.
"""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from conftest import LocalServer, fixture_text
from vllm_fleet import bench


class StandIn(LocalServer):
    def __init__(self, delay: float = 0.002, fail_every: int = 0, preempt: int = 0, empty_text: bool = False):
        self.delay, self.fail_every, self.preempt, self.empty_text = delay, fail_every, preempt, empty_text
        self.requests, self.tokens, self.bodies = 0, 0, []
        self.lock = threading.Lock()
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path != "/metrics":
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with me.lock:
                    text = (
                        "# TYPE vllm:num_preemptions_total counter\n"
                        f'vllm:num_preemptions_total{{engine="0",model_name="m"}} {me.preempt * me.requests}.0\n'
                        f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {me.tokens}.0\n'
                        'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} '
                        f"{me.requests}.0\n"
                        '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine="0"} 0.1\n'
                    ).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with me.lock:
                    me.requests += 1
                    me.bodies.append(body)
                    number = me.requests
                if me.fail_every and number % me.fail_every == 0:
                    data = b'{"error": "boom"}'
                    self.send_response(500)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for i in range(body["max_tokens"]):
                    time.sleep(me.delay)
                    text = "" if me.empty_text else f" t{i}"
                    self.wfile.write(
                        b"data: " + json.dumps({"choices": [{"index": 0, "text": text}]}).encode() + b"\n\n"
                    )
                    self.wfile.flush()
                usage = {
                    "choices": [],
                    "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": body["max_tokens"]},
                }
                # Counted before the answer ends, as vLLM counts a request's tokens before its last chunk: a client
                # that reads /metrics right after [DONE] sees them (after it, the count raced the client).
                with me.lock:
                    me.tokens += body["max_tokens"]
                self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
                self.close_connection = True

        super().__init__(Handler)


def test_percentile_is_numpy_linear():
    assert bench.percentile([], 50) is None
    assert bench.percentile([3.0], 99) == 3.0
    assert bench.percentile([1, 2, 3, 4], 50) == 2.5
    assert bench.percentile(range(101), 99) == 99


def test_gap_stats_show_the_stalled_share_where_p99_jumps():
    """With prefill-stalled gaps near 1 % of all, p99 ITL sits on a cliff: 10 stalls in 1,000 gaps give a p99
    of 11.9 ms, 11 give 200 ms. The stalled share and p99.9 say what p99 alone cannot."""
    ten = bench._gap_stats([0.010] * 990 + [0.200] * 10)
    eleven = bench._gap_stats([0.010] * 989 + [0.200] * 11)
    assert (ten["p99"], eleven["p99"]) == (11.9, 200.0)
    assert (ten["stalled_pct"], eleven["stalled_pct"]) == (1.0, 1.1)
    assert ten["p999"] == eleven["p999"] == ten["max"] == 200.0 and ten["p50"] == 10.0
    assert bench._gap_stats([])["stalled_pct"] is None


def test_counters_sum_series_and_ignore_others():
    text = (
        'vllm:num_preemptions_total{engine="0"} 2.0\nvllm:num_preemptions_total{engine="1"} 3.0\n'
        'vllm:num_preemptions_created{engine="0"} 1.7e9\nvllm:generation_tokens_total 10\n# HELP x\nbad line\n'
    )
    assert bench.counters(text) == {"vllm:num_preemptions": 5.0, "vllm:generation_tokens": 10.0}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"requests": 0}, "requests=0 must be 1-10000"),
        ({"requests": 10001}, "requests=10001"),
        ({"concurrency": 2000}, "concurrency=2000 must be 1-1024"),
        ({"duration_s": 0}, "duration_s=0"),
        ({"duration_s": 7200}, "at most 3600"),
        ({"max_tokens": 0}, "must be positive"),
        ({"single_requests": 101}, "single_requests=101"),
    ],
)
def test_bounds_are_refused(kwargs, message):
    args = {
        "requests": 8,
        "concurrency": 2,
        "duration_s": 10,
        "prompt_tokens": 4,
        "max_tokens": 4,
        "single_requests": 1,
    }
    args.update(kwargs)
    with pytest.raises(bench.BenchError, match=message):
        bench.check_bounds(**args)


def test_run_measures_both_phases_and_the_server_counters():
    with StandIn(delay=0.003, preempt=1) as server:
        result = bench.run(
            server.url,
            "m",
            requests=6,
            concurrency=3,
            duration_s=30,
            prompt_tokens=16,
            max_tokens=5,
            single_requests=2,
            decode_ceiling=100.0,
        )
        bodies = list(server.bodies)
    load, single = result["load"], result["single"]
    assert (load["completed"], load["failed"], load["output_tokens"]) == (6, 0, 30)
    assert single["completed"] == 2 and single["concurrency"] == 1
    assert load["ttft_ms"]["p99"] >= load["ttft_ms"]["p50"] > 0
    assert 2.0 < load["itl_ms"]["mean"] < 200
    # server side: the load's own window (single-stream requests are counted apart)
    assert result["server"]["generation_tokens"] == 30 and result["server"]["request_success"] == 6
    assert result["server"]["num_preemptions"] == 6 and result["server"]["preemptions_single"] == 2
    eff = result["efficiency"]
    assert eff["single_stream_tokens_per_s"] == pytest.approx(1000 / single["itl_ms"]["mean"], rel=1e-3)
    assert eff["single_stream_vs_ceiling_pct"] == pytest.approx(eff["single_stream_tokens_per_s"], rel=1e-2)
    assert all(b["ignore_eos"] and b["stream"] and len(b["prompt"]) == 16 for b in bodies)
    assert all(10 <= t < 1000 for b in bodies for t in b["prompt"])
    row = bench.markdown_row("h1", result)
    assert row.startswith("| h1 | 6/6 | 3 |") and row.count("|") == bench.MARKDOWN_HEADER.splitlines()[0].count("|")


def test_tokens_with_empty_text_count():
    """vLLM streams a chunk with text '' for a token that detokenizes to nothing yet (the lab's tiny model
    with random prompts does it for whole answers); it is still a token: timed, not a failure."""
    with StandIn(empty_text=True) as server:
        result = bench.run(
            server.url, "m", requests=4, concurrency=2, duration_s=30, prompt_tokens=8, max_tokens=5, single_requests=1
        )
    load = result["load"]
    assert (load["completed"], load["failed"], load["output_tokens"]) == (4, 0, 20), load
    assert load["ttft_ms"]["p50"] > 0 and load["itl_ms"]["p50"] > 0
    assert result["single"]["completed"] == 1


def test_failures_are_counted_and_named():
    with StandIn(fail_every=2) as server:
        result = bench.run(
            server.url, "m", requests=4, concurrency=1, duration_s=30, prompt_tokens=4, max_tokens=2, single_requests=0
        )
    assert result["single"] is None
    assert (result["load"]["completed"], result["load"]["failed"]) == (2, 2)
    assert result["load"]["errors"] == ['HTTP 500: {"error": "boom"}']


def test_duration_stops_new_requests():
    with StandIn(delay=0.05) as server:
        start = time.monotonic()
        result = bench.run(
            server.url,
            "m",
            requests=100,
            concurrency=1,
            duration_s=0.3,
            prompt_tokens=4,
            max_tokens=3,
            single_requests=0,
        )
    assert result["load"]["requests_sent"] < 100 and time.monotonic() - start < 10


def test_main_prints_json_and_refuses_a_bad_range(capsys):
    assert bench.main(["--url", "http://127.0.0.1:1", "--model", "m", "--token-id-range", "5"]) == 2
    assert "not LOW:HIGH" in json.loads(capsys.readouterr().out)["error"]
    assert bench.main(["--url", "ftp://x", "--model", "m"]) == 2
    assert "not an http(s) URL" in json.loads(capsys.readouterr().out)["error"]
    with StandIn() as server:
        assert (
            bench.main(
                [
                    "--url",
                    server.url,
                    "--model",
                    "m",
                    "--requests",
                    "2",
                    "--concurrency",
                    "2",
                    "--max-tokens",
                    "2",
                    "--single-requests",
                    "1",
                    "--host-name",
                    "gpu-1",
                ]
            )
            == 0
        )
    out = json.loads(capsys.readouterr().out)
    assert out["load"]["completed"] == 2 and out["markdown_row"].startswith("| gpu-1 |")


TARGET_4090 = {
    "card": "RTX 4090",
    "ttft_ms": 500,
    "prompt_tokens": 1024,
    "users": 64,
    "min_tokens_per_s": 35,
    "max_tokens_per_s": 55,
}


@pytest.mark.parametrize(
    "ttft_p50, itl_mean, meets",
    [
        (420.0, 20.0, (True, True)),  # 50 tok/s per user
        (420.0, 40.0, (True, False)),  # 25 tok/s per user
        (650.0, 20.0, (False, True)),
        (None, None, (False, False)),  # nothing completed
    ],
)
def test_the_guide_target_is_judged_on_the_median_ttft_and_the_per_user_decode_rate(ttft_p50, itl_mean, meets):
    load = {
        "concurrency": 64,
        "prompt_tokens": 1024,
        "ttft_ms": {"p50": ttft_p50, "p99": 900.0},
        "itl_ms": {"mean": itl_mean},
    }
    verdict = bench.guide_verdict(load, TARGET_4090)
    assert (verdict["meets_ttft"], verdict["meets_decode"]) == meets
    assert verdict["ttft_p50_ms"] == ttft_p50 and verdict["target_load"] == {"users": 64, "prompt_tokens": 1024}
    assert bench.guide_verdict(load, None) is None


def test_main_reports_the_guide_target_beside_the_numbers(capsys):
    with StandIn() as server:
        assert (
            bench.main(
                [
                    "--url",
                    server.url,
                    "--model",
                    "m",
                    "--requests",
                    "2",
                    "--concurrency",
                    "2",
                    "--max-tokens",
                    "2",
                    "--single-requests",
                    "0",
                    "--host-name",
                    "gpu-1",
                    "--guide-target",
                    json.dumps(TARGET_4090),
                ]
            )
            == 0
        )
    out = json.loads(capsys.readouterr().out)
    assert out["guide"]["card"] == "RTX 4090" and out["guide"]["load"] == {"users": 2, "prompt_tokens": 512}
    assert "RTX 4090: TTFT meets 500 ms" in out["markdown_row"] or "RTX 4090: TTFT misses 500 ms" in out["markdown_row"]
    assert out["markdown_row"].count("|") == bench.MARKDOWN_HEADER.splitlines()[0].count("|")
    with StandIn() as server:
        bench.main(
            [
                "--url",
                server.url,
                "--model",
                "m",
                "--requests",
                "1",
                "--single-requests",
                "0",
                "--guide-target",
                '{"card": "x"}',
            ]
        )
    assert "is not the plan's service_levels.target" in json.loads(capsys.readouterr().out)["guide"]["error"]


@pytest.mark.parametrize(
    "capture",
    [
        "0.26.0-cuda-h200/metrics_after_bench.txt",
        "0.26.0-cuda-h200/metrics_fp8_kv_after_bench.txt",
        "0.32.0-cpu/metrics_after_20_requests.txt",
        "0.32.0-cpu/metrics_idle.txt",
    ],
)
def test_the_host_side_reader_agrees_with_prometheus_clients_parser(capture):
    """bench reads /metrics with the standard library (it runs on hosts with nothing installed); on every real
    capture its counters and vllm:cache_config_info's labels are what vllm_fleet.metrics (prometheus_client's
    parser) reads."""
    from vllm_fleet import metrics

    text = fixture_text("vllm", *capture.split("/"))
    facts = metrics.parse(text)
    wanted = {name: facts.counters[name] for name in bench._COUNTERS if name in facts.counters}
    assert "vllm:generation_tokens" in wanted and bench.counters(text) == wanted
    labels = bench.info_labels(text, metrics.CACHE_CONFIG_INFO)
    assert labels and {k: metrics._typed(v) for k, v in labels.items()} == facts.cache_config
    assert bench.info_labels("# nothing\n", metrics.CACHE_CONFIG_INFO) == {}
