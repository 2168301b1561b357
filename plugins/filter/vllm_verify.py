# Thin Ansible filters over vllm_fleet.verdict: what the vllm_verify role uses to judge an instance.
from __future__ import annotations

DOCUMENTATION = r"""
name: vllm_verify_result
short_description: Judge a host's verification probes, and the other vllm_verify_* filters
description:
  - C(vllm_verify_result) applied to the probe results, with host, expect and thresholds, builds the
    per-host verification result (see C(vllm_fleet.verdict.host_entry)). The raw /metrics scrapes are parsed
    there with prometheus_client's parser, read back against the profile and judged for day-2 findings.
  - C(vllm_verify_unit_verdict) applied to the output of C(systemctl show) for the properties LoadState,
    ActiveState, SubState, Result and NRestarts, with the unit and max_restarts, returns the properties,
    restarts and error (empty while the unit may still come up; else not installed, failed, stopped or
    crash-looping).
  - C(vllm_probe_url) applied to a bind address, with the port and the scheme (C(http)), returns the base URL the
    host's own probes reach vLLM on (a wildcard or empty address on 127.0.0.1, IPv6 in brackets); the role's
    C(vllm_verify_url) and playbooks/benchmark.yml use it.
  - C(vllm_verify_snapshot_outputs) applied to the registered results of the snapshot entry point's looped
    completions returns one C({prompt, text, error}) per prompt (the text of the first choice, or why there is none).
  - The run report's filters are in vllm_report.py.
  - Every filter raises AnsibleFilterError naming the value it could not use.
options:
  _input:
    description: The probe results (a dict of the registered uri results and the health wait).
    type: dict
    required: true
  host:
    description: The host's name.
    type: str
    required: true
  expect:
    description: What the host should run (pinned version, served name, profile, plan, latency budget...).
    type: dict
    required: true
  thresholds:
    description: Day-2 thresholds (min_acceptance_rate, min_prefix_hit_rate, max_preemption_increase...).
    type: dict
requirements:
  - The C(vllm_fleet) package (this checkout's C(src/), loaded beside the plugin) and
    C(prometheus_client).
author:
  - vllm-fleet maintainers
"""

EXAMPLES = r"""
- name: Judge the probes
  ansible.builtin.set_fact:
    vllm_verify_result: "{{ _probes | vllm_verify_result(inventory_hostname, _expect, {'min_prefix_queries': 1000}) }}"

- name: The URL the host's own probes use
  ansible.builtin.debug:
    msg: "{{ vllm_bind_address | default('') | vllm_probe_url(vllm_port | default(8000)) }}"

- name: Is the unit crash-looping?
  ansible.builtin.debug:
    msg: "{{ __unit.stdout | vllm_verify_unit_verdict('vllm@main.service', 3) }}"
"""

RETURN = r"""
_value:
  description:
    - For C(vllm_verify_result), the host's verification result (ok, errors, warnings, health, smoke, kv_cache,
      findings...); for the others, see the description.
    - Its C(kv_cache) holds the engine's KV tokens against the plan's two predictions (C(predicted_tokens) and
      C(prediction_error_pct) of a first start, C(predicted_tokens_warm) and C(prediction_error_warm_pct) of a warm
      restart), the start they match (C(start) first start, warm restart, between first start and warm restart
      or outside the planned band; C(start_error_pct); C(band_tokens)) and C(planned), the line the reports show.
      A KV cache outside the band is reported and fails nothing.
  type: raw
"""

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


class FilterModule:
    """vLLM verification filters."""

    def filters(self):
        return {
            "vllm_verify_result": vllm_verify_result,
            "vllm_verify_unit_verdict": vllm_verify_unit_verdict,
            "vllm_probe_url": vllm_probe_url,
            "vllm_verify_snapshot_outputs": vllm_verify_snapshot_outputs,
        }
