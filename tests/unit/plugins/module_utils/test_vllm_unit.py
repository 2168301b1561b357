"""plugins/module_utils/vllm_unit.py: the unit's verdict and the health wait (the vllm_wait_healthy module that
runs them on the hosts is tested in tests/unit/plugins/modules/test_vllm_wait_healthy.py)."""

from __future__ import annotations

import pytest

from conftest import ROOT, load_source

vllm_unit = load_source("vllm_unit", ROOT / "plugins" / "module_utils" / "vllm_unit.py")

SHOW = "LoadState=loaded\nActiveState={a}\nSubState={s}\nResult={r}\nNRestarts={n}\n"


# --- unit_verdict -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "active, sub, result, n, max_restarts, error",
    [
        ("active", "running", "success", 0, 0, ""),
        ("activating", "start", "success", 0, 0, ""),
        (
            "activating",
            "auto-restart",
            "exit-code",
            0,
            0,
            "unit u is crash-looping: 1 restarts (at most 0 allowed), last Result=exit-code",
        ),
        ("active", "running", "success", 2, 3, ""),
        (
            "active",
            "running",
            "success",
            2,
            1,
            "unit u is crash-looping: 2 restarts (at most 1 allowed), last Result=success",
        ),
        ("failed", "failed", "start-limit-hit", 3, 0, "unit u failed (Result=start-limit-hit, 3 restarts)"),
        ("inactive", "dead", "success", 0, 0, "unit u is not running (inactive/dead, Result=success)"),
    ],
)
def test_unit_verdict(active, sub, result, n, max_restarts, error):
    judged = vllm_unit.unit_verdict(SHOW.format(a=active, s=sub, r=result, n=n), "u", max_restarts)
    assert judged["error"] == error
    assert judged["ActiveState"] == active


def test_unit_verdict_not_installed():
    out = "LoadState=not-found\nActiveState=inactive\nSubState=dead\nResult=success\nNRestarts=0\n"
    assert vllm_unit.unit_verdict(out, "vllm@main.service")["error"] == "unit vllm@main.service is not installed"


def test_show_argv_reads_only_what_the_verdict_judges():
    assert vllm_unit.show_argv("vllm@gpu0.service") == [
        "systemctl",
        "show",
        "--property=LoadState,ActiveState,SubState,Result,NRestarts",
        "vllm@gpu0.service",
    ]


# --- wait_healthy, on a clock of its own --------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def _wait(answers, units=None, timeout=10, delay=1.0, unit="vllm@main.service", max_restarts=0):
    """wait_healthy with `answers` (status per probe, the last repeated) and `units` (systemctl show outputs)."""
    clock = Clock()
    probes, reads = list(answers), list(units or [SHOW.format(a="active", s="running", r="success", n=0)])

    def probe():
        status = probes.pop(0) if len(probes) > 1 else probes[0]
        return status, "Wed, 02 Dec 2026 10:00:00 GMT" if status == 200 else "", "" if status else "refused"

    def read_unit():
        return reads.pop(0) if len(reads) > 1 else reads[0]

    return vllm_unit.wait_healthy(
        probe, read_unit, "http://h:8000/health", timeout, delay, unit, max_restarts, clock=clock, sleep=clock.sleep
    )


def test_healthy_at_once_is_already_up():
    result = _wait([200])
    assert result["ok"] and result["state"] == "healthy" and result["already_up"]
    assert result["attempts"] == 1 and result["error"] is None
    assert result["healthy_date"] == "Wed, 02 Dec 2026 10:00:00 GMT" and result["restarts"] == 0


def test_a_start_that_becomes_healthy():
    result = _wait([None, 503, 503, 200])
    assert result["ok"] and not result["already_up"]
    assert result["attempts"] == 4 and result["waited_s"] == 3.0


def test_a_slow_start_times_out_with_the_last_answer():
    result = _wait([503], timeout=5, delay=2)
    assert not result["ok"] and result["state"] == "timeout"
    assert result["error"] == "/health did not answer 200 within 5 s (http://h:8000/health; last answer: HTTP 503)"
    assert result["waited_s"] == 5.0 and result["attempts"] == 4  # at 0, 2, 4 and 5 s: the last sleep is shortened


def test_a_crash_during_the_wait_ends_it_at_once():
    running = SHOW.format(a="activating", s="start", r="success", n=0)
    restarted = SHOW.format(a="activating", s="auto-restart", r="exit-code", n=0)
    result = _wait([None], units=[running, running, restarted], timeout=900)
    assert not result["ok"] and result["state"] == "crashed"
    assert (
        result["error"]
        == "unit vllm@main.service is crash-looping: 1 restarts (at most 0 allowed), last Result=exit-code"
    )
    assert result["attempts"] == 2 and result["waited_s"] == 2.0 and result["restarts"] == 1


def test_a_unit_already_crash_looping_is_never_probed():
    looping = SHOW.format(a="activating", s="auto-restart", r="exit-code", n=3)
    result = _wait([200], units=[looping], max_restarts=3)
    assert result["state"] == "crashed" and result["attempts"] == 0


def test_without_a_unit_only_health_counts():
    result = _wait([None], units=["LoadState=not-found\n"], unit=None, timeout=2)
    assert result["state"] == "timeout" and result["unit_state"] == {} and result["restarts"] is None
    assert result["error"].endswith("last answer: refused)")
