# Thin Ansible filters over vllm_fleet.metrics and vllm_fleet.report (controller side).
from __future__ import annotations

DOCUMENTATION = r"""
name: vllm_metrics_facts
short_description: Parse a vLLM /metrics page into facts, and the other vllm_metrics_* / vllm_report_* filters
description:
  - C(vllm_metrics_facts) parses the Prometheus text of a vLLM C(/metrics) page with prometheus_client's
    parser into a dict of facts (see RETURN). The other C(vllm_metrics_*) filters take those facts or
    the raw text.
  - C(vllm_metrics_check) returns the list of errors, missing required metric families (today's names;
    the speculative-decoding families only with O(speculative=true)) and, when O(profile) is given,
    read-back drifts of C(vllm:cache_config_info) against it. Options speculative, profile, skip.
  - C(vllm_metrics_readback) returns the drifts as dicts with key, label, expected, actual and message.
    Arguments profile and skip (profile keys or flags not to compare, such as the plan's dropped flags).
  - C(vllm_metrics_findings) is applied to the first scrape (or null) with the second as argument and
    returns the day-2 findings. Keyword thresholds min_acceptance_rate (0.6), min_draft_tokens (100),
    min_prefix_hit_rate (0.3), min_prefix_queries (1000), max_preemption_increase (0).
  - C(vllm_metrics_kv_error) with the planner's predicted KV tokens as argument returns the error in
    percent against C(kv_cache_size_tokens) (positive means over-predicted), or null.
  - C(vllm_metrics_required) applied to a boolean (speculation on) returns the required families,
    name to type.
  - C(vllm_verify_result) applied to the probe results, with host, expect and thresholds, builds the
    per-host verification result (see C(vllm_fleet.verdict.host_entry)).
  - C(vllm_verify_unit_verdict) applied to the output of C(systemctl show) for the properties LoadState,
    ActiveState, SubState, Result and NRestarts, with the unit and max_restarts, returns the properties,
    restarts and error (empty while the unit may still come up; else not installed, failed, stopped or
    crash-looping).
  - C(vllm_report_fragment) (data, host, kind), C(vllm_report_fragment_name), C(vllm_report_merge)
    (fragments, run_id, meta) and C(vllm_report_markdown) build the run report (see C(vllm_fleet.report)).
  - Every filter raises AnsibleFilterError naming the value it could not use.
options:
  _input:
    description:
      - The text of a /metrics page (for C(vllm_metrics_facts)), or facts/text for the other
        C(vllm_metrics_*) filters.
    type: raw
    required: true
requirements:
  - The C(vllm_fleet) package (this repository's C(src/), installed in the controller's Python) and
    C(prometheus_client).
author:
  - vLLM fleet team
"""

EXAMPLES = r"""
- name: Parse a scrape taken on the host
  ansible.builtin.set_fact:
    _facts: "{{ __vllm_verify_metrics.content | vllm_metrics_facts }}"

- name: Fail when a required family is missing or the cache config drifted
  ansible.builtin.assert:
    that: _errors | length == 0
    fail_msg: "{{ _errors | join('; ') }}"
  vars:
    _errors: "{{ _facts | vllm_metrics_check(speculative=false, profile=vllm_profile_effective) }}"

- name: Day-2 findings between two scrapes
  ansible.builtin.debug:
    msg: "{{ _facts_before | vllm_metrics_findings(_facts, min_prefix_hit_rate=0.5) }}"

- name: Planner error in percent
  ansible.builtin.debug:
    msg: "{{ _facts | vllm_metrics_kv_error(vllm_plan.capacity.kv_cache_tokens) }}"
"""

RETURN = r"""
_value:
  description:
    - For C(vllm_metrics_facts), a dict with C(families) (name to type), C(counters) (family to total over
      series), C(gauges) (family to C({sum, max, series})), C(histograms) (family to C({count, sum, mean,
      buckets, p50, p90, p99})), C(cache_config) (labels of C(vllm:cache_config_info), typed),
      C(model_names) and C(engines).
    - For the others, see the description.
  type: raw
"""

import os
import sys
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

# As plugins/filter/vllm_plan.py: the installed package, else this checkout's src/.
try:
    try:
        from vllm_fleet import metrics as _metrics
        from vllm_fleet import report as _report
        from vllm_fleet import verdict as _verdict
    except ImportError:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "src"))
        from vllm_fleet import metrics as _metrics
        from vllm_fleet import report as _report
        from vllm_fleet import verdict as _verdict
except ImportError as _exc:  # a dependency is missing (prometheus_client)
    _metrics = _report = _verdict = None
    _IMPORT_ERROR = _exc
else:
    _IMPORT_ERROR = None


def _need_lib(name):
    if _IMPORT_ERROR is not None:
        raise AnsibleFilterError(
            "%s needs the vllm_fleet package in the controller's Python (%s): %s; "
            "install it with `pip install -e .` from the repository" % (name, sys.executable, _IMPORT_ERROR)
        )


def _short(value, limit=120):
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _facts(value, name):
    """Facts from a facts dict or from /metrics text."""
    _need_lib(name)
    if isinstance(value, str):
        try:
            return _metrics.parse(str(value))
        except _metrics.MetricsParseError as exc:
            raise AnsibleFilterError("%s: %s (input %s)" % (name, exc, _short(value)))
    if isinstance(value, Mapping):
        try:
            return _metrics.MetricsFacts.from_dict(value)
        except TypeError as exc:
            raise AnsibleFilterError("%s: %s" % (name, exc))
    raise AnsibleFilterError(
        "%s expects /metrics text or the output of vllm_metrics_facts, got %s %s"
        % (name, type(value).__name__, _short(value))
    )


