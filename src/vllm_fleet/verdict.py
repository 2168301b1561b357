"""The verdict on one host: its probes (the registered results of the role's uri calls and health wait)
judged against what it should run, one small function per probe; :func:`host_entry` puts them together into
the host's verification result, the ``vllm_verify_result`` fact. Every check that fails adds a line to
``errors``; the role fails the host when there is any. :mod:`vllm_fleet.report` only renders results.
"""

from __future__ import annotations

import base64
import datetime as _dt
import email.utils
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_fleet import egress as _egress
from vllm_fleet import lora as _lora
from vllm_fleet import metrics as _metrics
from vllm_fleet.endpoints import WILDCARD_ADDRESSES as WILDCARD_ADDRESSES  # re-exported: the filter plugin's API
from vllm_fleet.endpoints import probe_url as probe_url  # re-exported: the filter plugin's API
from vllm_fleet.inputs import is_secret_argument, short
from vllm_fleet.sizing import KV_TOLERANCE, kv_band

__all__ = [
    "command_line_drift",
    "crashed_after_start",
    "host_entry",
    "kv_start",
    "running_arguments",
    "version_matches",
]

API_PROBES = ("version", "models", "smoke", "metrics_before", "metrics_after")
# What keeps vLLM and its libraries off the network (templates/vllm.env.j2): the running process must have each.
OFFLINE_ENVIRONMENT = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _status(result: Mapping[str, Any] | None) -> int | None:
    if not result:
        return None
    status = result.get("status")
    if status is None:  # int(None) is a TypeError
        return None
    try:
        return int(status)
    except (TypeError, ValueError):
        return None


def _http_error(what: str, result: Mapping[str, Any] | None) -> str | None:
    """``None`` when the probe answered 200, else a line naming the probe and what came back."""
    if not result:
        return "%s: not probed" % what
    if result.get("skipped"):
        return "%s: not probed (%s)" % (what, result.get("skip_reason") or "skipped")
    status = _status(result)
    if status == 200:
        return None
    detail = str(result.get("msg") or "").strip()
    if status in (None, -1):
        return "%s: no answer (%s)" % (what, detail or "connection failed")
    return "%s: HTTP %s%s" % (what, status, " (%s)" % detail if detail else "")


def version_matches(pinned: str, reported: object) -> bool:
    """``/version`` equals the pinned version; a PEP 440 local label (``0.32.0+cpu``) is ignored."""
    if not pinned or not reported:
        return False
    return str(reported).strip().split("+", 1)[0] == str(pinned).strip().split("+", 1)[0]


def _json_body(result: Mapping[str, Any] | None) -> Any:
    if not result:
        return None
    body = result.get("json")
    if body is None and isinstance(result.get("content"), str):
        try:
            body = json.loads(result["content"])
        except ValueError:
            body = None
    return body


def _metrics_facts(
    what: str, result: Mapping[str, Any] | None, errors: list[str] | None
) -> _metrics.MetricsFacts | None:
    """Parse a /metrics probe; record why not in ``errors`` (when given)."""
    if result and "families" in result:
        return _metrics.MetricsFacts.from_dict(result)
    problem = _http_error(what, result)
    if problem is None:
        content = result.get("content") if result else None  # no problem: there is a result
        try:
            return _metrics.parse(content or "")
        except _metrics.MetricsParseError as exc:
            problem = "%s: %s" % (what, exc)
    if errors is not None:
        errors.append(problem)
    return None


def _placement(plan: Mapping[str, Any] | None, instance: Any) -> dict[str, Any] | None:
    placed = next((i for i in (plan or {}).get("instances") or [] if i.get("name") == instance), None)
    if placed is None:
        return None
    return {key: placed.get(key) for key in ("port", "gpus", "tensor_parallel_size", "args")}


