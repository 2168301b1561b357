# -*- coding: utf-8 -*-
# Part of the vllm-fleet Ansible package. Standard library only: it runs on the managed host (in the
# vllm_wait_healthy module) and on the controller (the vllm_verify_unit_verdict filter).
"""A vLLM instance's systemd unit and its /health, judged one way wherever they are read.

- :func:`unit_verdict` judges ``systemctl show`` of the unit: running, or why waiting longer is pointless
  (not installed, failed, stopped, or a crash loop).
- :func:`wait_healthy` probes ``/health`` until it answers 200, the unit's verdict says it never will, or the
  time is up, and says which: ``healthy``, ``crashed`` (a release that dies, seen from its unit) or
  ``timeout`` (still starting: a slow start, not a crash).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

UNIT_PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "NRestarts")


def show_argv(unit):
    """The command whose output :func:`unit_verdict` judges."""
    return ["systemctl", "show", "--property=" + ",".join(UNIT_PROPERTIES), unit]


def unit_verdict(show_output, unit, max_restarts=0):
    """Judge ``systemctl show --property=LoadState,ActiveState,SubState,Result,NRestarts UNIT``.

    Returns the properties, ``restarts`` (``NRestarts``, plus one while the unit waits in ``auto-restart``: it
    has crashed once more than the counter says yet), ``unit`` and ``error``: ``""`` while the unit may still
    become healthy, else why waiting longer is pointless (not installed, failed, stopped, or more than
    ``max_restarts`` restarts: a crash loop). systemd sets ``NRestarts`` back to 0 when the unit is stopped and
    started (and the vllm role zeroes it before a restart), so after a rollout's restart every crash counts.
    """
    props = {}  # type: dict[str, str | int]
    for line in str(show_output or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            props[key.strip()] = value.strip()
    try:
        restarts = int(props.get("NRestarts") or 0)
    except ValueError:
        restarts = 0
    if props.get("SubState") == "auto-restart":
        restarts += 1
    props["restarts"] = restarts
    props["unit"] = unit
    active, sub, result = props.get("ActiveState", ""), props.get("SubState", "?"), props.get("Result", "?")
    if props.get("LoadState") == "not-found":
        error = "unit %s is not installed" % unit
    elif active == "failed":
        error = "unit %s failed (Result=%s, %d restarts)" % (unit, result, restarts)
    elif active in ("inactive", "deactivating"):
        error = "unit %s is not running (%s/%s, Result=%s)" % (unit, active, sub, result)
    elif restarts > int(max_restarts):
        error = "unit %s is crash-looping: %d restarts (at most %d allowed), last Result=%s" % (
            unit,
            restarts,
            int(max_restarts),
            result,
        )
    else:
        error = ""
    props["error"] = error
    return props


def wait_healthy(
    probe, read_unit, url, timeout, delay=1.0, unit=None, max_restarts=0, clock=time.monotonic, sleep=time.sleep
):
    """Wait until ``probe()`` answers 200.

    ``probe()`` returns ``(status or None, the Date header, a short text of what came back)``; ``read_unit()``
    the output of :func:`show_argv` (only called when ``unit`` is given). Before each probe the unit is judged,
    so a crash loop or a stopped unit ends the wait at once instead of at the timeout.

    Returns ``ok``, ``state`` (``healthy``, ``crashed`` or ``timeout``), ``error`` (None when healthy),
    ``waited_s``, ``attempts`` (probes sent), ``already_up`` (the first probe answered 200), ``healthy_date``
    (the Date header of the 200: the host's clock, for the service's own start-up time), ``last`` (the last
    answer that was not 200), ``restarts`` and ``unit_state`` (:func:`unit_verdict`, or {} without a unit).
    """
    start = clock()
    attempts = 0
    last = ""
    state = {}
    while True:
        if unit:
            state = unit_verdict(read_unit(), unit, max_restarts)
            if state["error"]:
                return _result(False, "crashed", state["error"], clock() - start, attempts, last, state)
        status, date, text = probe()
        attempts += 1
        waited = clock() - start
        if status == 200:
            result = _result(True, "healthy", None, waited, attempts, last, state)
            result.update(already_up=attempts == 1, healthy_date=date or "")
            return result
        last = text or ("HTTP %s" % status if status is not None else "no answer")
        if waited >= timeout:
            error = "/health did not answer 200 within %s s (%s; last answer: %s)" % (_seconds(timeout), url, last)
            return _result(False, "timeout", error, waited, attempts, last, state)
        sleep(max(0.0, min(float(delay), float(timeout) - waited)))


def _seconds(value):
    return int(value) if float(value).is_integer() else value


def _result(ok, state, error, waited, attempts, last, unit_state):
    return {
        "ok": ok,
        "state": state,
        "error": error,
        "waited_s": round(waited, 1),
        "attempts": attempts,
        "already_up": False,
        "healthy_date": "",
        "last": last,
        "restarts": unit_state.get("restarts") if unit_state else None,
        "unit_state": unit_state,
    }
