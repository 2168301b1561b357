# Thin Ansible filters over vllm_fleet.verdict: what the vllm_verify role uses to judge an instance.
from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

# The library of this checkout, beside the plugin (never another installed copy): every filter plugin loads it so.
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
try:
    from vllm_fleet import metrics as _metrics
    from vllm_fleet import verdict as _verdict
    from vllm_fleet.inputs import short as _short
except ImportError as _exc:  # a dependency is missing (prometheus_client)
    # None without the library: _need_lib refuses every filter that uses them, with the reason.
    _metrics = _verdict = None  # type: ignore[assignment]
    _IMPORT_ERROR: ImportError | None = _exc
else:
    _IMPORT_ERROR = None

# The unit's verdict has one home, shared with the vllm_wait_healthy module on the hosts (standard library only).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "module_utils"))
from vllm_unit import unit_verdict as _unit_verdict


def _need_lib(name):
    if _IMPORT_ERROR is not None:
        raise AnsibleFilterError(
            "%s needs the vllm_fleet package in the controller's Python (%s): %s; "
            "install it with `pip install -e .` from the repository" % (name, sys.executable, _IMPORT_ERROR)
        )


_THRESHOLDS = tuple(_metrics.DEFAULTS) if _metrics else ()


def _thresholds(values, name):
    out = {}
    for key, value in values.items():
        if key not in _THRESHOLDS:
            raise AnsibleFilterError("%s: unknown threshold %r (known: %s)" % (name, key, ", ".join(_THRESHOLDS)))
        if value is None:
            continue
        if isinstance(value, bool):
            raise AnsibleFilterError("%s: threshold %s must be a number, got %r" % (name, key, value))
        try:
            out[key] = float(value)
        except (TypeError, ValueError) as exc:
            raise AnsibleFilterError("%s: threshold %s must be a number, got %s" % (name, key, _short(value))) from exc
    return out


def _is_number(value):
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def vllm_verify_result(probes, host, expect, thresholds=None):
    _need_lib("vllm_verify_result")
    if not isinstance(probes, Mapping):
        raise AnsibleFilterError("vllm_verify_result: probes must be a dict, got %s" % _short(probes))
    if not isinstance(expect, Mapping):
        raise AnsibleFilterError("vllm_verify_result: expect must be a dict, got %s" % _short(expect))
    if not host or not isinstance(host, str):
        raise AnsibleFilterError("vllm_verify_result: host must be a name, got %s" % _short(host))
    return _verdict.host_entry(
        str(host), dict(probes), dict(expect), _thresholds(dict(thresholds or {}), "vllm_verify_result")
    )


def vllm_verify_unit_verdict(show_output, unit, max_restarts=0):
    _need_lib("vllm_verify_unit_verdict")
    if not isinstance(show_output, str):
        raise AnsibleFilterError(
            "vllm_verify_unit_verdict expects the stdout of systemctl show, got %s" % _short(show_output)
        )
    if isinstance(max_restarts, bool) or not _is_number(max_restarts) or int(max_restarts) < 0:
        raise AnsibleFilterError(
            "vllm_verify_unit_verdict: max_restarts must be 0 or more, got %s" % _short(max_restarts)
        )
    return _unit_verdict(str(show_output), str(unit), int(max_restarts))


def vllm_probe_url(address, port, scheme="http"):
    _need_lib("vllm_probe_url")
    if scheme not in ("http", "https"):
        raise AnsibleFilterError("vllm_probe_url: scheme must be http or https, got %s" % _short(scheme))
    return _verdict.probe_url(address, port, scheme)


def vllm_verify_snapshot_outputs(results):
    if not isinstance(results, list):
        raise AnsibleFilterError(
            "vllm_verify_snapshot_outputs expects the looped uri results (a list), got %s" % _short(results)
        )
    outputs = []
    for result in results:
        if not isinstance(result, Mapping):
            raise AnsibleFilterError("vllm_verify_snapshot_outputs: a result is not a dict: %s" % _short(result))
        body = result.get("json")
        choices = body.get("choices") if isinstance(body, Mapping) else None
        text = (
            choices[0].get("text")
            if isinstance(choices, list) and choices and isinstance(choices[0], Mapping)
            else None
        )
        error = None
        if result.get("status") != 200 or not isinstance(text, str):
            error = "HTTP %s: %s" % (result.get("status", "no answer"), str(result.get("msg", "no text"))[:300])
            text = None
        outputs.append({"prompt": str(result.get("item", "")), "text": text, "error": error})
    return outputs


# Each filter is documented in plugins/filter/<filter>.yml, which ansible-doc -t filter reads.
class FilterModule:
    """vLLM verification filters."""

    def filters(self):
        return {
            "vllm_verify_result": vllm_verify_result,
            "vllm_verify_unit_verdict": vllm_verify_unit_verdict,
            "vllm_probe_url": vllm_probe_url,
            "vllm_verify_snapshot_outputs": vllm_verify_snapshot_outputs,
        }