def crashed_after_start(health: Mapping[str, Any], unit_after: Mapping[str, Any] | None) -> str | None:
    """Why the release counts as crashed after it answered /health, or ``None``.

    ``unit_after`` is the unit read after the probes, as ``unit_verdict`` (plugins/module_utils/vllm_unit.py)
    judges it. vLLM's API server exits (with status 0) when its engine dies, and the unit restarts it: a
    restart counter above the one the health wait saw, or a unit no longer running, is a crash after start,
    not a slow start.
    """
    if not health.get("ok") or not unit_after:
        return None
    try:
        before = int(health.get("restarts") or 0)
    except (TypeError, ValueError):
        before = 0
    after = int(unit_after.get("restarts") or 0)
    unit = unit_after.get("unit") or "the unit"
    if after > before:
        return (
            "crashed after start: %s answered /health, then exited and was restarted %d time(s) during the "
            "probes (Result=%s); see its journal" % (unit, after - before, unit_after.get("Result", "?"))
        )
    if unit_after.get("ActiveState") not in (None, "active", "activating", "reloading"):
        return "crashed after start: %s answered /health, then stopped (%s/%s, Result=%s)" % (
            unit,
            unit_after.get("ActiveState"),
            unit_after.get("SubState", "?"),
            unit_after.get("Result", "?"),
        )
    return None


def _startup_seconds(health: Mapping[str, Any], after: _metrics.MetricsFacts | None) -> float | None:
    """Seconds from the API server's process start to the first 200 of /health, both on the host's clock.

    The 200's ``Date`` header (1 s resolution) minus ``process_start_time_seconds`` of the scrape. Only
    when the wait really waited (a service already up when the wait began says nothing about its
    start-up) and the process did not restart since.
    """
    if not health.get("ok") or health.get("already_up") or not health.get("healthy_date") or after is None:
        return None
    started = (after.gauges.get("process_start_time_seconds") or {}).get("max")
    if started is None:
        return None
    try:
        healthy_at = email.utils.parsedate_to_datetime(str(health["healthy_date"])).timestamp()
    except (TypeError, ValueError):
        return None
    seconds = healthy_at - float(started)
    return round(seconds, 1) if seconds >= -1 else None