def _profile(value, name):
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise AnsibleFilterError("%s: profile must be a dict, got %s %s" % (name, type(value).__name__, _short(value)))
    return dict(value)


def _skip(value, name):
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise AnsibleFilterError("%s: skip must be a list of keys or flags, got %s" % (name, _short(value)))
    out = []
    for item in value:
        out.append(item.get("flag", "") if isinstance(item, Mapping) else str(item))
    return out


def vllm_metrics_facts(text):
    if not isinstance(text, str):
        raise AnsibleFilterError(
            "vllm_metrics_facts expects the text of a /metrics page, got %s %s" % (type(text).__name__, _short(text))
        )
    return _facts(text, "vllm_metrics_facts").as_dict()


def vllm_metrics_required(speculative=False):
    _need_lib("vllm_metrics_required")
    return _metrics.required_families(bool(speculative))


def vllm_metrics_check(facts, speculative=False, profile=None, skip=None):
    parsed = _facts(facts, "vllm_metrics_check")
    return _metrics.check(
        parsed,
        speculative=bool(speculative),
        expected=_profile(profile, "vllm_metrics_check"),
        skip=_skip(skip, "vllm_metrics_check"),
    )


def vllm_metrics_readback(facts, profile, skip=None):
    parsed = _facts(facts, "vllm_metrics_readback")
    if profile is None:
        raise AnsibleFilterError("vllm_metrics_readback needs the effective profile dict, got None")
    return _metrics.readback(
        parsed, _profile(profile, "vllm_metrics_readback"), skip=_skip(skip, "vllm_metrics_readback")
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
        except (TypeError, ValueError):
            raise AnsibleFilterError("%s: threshold %s must be a number, got %s" % (name, key, _short(value)))
    return out


def vllm_metrics_findings(before, after, **thresholds):
    before_facts = None if before is None else _facts(before, "vllm_metrics_findings (before)")
    after_facts = _facts(after, "vllm_metrics_findings (after)")
    return _metrics.findings(before_facts, after_facts, **_thresholds(thresholds, "vllm_metrics_findings"))


def vllm_metrics_kv_error(facts, predicted_tokens):
    parsed = _facts(facts, "vllm_metrics_kv_error")
    if predicted_tokens is not None and (isinstance(predicted_tokens, bool) or not _is_number(predicted_tokens)):
        raise AnsibleFilterError(
            "vllm_metrics_kv_error: predicted_tokens must be a number, got %s" % _short(predicted_tokens)
        )
    return _metrics.kv_prediction_error(predicted_tokens, parsed)


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
    return _verdict.unit_verdict(str(show_output), str(unit), int(max_restarts))


def vllm_report_fragment(data, host, kind):
    _need_lib("vllm_report_fragment")
    try:
        return _report.fragment(str(host) if isinstance(host, str) else host, kind, data)
    except ValueError as exc:
        raise AnsibleFilterError("vllm_report_fragment: %s" % exc)


def vllm_report_fragment_name(frag):
    _need_lib("vllm_report_fragment_name")
    if not isinstance(frag, Mapping) or not {"host", "kind", "recorded_at"} <= set(frag):
        raise AnsibleFilterError(
            "vllm_report_fragment_name expects the output of vllm_report_fragment, got %s" % _short(frag)
        )
    return _report.fragment_name(frag)


def vllm_report_merge(fragments, run_id=None, meta=None):
    _need_lib("vllm_report_merge")
    if isinstance(fragments, (str, Mapping)) or not hasattr(fragments, "__iter__"):
        raise AnsibleFilterError("vllm_report_merge expects a list of fragments, got %s" % _short(fragments))
    frags = list(fragments)
    for item in frags:
        if not isinstance(item, Mapping) or not {"host", "kind", "data"} <= set(item):
            raise AnsibleFilterError("vllm_report_merge: not a report fragment: %s" % _short(item))
    return _report.merge(frags, run_id=run_id, meta=dict(meta or {}))


def vllm_report_markdown(report):
    _need_lib("vllm_report_markdown")
    if not isinstance(report, Mapping) or "hosts" not in report:
        raise AnsibleFilterError(
            "vllm_report_markdown expects the output of vllm_report_merge, got %s" % _short(report)
        )
    return _report.render_markdown(report)


class FilterModule:
    """vLLM /metrics verification and rollout report filters."""

    def filters(self):
        return {
            "vllm_metrics_facts": vllm_metrics_facts,
            "vllm_metrics_required": vllm_metrics_required,
            "vllm_metrics_check": vllm_metrics_check,
            "vllm_metrics_readback": vllm_metrics_readback,
            "vllm_metrics_findings": vllm_metrics_findings,
            "vllm_metrics_kv_error": vllm_metrics_kv_error,
            "vllm_verify_result": vllm_verify_result,
            "vllm_verify_unit_verdict": vllm_verify_unit_verdict,
            "vllm_report_fragment": vllm_report_fragment,
            "vllm_report_fragment_name": vllm_report_fragment_name,
            "vllm_report_merge": vllm_report_merge,
            "vllm_report_markdown": vllm_report_markdown,
        }
