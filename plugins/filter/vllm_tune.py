# Thin Ansible filters over vllm_fleet.tune: the load of a tune search, its measured runs, the decision, the measured
# profile and its page (playbooks/tune.yml). The candidates are vllm_plan's vllm_tune_candidates (they are planned).
from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

# The library of this checkout, beside the plugin (never another installed copy): every filter plugin loads it so.
_SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")
if _SRC not in sys.path:
    sys.path.insert(0, _SRC)
from vllm_fleet import __version__, bench, inputs, tune


def _mapping(name, value, what):
    if not isinstance(value, Mapping):
        raise AnsibleFilterError(f"{name}: expected {what}, got {type(value).__name__}")
    return inputs.plain(value)


def vllm_tune_load(after, before="", given=None, gpu=None, minimum_requests=50, users=None, profile=None):
    """The load of a search: the site's (the histograms' increase from `before` to `after`, where it holds
    `minimum_requests`), else `given` (the operator's vllm_tune_load: vllm bench serve's dataset arguments), else the
    tuning reference's for the card. For a profile named for shared prefixes (profiles.yml `traffic`), the site's
    lengths or the reference's are sent as prompts that share prefixes (vllm_fleet.tune.site_load,
    shared_prefix_load)."""
    try:
        shared = tune.profile_traffic(profile) == "shared-prefix"
        # Without vllm_tune_users the search runs 8 users (roles/vllm_rollout/tasks/tune.yml).
        found = tune.site_load(
            str(before or ""),
            str(after or ""),
            minimum_requests=int(minimum_requests),
            shared_prefix=shared,
            users=int(users) if users else 8,
        )
        if found is not None:
            found["users"] = int(users) if users else None
            if users:
                found["bench"]["max_concurrency"] = int(users)
            found["errors"] = []
            return found
        if given:
            bench_args = _mapping("vllm_tune_load", given, "a dict of vllm bench serve's dataset arguments")
            return {"source": "given", "users": bench_args.get("max_concurrency"), "bench": bench_args, "errors": []}
        card = inputs.plain(gpu or {})
        return dict(tune.shared_prefix_load(card) if shared else tune.reference_load(card), errors=[])
    except tune.TuneError as exc:
        return {"errors": [str(exc)]}


def vllm_tune_dataset_args(bench_args):
    """vllm bench serve's dataset options of a load (``--dataset-name random --random-input-len 24 ...``), the
    concurrency apart (the search passes it on its own)."""
    bench_args = _mapping("vllm_tune_dataset_args", bench_args, "a dict of vllm bench serve's dataset arguments")
    out = []
    for key, value in bench_args.items():
        if key != "max_concurrency":
            out += ["--" + str(key).replace("_", "-"), str(value)]
    return out


def vllm_tune_run(result_text, before="", after=""):
    """One repeat's figures from vllm bench serve's saved JSON and the /metrics scrapes around the load."""
    try:
        result = json.loads(result_text) if isinstance(result_text, str) else inputs.plain(result_text)
    except json.JSONDecodeError as exc:
        raise AnsibleFilterError(f"vllm_tune_run: vllm bench serve's result is not JSON ({exc.msg})") from None
    if not isinstance(result, Mapping):
        raise AnsibleFilterError("vllm_tune_run: vllm bench serve's result is not a JSON object")
    names = ("vllm:num_preemptions", "vllm:prefix_cache_hits", "vllm:prefix_cache_queries")
    first, last = bench.counters(str(before or ""), names), bench.counters(str(after or ""), names)
    preempted = last.get(names[0])
    preemptions = None if preempted is None else preempted - first.get(names[0], 0.0)
    queries = last.get(names[2], 0.0) - first.get(names[2], 0.0)
    prefix = {"hit_rate": round((last.get(names[1], 0.0) - first.get(names[1], 0.0)) / queries, 4)} if queries else None
    return tune.run_of(result, preemptions, prefix)


def vllm_tune_search(runs, profile, gpu, load, slo=None):
    """The search decided (vllm_fleet.tune.search) at the operator's targets or the tuning reference's."""
    runs = _mapping("vllm_tune_search", runs, "{candidate: [repeat, ...]}")
    gpu = _mapping("vllm_tune_search", gpu or {}, "the host's vllm_gpu")
    try:
        found = tune.search(str(profile), gpu.get("name"), inputs.plain(load), runs, tune.targets(slo or None, gpu))
    except tune.TuneError as exc:
        raise AnsibleFilterError(f"vllm_tune_search: {exc}") from None
    return {**found, "vllm_fleet_version": __version__}


def vllm_tune_profile(search, name, settings, provenance):
    """The measured profile of a decided search (vllm_fleet.tune.measured_profile), or {"errors": [...]} when the
    decision took no setting of the profile's (vLLM's defaults, or nothing meeting the targets)."""
    search = _mapping("vllm_tune_profile", search, "a decided search")
    decision = search.get("decision") or {}
    if not decision.get("choice"):
        return {"errors": [f"no setting measured meets the targets ({decision.get('verdict') or 'no decision'})"]}
    try:
        return tune.measured_profile(
            str(name),
            str(search["profile"]),
            inputs.plain(settings),
            decision,
            search["measured"],
            dict(inputs.plain(provenance), load=search["load"]),
        )
    except tune.TuneError as exc:
        return {"errors": [str(exc)]}


def vllm_tune_page(search, title):
    """The search as one self-contained HTML page (the front plotted, every candidate's figures and verdict)."""
    # matplotlib: loaded only where a page is written. Ansible loads every filter plugin of the folder in each worker
    # process of each task that uses a filter, so an import here costs every such task (about 0.9 s on 2026-12-05).
    from vllm_fleet.report_html import render_tune_html

    return render_tune_html(_mapping("vllm_tune_page", search, "a decided search"), str(title))


# Each filter is documented in plugins/filter/<filter>.yml, which ansible-doc -t filter reads.
class FilterModule:
    """vLLM fleet tune-search filters."""

    def filters(self):
        return {
            "vllm_tune_load": vllm_tune_load,
            "vllm_tune_dataset_args": vllm_tune_dataset_args,
            "vllm_tune_run": vllm_tune_run,
            "vllm_tune_search": vllm_tune_search,
            "vllm_tune_profile": vllm_tune_profile,
            "vllm_tune_page": vllm_tune_page,
        }
