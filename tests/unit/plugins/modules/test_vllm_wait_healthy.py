"""plugins/modules/vllm_wait_healthy.py, run by Ansible on this machine against a real HTTP server on loopback, with
`systemctl` and `journalctl` stand-ins on PATH (no systemd runs here; Molecule's scenarios run the module against
real units)."""

from __future__ import annotations

import pytest

from conftest import StandInVllm, run_module

SHOW = "LoadState=loaded\nActiveState={a}\nSubState={s}\nResult={r}\nNRestarts={n}\n"


def _module(tmp_path, args, show):
    """The module run by Ansible, with `systemctl show` answering `show` and a `journalctl` of two lines."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "systemctl").write_text("#!/bin/sh\nprintf '%s'\n" % show.replace("\n", "\\n"))
    (bindir / "journalctl").write_text("#!/bin/sh\necho 'engine core: CUDA out of memory'\necho 'exiting'\n")
    for tool in ("systemctl", "journalctl"):
        (bindir / tool).chmod(0o755)
    return run_module(tmp_path, "vllm_wait_healthy", args, path=(str(bindir),))


@pytest.mark.integration
def test_module_waits_for_a_real_server(tmp_path):
    with StandInVllm(healthy_after=2.0) as server:
        result = _module(
            tmp_path,
            {"url": server.url, "unit": "vllm@main.service", "timeout": 30},
            SHOW.format(a="active", s="running", r="success", n=0),
        )
    assert result["ok"] is True and result["state"] == "healthy" and not result["failed"]
    assert 2.0 <= result["waited_s"] < 10 and result["attempts"] >= 2
    assert result["journal_tail"] == [] and result["changed"] is False


@pytest.mark.integration
def test_module_fails_a_crash_loop_with_the_journal(tmp_path):
    with StandInVllm() as server:
        result = _module(
            tmp_path,
            {"url": server.url, "unit": "vllm@main.service", "timeout": 30},
            SHOW.format(a="activating", s="auto-restart", r="exit-code", n=2),
        )
    assert result["failed"] is True and result["state"] == "crashed" and result["attempts"] == 0
    assert result["msg"] == (
        "vllm@main.service: unit vllm@main.service is crash-looping: 3 restarts "
        "(at most 0 allowed), last Result=exit-code"
    )
    assert result["journal_tail"] == ["engine core: CUDA out of memory", "exiting"]


@pytest.mark.integration
def test_module_reports_a_slow_start_without_failing_when_asked(tmp_path):
    with StandInVllm(healthy_after=3600) as server:
        result = _module(tmp_path, {"url": server.url, "timeout": 2, "fail_on_unhealthy": False}, "")
    assert not result["failed"] and result["ok"] is False and result["state"] == "timeout"
    assert result["error"].startswith(
        f"/health did not answer 200 within 2 s ({server.url}/health; last answer: HTTP 503"
    )