def _num(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def _as_json(value: Any) -> str:
    """A response body for a message: as sent (a string) or as JSON."""
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


# The probes' URL (a wildcard bind address on loopback): vllm_fleet.endpoints, shared with the plan's instances.


# ------------------------------------------------------------------------------------------------
# Fragments and the merged report
# ------------------------------------------------------------------------------------------------


@dataclass
class _Lines:
    """What the checks found so far, in the order they ran."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class _Probes:
    """The probes, and which API probes were not made (skipped, or absent) after the health wait failed."""

    results: Mapping[str, Any]
    health_failed: bool
    not_probed: list[str]

    def error(self, what: str, name: str) -> str | None:
        """The HTTP problem of probe ``name``, or None (also for an API probe the failed health wait skipped)."""
        if self.health_failed and name in self.not_probed:
            return None
        return _http_error(what, self.results.get(name))


def _judge_health(probes: Mapping[str, Any], out: _Lines) -> dict[str, Any]:
    health = dict(probes.get("health") or {})
    if health.get("skipped"):
        out.warnings.append("health wait skipped (%s)" % (health.get("skip_reason") or "skipped"))
    elif not health.get("ok"):
        out.errors.append("health: %s" % (health.get("error") or "/health did not answer 200"))
    if probes.get("aborted"):
        out.errors.append("verification stopped: %s" % str(probes["aborted"]).strip())
    crash = crashed_after_start(health, probes.get("unit_after"))
    if crash:
        out.errors.append(crash)
    return health


def _judge_version(probes: _Probes, pinned: str, out: _Lines) -> Any:
    body = _json_body(probes.results.get("version")) or {}
    reported = body.get("version") if isinstance(body, Mapping) else None
    error = probes.error("/version", "version")
    if error:
        out.errors.append(error)
    elif "version" in probes.not_probed:
        pass
    elif not pinned:
        out.warnings.append("vllm_version is not set: /version reports %s, not compared" % reported)
    elif not version_matches(pinned, reported):
        out.errors.append("/version reports %r, the pinned vllm_version is %r" % (reported, pinned))
    return reported


def _judge_models(probes: _Probes, served: str, out: _Lines) -> tuple[str, list[str]]:
    """(the served name, what /v1/models lists); without a configured name, the listed one."""
    body = _json_body(probes.results.get("models")) or {}
    model_ids = [
        str(m.get("id"))
        for m in (body.get("data") or [] if isinstance(body, Mapping) else [])
        if isinstance(m, Mapping)
    ]
    error = probes.error("/v1/models", "models")
    if error:
        out.errors.append(error)
    elif "models" in probes.not_probed:
        pass
    elif not model_ids:
        out.errors.append("/v1/models lists no model")
    elif served and served not in model_ids:
        out.errors.append("/v1/models lists %s, not the served name %r" % (model_ids, served))
    elif not served:
        out.warnings.append("no served model name configured: used %r from /v1/models" % model_ids[0])
        served = model_ids[0]
    return served, model_ids


def adapters_in_args(args: Any) -> list[str] | None:
    """The LoRA adapters' names a `vllm serve` command line loads (its --lora-modules), or None when it is no list."""
    modules = _lora.modules_in_args(args)
    return None if modules is None else [m["name"] for m in modules]


def _judge_adapters(
    probes: _Probes, served: str, expect: Mapping[str, Any], plan: Mapping[str, Any] | None, out: _Lines
) -> dict[str, Any]:
    """The adapters the instance serves (its own /v1/models: the cards whose parent is a model) against those it must
    load: the command line it must run (expect["args"]: the plan's, or a restored release's), else its plan."""
    body = _json_body(probes.results.get("models")) or {}
    cards = [m for m in (body.get("data") or [] if isinstance(body, Mapping) else []) if isinstance(m, Mapping)]
    serving = sorted(str(m.get("id")) for m in cards if m.get("parent"))
    expected = adapters_in_args(expect.get("args"))
    if expected is None:
        placed = next((i for i in (plan or {}).get("instances") or [] if i.get("name") == expect.get("instance")), None)
        expected = list((placed or {}).get("adapters") or [])
    expected = sorted(expected)
    if "models" not in probes.not_probed and not probes.error("/v1/models", "models") and serving != expected:
        missing = sorted(set(expected) - set(serving))
        extra = sorted(set(serving) - set(expected))
        out.errors.append(
            "/v1/models serves the adapters %s, the plan has %s%s%s"
            % (
                serving or "none",
                expected or "none",
                "; not served: %s" % ", ".join(missing) if missing else "",
                "; not planned: %s" % ", ".join(extra) if extra else "",
            )
        )
    wrong_parent = sorted(str(m.get("id")) for m in cards if m.get("parent") and served and m.get("parent") != served)
    if wrong_parent:
        out.errors.append("/v1/models lists the adapters %s on another model than %r" % (wrong_parent, served))
    return {"planned": expected, "served": serving}


def _scrapes(probes: _Probes, out: _Lines) -> tuple[_metrics.MetricsFacts | None, _metrics.MetricsFacts | None]:
    """The /metrics scrapes before and after the smoke request, parsed."""
    before = _metrics_facts("/metrics (before the smoke request)", probes.results.get("metrics_before"), None)
    if before is None and "metrics_before" not in probes.not_probed:
        out.warnings.append("the first /metrics scrape failed: findings use totals since start")
    after = (
        None
        if probes.health_failed and "metrics_after" in probes.not_probed
        else _metrics_facts("/metrics", probes.results.get("metrics_after"), out.errors)
    )
    return before, after


def _judge_readback(
    after: _metrics.MetricsFacts | None,
    speculative: bool,
    expect: Mapping[str, Any],
    profile: Mapping[str, Any] | None,
    plan: Mapping[str, Any] | None,
    out: _Lines,
) -> tuple[list[str], list[dict[str, Any]], str]:
    """(missing families, drifts of cache_config_info against the profile, the read-back's state)."""
    missing: list[str] = []
    drifts: list[dict[str, Any]] = []
    state = "not done"
    if after is not None:
        missing = _metrics.check_families(after, speculative)
        out.errors.extend(missing)
        if not expect.get("readback", True):
            state = "skipped: vllm_verify_readback is false"
        elif not profile:
            state = "skipped: no vllm_profile_effective fact on this host (run the planning role first)"
        else:
            dropped = [d.get("flag", "") for d in (plan or {}).get("dropped") or [] if isinstance(d, Mapping)]
            wanted = dict(profile)
            wanted.update(expect.get("extra_args") or {})
            drifts = _metrics.readback(after, wanted, skip=dropped)
            out.errors.extend("read-back: %s" % d["message"] for d in drifts)
            state = "drift" if drifts else "matches the profile"
    if state.startswith("skipped"):
        out.warnings.append("cache_config_info read-back %s" % state)
    return missing, drifts, state


def _options(args: list[str]) -> tuple[list[str], dict[str, list[list[str]]]]:
    """(positional arguments, {--flag: [its values, once per time it is given]}) of a `vllm serve` command line;
    ``--flag=value`` counts as ``--flag value``; a value may start with one dash (-1), never with two."""
    positional: list[str] = []
    options: dict[str, list[list[str]]] = {}
    current: list[str] | None = None
    for token in args:
        if token.startswith("--"):
            flag, has_value, value = token.partition("=")
            current = [value] if has_value else []
            options.setdefault(flag, []).append(current)
        elif current is None:
            positional.append(token)
        else:
            current.append(token)
    return positional, options


def _shown(flag: str, values: list[list[str]] | None) -> str:
    if values is None:
        return "absent"
    if is_secret_argument(flag):  # --api-key, --hf-token; not --max-num-batched-tokens
        return "(value not shown)"
    return " | ".join(short(" ".join(v), 80, str) if v else "(no value)" for v in values)


def running_arguments(cmdline: Any) -> list[str] | None:
    """The arguments after `serve` of a process's command line: ``/proc/<pid>/cmdline`` as slurp returns it
    (``{"content": base64}``), as text with NUL separators, or as a list; None when there is no `serve`."""
    if isinstance(cmdline, Mapping):
        content = cmdline.get("content")
        if not content:
            return None
        cmdline = base64.b64decode(content).decode("utf-8", "replace")
    if isinstance(cmdline, str):
        cmdline = cmdline.rstrip("\0").split("\0")
    argv = [str(a) for a in cmdline or []]
    return argv[argv.index("serve") + 1 :] if "serve" in argv else None


def command_line_drift(expected: list[str], running: list[str]) -> list[str]:
    """Each difference between the arguments the instance should run (its plan's, or its restored release's) and
    the ones its process runs: the model, and every flag missing, added, or with another value (in that order,
    flags sorted). Values of a flag named like a secret are never shown. Empty when they are the same."""
    want_pos, want = _options([str(a) for a in expected])
    have_pos, have = _options([str(a) for a in running])
    drifts = []
    if want_pos != have_pos:
        drifts.append(
            "the model argument: expected %s, the process runs %s"
            % (" ".join(want_pos) or "(none)", " ".join(have_pos) or "(none)")
        )
    for flag in sorted(set(want) | set(have)):
        if want.get(flag) == have.get(flag):
            continue
        if flag not in have:
            drifts.append("%s %s is not in the running command line" % (flag, _shown(flag, want[flag])))
        elif flag not in want:
            drifts.append("%s %s runs but is not in what was deployed" % (flag, _shown(flag, have[flag])))
        else:
            drifts.append(
                "%s: expected %s, the process runs %s" % (flag, _shown(flag, want[flag]), _shown(flag, have[flag]))
            )
    return drifts


def _judge_command_line(probes: _Probes, expect: Mapping[str, Any], out: _Lines) -> dict[str, Any]:
    """The whole command line of the unit's main process against the arguments it should run."""
    expected = expect.get("args")
    result = probes.results.get("cmdline")
    if expected is None or not isinstance(expected, (list, tuple)):
        out.warnings.append("command-line read-back skipped: no planned or recorded arguments for this instance")
        return {"state": "skipped: no arguments to compare", "drifts": []}
    if probes.health_failed:
        return {"state": "not done", "drifts": []}
    if not result or (isinstance(result, Mapping) and result.get("skipped")):
        out.warnings.append("command-line read-back not done: the unit is not checked (vllm_verify_check_unit)")
        return {"state": "not done", "drifts": []}
    running = running_arguments(result)
    if running is None:
        where = expect.get("unit") or "the unit"
        out.errors.append(
            "command-line read-back: could not read the running command line of %s's main process "
            "(%s)" % (where, short((result or {}).get("msg") if isinstance(result, Mapping) else result, 120, str))
        )
        return {"state": "unreadable", "drifts": []}
    if expect.get("runtime_adapters"):
        # Adapters added or removed at runtime (vllm_lora_runtime_updates) leave the process's --lora-modules as it
        # started; its own /v1/models is what it serves (_judge_adapters).
        expected, running = _lora.without_modules(expected), _lora.without_modules(running)
    drifts = command_line_drift(list(expected), running)
    out.errors.extend("command-line read-back: %s" % d for d in drifts)
    return {
        "state": "drift" if drifts else "matches",
        "drifts": drifts,
        "arguments": len(running),
        "against": expect.get("args_source") or "plan",
    }


def process_environment(environ: Any) -> dict[str, str] | None:
    """``/proc/<pid>/environ`` as slurp returns it (base64 ``content``), as a command printed it in base64
    (``stdout``, rc 0), or as text, as {name: value}; None when it could not be read."""
    if isinstance(environ, Mapping):
        content = environ.get("content") or (environ.get("stdout") if environ.get("rc") == 0 else None)
        if not content or environ.get("failed"):
            return None
        environ = base64.b64decode(content).decode("utf-8", "replace")
    if not isinstance(environ, str):
        return None
    found = {}
    for entry in environ.split("\0"):
        name, sep, value = entry.partition("=")
        if sep:
            found[name] = value
    return found


def _judge_offline(probes: _Probes, expect: Mapping[str, Any], out: _Lines) -> dict[str, Any]:
    """The running process's environment holds what keeps it off the network (only those names are shown: the
    environment holds the API key)."""
    wanted = dict(OFFLINE_ENVIRONMENT)
    wanted.update({str(k): str(v) for k, v in (expect.get("offline_environment") or {}).items()})
    result = probes.results.get("environ")
    if probes.health_failed:
        return {"state": "not done", "checked": []}
    if not result or (isinstance(result, Mapping) and result.get("skipped")):
        out.warnings.append("offline environment not checked: the unit is not checked (vllm_verify_check_unit)")
        return {"state": "not done", "checked": []}
    running = process_environment(result)
    if running is None:
        why = result.get("stderr") if isinstance(result, Mapping) else None
        out.errors.append(
            "offline environment: could not read the environment of the unit's main process%s"
            % (" (%s)" % short(why, 120, str) if why else "")
        )
        return {"state": "unreadable", "checked": sorted(wanted)}
    wrong = []
    for name, value in sorted(wanted.items()):
        if name not in running:
            wrong.append("%s is not set in the running process (it must be %s)" % (name, value))
        elif running[name] != value:
            wrong.append("%s=%s in the running process (it must be %s)" % (name, short(running[name], 40, str), value))
    out.errors.extend("offline environment: %s" % w for w in wrong)
    return {"state": "differs" if wrong else "offline", "checked": sorted(wanted), "differences": wrong}


def _judge_egress(probes: _Probes, out: _Lines) -> dict[str, Any] | None:
    """What the host's egress rules refused since they were loaded (``nft -j list table``): each destination a
    warning, since any process of the host may have sent it."""
    result = probes.results.get("egress")
    if not result or (isinstance(result, Mapping) and result.get("skipped")):
        return None
    if isinstance(result, Mapping) and result.get("rc") not in (0, None):
        out.warnings.append(
            "egress: the host's egress rules are not loaded (%s)" % short(result.get("stderr") or "", 120, str)
        )
        return {"state": "not loaded", "packets": None, "destinations": []}
    text = result.get("stdout") if isinstance(result, Mapping) else result
    try:
        refused = _egress.denied(str(text))
    except ValueError as exc:
        out.warnings.append("egress: %s" % exc)
        return {"state": "unreadable", "packets": None, "destinations": []}
    if refused["packets"]:
        shown = ", ".join(_egress.describe(d) for d in refused["destinations"][:10]) or "destinations not recorded"
        out.warnings.append(
            "egress: the host's rules refused %d packet(s) since they were loaded: %s; fix it at its cause, or admit "
            "the destination in vllm_egress_allow" % (refused["packets"], shown)
        )
    return {"state": "refused" if refused["packets"] else "none refused", **refused}


def _bundle(probes: _Probes) -> dict[str, Any] | None:
    """The signed bundle the running release came from (the release's ``bundle.json``, slurp's result): its name,
    project commit, vllm-fleet version ("" for a bundle built before 0.2.0) and manifest SHA-256; None when the
    release has no record (installed without the signed manifest, or before releases recorded it) or it could not be
    read."""
    result = probes.results.get("bundle")
    if not isinstance(result, Mapping) or result.get("skipped") or not result.get("content"):
        return None
    try:
        record = json.loads(base64.b64decode(str(result["content"])).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, Mapping):
        return None
    return {key: str(record.get(key) or "") for key in ("name", "commit", "version", "manifest_sha256", "lock_sha256")}


def _judge_smoke(
    probes: _Probes,
    expect: Mapping[str, Any],
    served: str,
    before: _metrics.MetricsFacts | None,
    after: _metrics.MetricsFacts | None,
    out: _Lines,
) -> dict[str, Any]:
    result = probes.results.get("smoke")
    body = _json_body(result) or {}
    usage = body.get("usage") or {} if isinstance(body, Mapping) else {}
    choices = body.get("choices") or [] if isinstance(body, Mapping) else []
    budget = _num(expect.get("latency_budget_s"))
    server = _metrics.window_latencies(before, after) if after is not None else {}
    smoke_requests = int(expect.get("smoke_requests") or 1)
    client_elapsed = _num((result or {}).get("elapsed"))
    server_e2e = server.get("e2e_s")
    latency = (
        max(v for v in (server_e2e, client_elapsed) if v is not None)
        if (server_e2e is not None or client_elapsed is not None)
        else None
    )
    error = probes.error("smoke chat completion", "smoke")
    if error:
        out.errors.append(error)
    elif "smoke" in probes.not_probed:
        pass
    elif not choices or not usage.get("completion_tokens"):
        out.errors.append("smoke chat completion: the answer has no generated tokens (%s)" % short(body, 160, _as_json))
    elif budget is not None and latency is not None and latency > budget:
        out.errors.append("smoke chat completion took %.3f s, over the latency budget of %.3f s" % (latency, budget))
    if server.get("requests") and server["requests"] > smoke_requests:
        out.warnings.append(
            "server-side latencies are the mean of %d requests finished between the scrapes, not the "
            "smoke request alone" % server["requests"]
        )
    return {
        "status": _status(result),
        "model": served or None,
        "prompt_tokens": usage.get("prompt_tokens"),
        "completion_tokens": usage.get("completion_tokens"),
        "finish_reason": (choices[0].get("finish_reason") if choices and isinstance(choices[0], Mapping) else None),
        "client_elapsed_s": client_elapsed,
        "server": server,
        "server_window_requests": server.get("requests"),
        "latency_s": latency,
        "budget_s": budget,
    }


def _tokens(value: Any) -> float | None:
    """A token count, or ``None`` for what is not a number (booleans included)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def kv_start(tokens: Any, first: Any, warm: Any) -> dict[str, Any]:
    """Which start the engine's KV tokens match, against the planner's two predictions (:mod:`vllm_fleet.sizing`):
    ``first`` (a start that compiles vLLM's graphs) and ``warm`` (a restart that finds vLLM's torch.compile cache;
    ``None``, as in a plan made before it was predicted: the first start's).

    ``start``: ``"first start"`` or ``"warm restart"`` when the engine is within KV_TOLERANCE of that prediction
    (of both: the nearer; a tie: the first start), ``"between first start and warm restart"`` when it is in the
    planned band but within the tolerance of neither (a warm restart of more than 10.5 % leaves a gap),
    ``"outside the planned band"`` below first x (1 - KV_TOLERANCE) or above warm x (1 + KV_TOLERANCE), ``None``
    when a side is unknown. ``error_pct``: kv_prediction_error's error against the matched start (between or
    outside the band: the nearer one); ``planned``: the line the reports show; ``band_tokens``: [low, high].
    """
    actual, first_n, warm_n = _tokens(tokens), _tokens(first), _tokens(warm)
    if not actual or first_n is None:
        return {"start": None, "error_pct": None, "planned": None, "band_tokens": None}
    if warm_n is None:
        warm_n = first_n
    low, high = kv_band(int(first_n), int(warm_n))
    facts = {"families": {}, "cache_config": {"kv_cache_size_tokens": actual}}
    predictions = {"first start": first_n, "warm restart": warm_n}
    errors = {kind: _metrics.kv_prediction_error(value, facts) for kind, value in predictions.items()}
    # Within the tolerance of a prediction, as the band is: |actual - predicted| <= KV_TOLERANCE x predicted.
    within = [kind for kind, value in predictions.items() if abs(actual - value) <= KV_TOLERANCE * value]
    nearer = min(predictions, key=lambda kind: abs(actual - predictions[kind]))
    if within:
        start = nearer if nearer in within else within[0]
        planned = "as planned (%s)" % start
    else:
        inside = low <= actual <= high
        start = "between first start and warm restart" if inside else "outside the planned band"
        planned = "%s %s-%s tokens%s; nearer the %s (error %+.2f %%)" % (
            "within the planned band" if inside else "outside the planned band",
            f"{low:,}",
            f"{high:,}",
            ", within %g %% of neither start" % (KV_TOLERANCE * 100) if inside else "",
            nearer,
            errors[nearer] or 0.0,
        )
    return {
        "start": start,
        "error_pct": errors[start if within else nearer],
        "planned": planned,
        "band_tokens": [low, high],
    }


def _kv_cache(after: _metrics.MetricsFacts | None, plan: Mapping[str, Any] | None) -> dict[str, Any]:
    """The engine's KV cache as cache_config_info reports it, against the planner's predictions: the first
    start's (``predicted_tokens``, ``prediction_error_pct``) and a warm restart's, and which of them it matches."""
    cache = after.cache_config if after is not None else {}
    capacity = (plan or {}).get("capacity") or {}
    predicted = capacity.get("kv_cache_tokens")
    warm = capacity.get("kv_cache_tokens_warm", predicted)
    start = kv_start(cache.get("kv_cache_size_tokens"), predicted, warm)
    return {
        "tokens": cache.get("kv_cache_size_tokens"),
        "memory_bytes": cache.get("kv_cache_memory_bytes"),
        "num_gpu_blocks": cache.get("num_gpu_blocks"),
        "block_size": cache.get("block_size"),
        "max_concurrency": cache.get("kv_cache_max_concurrency"),
        "cache_dtype": cache.get("cache_dtype"),
        "enable_prefix_caching": cache.get("enable_prefix_caching"),
        "gpu_memory_utilization": cache.get("gpu_memory_utilization"),
        "predicted_tokens": predicted,
        "prediction_error_pct": _metrics.kv_prediction_error(predicted, after) if after is not None else None,
        "predicted_tokens_warm": warm,
        "prediction_error_warm_pct": _metrics.kv_prediction_error(warm, after) if after is not None else None,
        "band_tokens": start["band_tokens"],
        "start": start["start"],
        "start_error_pct": start["error_pct"],
        "planned": start["planned"],
    }


def _judge_findings(
    before: _metrics.MetricsFacts | None,
    after: _metrics.MetricsFacts | None,
    thresholds: Mapping[str, Any],
    fail: bool,
    out: _Lines,
    fail_ids: frozenset[str] = frozenset(),
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(day-2 findings over the window of the two scrapes, the rates they come from); with ``fail`` every finding is
    an error, else those whose id is in ``fail_ids`` (a site's no-go on a low speculative acceptance rate)."""
    if after is None:
        return [], {}
    found = _metrics.findings(before, after, **thresholds)
    rates = _metrics.rates(
        before, after, **{k: thresholds[k] for k in ("min_prefix_queries", "min_draft_tokens") if k in thresholds}
    )
    out.errors.extend("finding: %s" % f["message"] for f in found if fail or f["id"] in fail_ids)
    return found, rates


def host_entry(
    host: str,
    probes: Mapping[str, Any],
    expect: Mapping[str, Any],
    thresholds: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The verification result of one host.

    ``probes`` (registered results; any may be missing or skipped):
      ``health``: ``{"ok", "seconds", "restarts", "active_state", "sub_state", "error"}``;
      ``version``, ``models``, ``smoke``: ``uri`` results (``status``, ``json``, ``msg``, ``elapsed``);
      ``metrics_before``, ``metrics_after``: ``uri`` results with ``content`` (or parsed facts);
      ``cmdline``: the unit's main process's ``/proc/<pid>/cmdline`` (slurp's result, or the argv list);
      ``environ``: its ``/proc/<pid>/environ`` (slurp's result, or the text): the names of OFFLINE_ENVIRONMENT
      and ``expect["offline_environment"]`` must hold their values (only those are ever shown);
      ``egress``: ``nft -j list table inet <egress table>`` (a command's result): what the host refused to send;
      ``bundle``: the running release's ``bundle.json`` (slurp's result): the signed bundle it came from, reported.
    ``expect``:
      ``vllm_version`` (pinned), ``served_model_name`` (``""``: take what /v1/models lists),
      ``profile_name``, ``profile`` (the effective profile dict or ``None``), ``extra_args``
      (``vllm_extra_args``: its ``block_size``, ``kv_cache_memory_bytes``... are read back too),
      ``plan`` (the planner's host entry, or the whole plan with ``hosts``, or ``None``),
      ``speculative`` (``None``: from the profile/plan), ``latency_budget_s``,
      ``smoke_requests`` (how many smoke requests were sent, default 1), ``readback`` (default true),
      ``args`` (the arguments after `vllm serve` the process must run: the plan's, or after a rollback the
      restored release's; ``None`` skips the command-line read-back), ``args_source`` (which of the two),
      ``fail_on_findings`` (default false), ``fail_findings`` (the ids of findings that fail the host on their own,
      e.g. ``spec_acceptance_low``), and ``unit``/``url`` (shown in the report).
    ``thresholds``: keyword arguments of :func:`vllm_fleet.metrics.findings`.
    """
    out = _Lines()
    profile = expect.get("profile") or None
    plan = expect.get("plan") or None
    if plan and isinstance(plan.get("hosts"), Mapping):  # the whole plan (vllm_plan of the plan role)
        plan = plan["hosts"].get(host) or None

    health = _judge_health(probes, out)
    # When the service never became healthy the API probes are skipped: that is one error (health),
    # not one per probe.
    not_probed = [name for name in API_PROBES if not probes.get(name) or (probes.get(name) or {}).get("skipped")]
    api = _Probes(probes, bool(out.errors), not_probed)
    if api.health_failed and not_probed:
        out.warnings.append("not probed because of the errors above: %s" % ", ".join(not_probed))

    pinned = str(expect.get("vllm_version") or "")
    reported = _judge_version(api, pinned, out)
    served, model_ids = _judge_models(api, str(expect.get("served_model_name") or ""), out)
    adapters = _judge_adapters(api, served, expect, plan, out)
    before, after = _scrapes(api, out)
    health["startup_s"] = _startup_seconds(health, after)
    speculative = expect.get("speculative")
    if speculative is None:
        # Every instance of a host runs the same arguments but its port: the first one's say it.
        args = next((i.get("args") or [] for i in (plan or {}).get("instances") or []), [])
        speculative = _metrics.is_speculative(profile, args)
    speculative = bool(speculative)
    missing, drifts, readback_state = _judge_readback(after, speculative, expect, profile, plan, out)
    command_line = _judge_command_line(api, expect, out)
    offline = _judge_offline(api, expect, out)
    egress_refused = _judge_egress(api, out)
    smoke = _judge_smoke(api, expect, served, before, after, out)
    found, rates = _judge_findings(
        before,
        after,
        dict(thresholds or {}),
        bool(expect.get("fail_on_findings")),
        out,
        frozenset(expect.get("fail_findings") or ()),
    )

    return {
        "host": host,
        "ok": not out.errors,
        "errors": out.errors,
        "warnings": out.warnings,
        "checked_at": _now(),
        "instance": expect.get("instance"),
        "url": expect.get("url"),
        "unit": expect.get("unit"),
        "version": {"pinned": pinned or None, "reported": reported},
        # The card the plan sized the host for: the detected one on GPU hosts (vllm_rollout plans them again).
        "gpu": (plan or {}).get("gpu"),
        # Where the plan placed this instance (its port, cards and the arguments its unit runs).
        "placement": _placement(plan, expect.get("instance")),
        "profile": {
            "name": expect.get("profile_name") or (plan or {}).get("profile"),
            "readback": readback_state,
            "drifts": drifts,
            "speculative": speculative,
            "command_line": command_line,
        },
        "health": health,
        "served_model_name": served or None,
        "models": model_ids,
        "adapters": adapters,
        "smoke": smoke,
        "metrics": {
            "families": len(after.families) if after is not None else 0,
            "missing": missing,
            "model_names": after.model_names if after is not None else [],
        },
        "kv_cache": _kv_cache(after, plan),
        "rates": rates,
        "findings": found,
        "offline_environment": offline,
        "egress": egress_refused,
        "bundle": _bundle(api),
    }
