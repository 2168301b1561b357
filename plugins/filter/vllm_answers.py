# Thin Ansible filters over vllm_fleet.answers: the answers gate (an instance's answers to a fixed set of prompts,
# held against those recorded with its last verified release).
from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

# The library of this checkout, beside the plugin (never another installed copy): every filter plugin loads it so.
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
from vllm_fleet import __version__
from vllm_fleet import answers as _answers
from vllm_fleet.inputs import plain as _plain
from vllm_fleet.inputs import short as _short


def _measured(name, measured):
    measured = _plain(measured)
    if not isinstance(measured, Mapping) or not isinstance(measured.get("answers"), list):
        error = measured.get("error") if isinstance(measured, Mapping) else None
        raise AnsibleFilterError(f"{name}: the instance's answers could not be measured: {error or _short(measured)}")
    return measured


def vllm_answers_judge(measured, new, limits=None, kind=""):
    measured = _measured("vllm_answers_judge", measured)
    new = _plain(new) or {}
    reference = measured.get("reference")
    if not isinstance(reference, Mapping):
        raise AnsibleFilterError("vllm_answers_judge: no recorded answers to judge against (reference is missing)")
    try:
        change = _answers.change_kind(
            {"release": reference.get("release"), "args": reference.get("args")},
            {"release": new.get("release"), "args": new.get("args")},
        )
        if kind:
            if kind not in _answers.KINDS:
                raise _answers.AnswersError(f"kind={kind!r} is not one of {', '.join(_answers.KINDS)}")
            change = {**change, "kind": kind, "reasons": [*change["reasons"], f"held as {kind} (set by the site)"]}
        comparison = _answers.compare(dict(reference), measured.get("scores") or [])
        verdict = _answers.judge(comparison, change, _plain(limits))
    except (_answers.AnswersError, KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"vllm_answers_judge: {exc}") from exc
    return {
        **verdict,
        "agreement": comparison["agreement"],
        "mean_kl": comparison["mean_kl"],
        "tokens": comparison["tokens"],
        "prompts": comparison["prompts"],
        "changed_args": change.get("changed_args", []),
        "reference": {key: reference.get(key) for key in ("release", "release_id", "recorded_at")},
        "release": new.get("release"),
        "seconds": measured.get("seconds"),
        "vllm_fleet_version": __version__,
    }


def vllm_answers_record(measured, new, release_id="", recorded_at=""):
    measured = _measured("vllm_answers_record", measured)
    new = _plain(new) or {}
    return {
        "schema": _answers.SCHEMA,
        "release": new.get("release"),
        "args": new.get("args"),
        "release_id": release_id,
        "recorded_at": recorded_at,
        "tokens": measured.get("tokens"),
        "top_k": measured.get("top_k"),
        "answers": measured["answers"],
    }


def vllm_answers_markdown(report):
    report = _plain(report)
    if not isinstance(report, Mapping) or "verdict" not in report or "prompts" not in report:
        raise AnsibleFilterError(f"vllm_answers_markdown expects vllm_answers_judge's output, got {_short(report)}")
    return _answers.render_markdown(dict(report))


class FilterModule:
    """The answers gate's filters."""

    def filters(self):
        return {
            "vllm_answers_judge": vllm_answers_judge,
            "vllm_answers_record": vllm_answers_record,
            "vllm_answers_markdown": vllm_answers_markdown,
        }
