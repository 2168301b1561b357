"""benchmarks/prefix_affinity.py's rounds taken together: the pooled rows of docs/benchmarks.md rest on this."""

from conftest import ROOT, load_source


def load():
    # The script puts src/ and benchmarks/ on sys.path itself, as when it runs.
    return load_source("prefix_affinity", ROOT / "benchmarks" / "prefix_affinity.py")


def request(ttft, turn=0, outcome="ok"):
    return {"outcome": outcome, "error": None if outcome == "ok" else "refused", "ttft": ttft, "turn": turn, "start": 0}


def run(hit_rate, tokens, share, results, seconds=1.0):
    return {"hit_rate": hit_rate, "queried_tokens": tokens, "share": share, "results": results, "seconds": seconds}


def test_rounds_pool_hit_rate_by_tokens_and_ttft_over_every_request():
    bench = load()
    first = run(0.5, 1000, {"a/cpu0": 1.0, "a/cpu1": 0.0}, [request(0.010), request(0.030, turn=1)])
    second = run(0.9, 3000, {"a/cpu0": 0.0, "a/cpu1": 1.0}, [request(0.020), request(0.040, turn=1)])
    together = bench.pooled("gateway, prefix", [first, second], users=2)
    assert together["name"] == "gateway, prefix, 2 rounds"
    assert together["hit_rate"] == 0.8  # (0.5 x 1000 + 0.9 x 3000) / 4000, not the mean of the rounds (0.7)
    assert together["queried_tokens"] == 4000
    assert together["share"] == {"a/cpu0": 0.25, "a/cpu1": 0.75}
    assert together["requests"] == 4 and together["failed"] == 0
    # Over the four requests (10, 20, 30, 40 ms), interpolated: not the mean of the rounds' medians.
    assert together["ttft_ms"]["p50"] == 25.0 and together["ttft_ms"]["p99"] == 39.7
    assert together["ttft_ms_later_turns"]["p50"] == 35.0


def test_a_row_gives_the_ratio_to_one_instance_and_counts_failed_and_cut_requests():
    bench = load()
    result = bench.pooled(
        "gateway, leastconn", [run(0.45, 100, {"a/cpu0": 1.0}, [request(0.05), request(None, 1, "failed")])], 1
    )
    line = bench.row(result, reference=0.9)
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert cells[:6] == ["gateway, leastconn, 1 rounds", "2", "1", "0.45", "0.50", "a/cpu0 1.0"]
