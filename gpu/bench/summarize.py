#!/usr/bin/env python3
"""Fold the GPU benchmark's results into RESULTS/summary.json and print the tables of docs/gpu-results.md.

    gpu/bench/summarize.py --results results/gpu/DATE-NAME [--plan RESULTS/experiments.json]

Reads every results-roundN.json (and the server logs inside raw-roundN.tar.gz) that the harness wrote
(a row's "round" is the round that measured it), and compares them with the plan (experiments.json: the
planner's predictions made when the experiments were written) and with the planner run again now on the
budget vLLM really had:
vLLM takes gpu_memory_utilization of CUDA's total memory, which on the H200 is 143,156 MiB
(torch.cuda.mem_get_info), 615 MiB less than the 143,771 MiB nvidia-smi shows and the emulation
formula uses; "planner, vLLM's budget" feeds the planner that total, so it isolates the memory model.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(HERE))

import harness  # noqa: E402
from vllm_fleet import planner, tune  # noqa: E402

MIB = 1 << 20
# What a matrix-vector pass over 15 GB of bf16 weights reached on the H200 host: 3.9 TB/s effective; the
# datasheet's 4.8 TB/s is what the planner uses.
H200_EFFECTIVE_GB_S = 3900


def load_results(folder: Path) -> list[dict]:
    out = []
    for path in sorted(folder.glob("results-round*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        logs = {}
        raw = path.with_name(path.name.replace("results-", "raw-").replace(".json", ".tar.gz"))
        if raw.exists():
            with tarfile.open(raw) as tar:
                for member in tar.getmembers():
                    if member.name.endswith("/server.log"):
                        # round1/NAME/server.log, and round1/NAME/warm-restart/server.log for its warm restart
                        key = "/".join(member.name.split("/")[1:-1])
                        logs[key] = tar.extractfile(member).read().decode("utf-8", "replace")
        for exp in data["experiments"]:
            exp["_round"] = data["round"]
            exp["_log"] = logs.get(exp["name"], "")
            if exp.get("warm_restart"):
                exp["warm_restart"]["_log"] = logs.get(exp["name"] + "/warm-restart", "")
            exp["_environment"] = data.get("environment") or {}
            exp["_jit_cache"] = data.get("jit_cache")
        out.extend(data["experiments"])
    return out


def cuda_total_mib(environment: dict) -> int | None:
    """torch's total memory of the device (the harness records `torch name total free`)."""
    match = re.search(r"(\d{9,})\s+\d{9,}\s*$", environment.get("torch") or "")
    return int(match.group(1)) // MIB if match else None


def vllm_total_mib(rec: dict, exp_plan: dict) -> int:
    """The memory vLLM took its budget from: CUDA's total as the harness recorded it, else on an H200 the
    143,156 MiB measured there, else the host's nvidia-smi memory."""
    host = exp_plan["host_gpu"]
    return cuda_total_mib(rec["_environment"]) or (143156 if host["name"] == "H200" else host["memory_mib"])


def _plan_on(exp_plan: dict, gpu: dict, utilization: float) -> dict:
    """The planner for the experiment's settings (the settings the plan resolved when it was made; plans of runs 1
    and 2: the profile by name) on `gpu` at `utilization`."""
    if "settings" in exp_plan:
        name, overrides = None, dict(exp_plan["settings"])
    else:
        name, overrides = exp_plan["profile"], dict(exp_plan["overrides"])
    overrides["gpu_memory_utilization"] = utilization
    hostvars = {
        "vllm_profile_name": name,
        "vllm_profile": overrides,
        "vllm_gpu": gpu,
        "vllm_version": exp_plan.get("vllm_version", "0.26.0"),
    }
    return planner.plan_host(exp_plan["name"], hostvars)


def plan_for_card(exp_plan: dict, plan: dict) -> dict:
    """The planner on the card the experiment stands for, at the utilization its profile gives that card: the plan an
    inventory makes (exp_plan["planner"] holds the first start's; this one also the warm restart's)."""
    return _plan_on(exp_plan, dict(plan["cards"][exp_plan["card"]], count=1), exp_plan["utilization"])


def replan(exp_plan: dict, memory_mib: int) -> dict:
    """The planner on the host with the memory vLLM saw and the emulated utilization."""
    return _plan_on(exp_plan, dict(exp_plan["host_gpu"], memory_mib=memory_mib), exp_plan["emulated_utilization"])


def pct(predicted: float | None, actual: float | None) -> float | None:
    if predicted is None or not actual:
        return None
    return round((predicted - actual) / actual * 100, 2)


def compile_cache(log: str) -> str | None:
    """Whether a start compiled vLLM's torch.compile graphs ("cold") or loaded them from the compile cache
    that an earlier start with the same arguments wrote ("warm"); None when it got to neither."""
    if "Directly load the compiled graph" in log:
        return "warm"
    return "cold" if "Compiling a graph for compile range" in log else None


def graph_captures(log: str) -> list[int]:
    """The seconds each CUDA graph capture of a start took (vLLM's start-up log): a few seconds when the
    driver's JIT cache held the kernels, minutes when the driver compiled them."""
    return [int(s) for s in re.findall(r"Graph capturing finished in (\d+) secs", log)]


def jit_cache(results: list[dict]) -> list[dict]:
    """Per round, the driver's JIT cache the harness unpacked before the round's first start (runs from 5 on)."""
    rounds = {rec["_round"]: rec["_jit_cache"] for rec in results if rec.get("_jit_cache")}
    return [dict(round=n, **rounds[n]) for n in sorted(rounds)]


def engine_kv(rec: dict) -> tuple[int | None, str | None]:
    """The KV tokens a start sized and where they come from: the running engine's cache_config_info, else
    the start-up log (a start that never answered /health may still have sized its cache)."""
    cache = rec.get("cache_config") or {}
    if cache.get("kv_cache_size_tokens"):
        return int(cache["kv_cache_size_tokens"]), "cache_config_info"
    memory = harness.parse_memory_lines(rec.get("_log", "").splitlines())
    return (int(memory["kv_tokens"]), "start-up log") if "kv_tokens" in memory else (None, None)


def _gpu_host(action: dict) -> dict:
    """The report entry of the benchmark's one instance: keyed "gpu-host/<instance>" (or "gpu-host" in runs
    before reports were kept per instance)."""
    hosts = (action.get("report") or {}).get("hosts") or {}
    return next((entry for key, entry in sorted(hosts.items()) if key.split("/")[0] == "gpu-host"), {})


def summarise(plan: dict, results: list[dict]) -> dict:
    by_name = {e["name"]: e for e in plan["experiments"]}
    latest: dict[str, dict] = {}
    superseded: list[dict] = []
    for rec in results:  # a later round's record of the same experiment wins, unless it was skipped
        if rec["status"] != "skipped" or rec["name"] not in latest:
            if rec["name"] in latest and engine_kv(latest[rec["name"]])[0] is not None:
                superseded.append(latest[rec["name"]])  # it served, or at least sized its cache
            latest[rec["name"]] = rec
    fidelity, refusals, verification, loads, single, not_run = [], [], [], [], [], []
    for name, rec in latest.items():
        exp = dict(by_name[name], vllm_version=plan["vllm_version"], host_gpu=plan["host_gpu"])
        actual, source = engine_kv(rec)
        if rec["status"] in ("skipped", "start-timeout") and actual is None:  # never served: say so
            not_run.append({"experiment": name, "action": "start", "reason": rec.get("reason")})
            continue
        if rec["status"] == "refused" and actual is None:
            refusals.append(
                {
                    "experiment": name,
                    "profile": exp["profile"],
                    "card": exp["card"],
                    "round": rec["_round"],
                    "vllm_said": rec.get("reason"),
                    "expected": rec.get("expected"),
                    "planner_errors_now": replan(exp, vllm_total_mib(rec, exp))["errors"],
                }
            )
            continue
        if actual is None:
            continue
        # The planner predicts a first start. A restart that finds vLLM's compile cache profiles a smaller
        # activation peak and sizes a larger cache (runs 4 and 6); when an earlier start of the same
        # experiment compiled, fidelity is judged on that one and the warm restart is shown beside it.
        basis, warm = rec, None
        if compile_cache(rec.get("_log", "")) == "warm":
            cold = [r for r in superseded if r["name"] == name and compile_cache(r.get("_log", "")) == "cold"]
            if cold:
                basis, warm = cold[-1], rec
                actual, source = engine_kv(basis)
        memory = harness.parse_memory_lines(basis.get("_log", "").splitlines())
        cache = basis.get("cache_config") or {}
        total = vllm_total_mib(rec, exp)
        now = replan(exp, total)
        card_plan = exp["planner"]["kv_cache_tokens"]
        row = {
            "experiment": name,
            "profile": exp["profile"] or "vLLM defaults",
            "card": exp["card"],
            "round": basis["_round"],
            "status": basis["status"],
            "start_s": basis.get("start_s"),
            "engine_kv_tokens": actual,
            "engine_source": source,
            "num_gpu_blocks": int(cache["num_gpu_blocks"]) if cache.get("num_gpu_blocks") else None,
            "compile_cache": compile_cache(basis.get("_log", "")),
            "graph_capture_s": graph_captures(basis.get("_log", "")),
            "jit_cache_mib": basis.get("jit_cache_mib"),
            "planner_card_tokens": card_plan,
            "error_card_pct": pct(card_plan, actual),
            "planner_budget_tokens": now["capacity"]["kv_cache_tokens"],
            "error_budget_pct": pct(now["capacity"]["kv_cache_tokens"], actual),
            "vllm_budget_gib": round(total * MIB * exp["emulated_utilization"] / (1 << 30), 3),
            "planner_card_budget_gib": round(
                plan["cards"][exp["card"]]["memory_mib"] * MIB * exp["utilization"] / (1 << 30), 3
            ),
            "memory": memory,
            "planner_terms_gib": {
                "weights": round(
                    (exp["planner"]["weights_bytes"] + exp["planner"]["draft_weights_bytes"]) / (1 << 30), 3
                ),
                "activation": round(exp["planner"]["estimates"]["activation_peak_bytes"] / (1 << 30), 3),
                "runtime": round(exp["planner"]["estimates"]["runtime_reserve_bytes"] / (1 << 30), 3),
            },
            "note": basis.get("reason") if basis["status"] != "ran" else None,
        }
        restarted = rec.get("warm_restart") or {}
        if not warm and restarted.get("status") == "ran":  # the harness's own warm restart (plan.py --warm-restart)
            warm_kv = int((restarted.get("cache_config") or {}).get("kv_cache_size_tokens") or 0) or None
            card_warm = plan_for_card(exp, plan)["capacity"]["kv_cache_tokens_warm"]
            budget_warm = now["capacity"]["kv_cache_tokens_warm"]
            row["warm_restart"] = {
                "round": rec["_round"],
                "start_s": restarted.get("start_s"),
                "engine_kv_tokens": warm_kv,
                "compile_cache": compile_cache(restarted.get("_log", "")),
                "activation_gib": (restarted.get("memory") or {}).get("usage_activation_gib"),
                "error_card_pct": pct(
                    card_plan_tokens := plan_for_card(exp, plan)["capacity"]["kv_cache_tokens"], warm_kv
                ),
                "planner_card_first_tokens": card_plan_tokens,
                "planner_card_warm_tokens": card_warm,
                "error_card_warm_pct": pct(card_warm, warm_kv),
                "planner_budget_warm_tokens": budget_warm,
                "error_budget_warm_pct": pct(budget_warm, warm_kv),
                "graph_capture_s": graph_captures(restarted.get("_log", "")),
            }
        if warm:
            warm_kv = engine_kv(warm)[0]
            row["warm_restart"] = {
                "round": warm["_round"],
                "start_s": warm.get("start_s"),
                "engine_kv_tokens": warm_kv,
                "error_card_pct": pct(card_plan, warm_kv),
                "graph_capture_s": graph_captures(warm.get("_log", "")),
                "jit_cache_mib": warm.get("jit_cache_mib"),
            }
        fidelity.append(row)
        for action in rec.get("actions") or []:
            if action.get("status") == "skipped":  # did not fit in the round (older records lack "kind")
                not_run.append({"experiment": name, "action": action["name"], "reason": action.get("reason")})
            elif action["kind"] == "ansible" and action["name"].startswith("verify"):
                report = _gpu_host(action)
                verification.append(
                    {
                        "experiment": name,
                        "action": action["name"],
                        "expect": action["expect"],
                        "returncode": action["returncode"],
                        "as_expected": action["as_expected"],
                        "errors": report.get("errors"),
                        "readback": (report.get("profile") or {}).get("readback"),
                        "speculative_families": (report.get("profile") or {}).get("speculative"),
                        "families": (report.get("metrics") or {}).get("families"),
                        "missing": (report.get("metrics") or {}).get("missing"),
                        "smoke": {
                            k: (report.get("smoke") or {}).get(k) for k in ("status", "completion_tokens", "latency_s")
                        },
                        "findings": [f.get("message") for f in report.get("findings") or []],
                    }
                )
            elif action["kind"] == "ansible":
                event = _gpu_host(action).get("events", {})
                loads.append(
                    {
                        "experiment": name,
                        "action": action["name"],
                        "returncode": action["returncode"],
                        "benchmark": (event.get("benchmark") or [{}])[0],
                    }
                )
            elif action["kind"] in ("bench", "fleet") and action.get("result"):
                result = dict(action["result"])
                entry = {
                    "experiment": name,
                    "profile": row["profile"],
                    "card": exp["card"],
                    "load": action["name"],
                    "tool": "vllm bench serve" if action["kind"] == "bench" else "vllm_fleet.bench",
                    "preemptions": action.get("preemptions"),
                    **result,
                }
                # single stream: vllm bench's 1000 / mean TPOT, or vllm_fleet.bench's 1000 / mean ITL
                if action["kind"] == "bench" and action["name"] == "single-stream":
                    tpot = result.get("mean_tpot_ms")
                    single.append(_single(entry, exp, round(1000.0 / tpot, 1) if tpot else None))
                elif action["kind"] == "fleet" and result.get("single_tokens_per_s"):
                    single.append(
                        _single(dict(entry, load="single-stream"), exp, round(result["single_tokens_per_s"], 1))
                    )
                if action["name"] != "single-stream":
                    loads.append(entry)
    out = {
        "date": plan["date"],
        "vllm_version": plan["vllm_version"],
        "fidelity": fidelity,
        "refusals": refusals,
        "verification": verification,
        "loads": loads,
        "single_stream": single,
        "not_run": not_run,
        "comparisons": compare(plan, loads, not_run),
        "repeats": [_repeat(rec) for rec in superseded],
        "jit_cache": jit_cache(results),
    }
    beside = side_by_side(plan, loads, latest)
    if beside:  # runs from 7 on, whose defaults ran as rN-default-*: summaries of earlier runs stay as they were
        out["side_by_side"] = beside
    searched = tune_search(plan, results)  # every round's loads of a setting, pooled
    if searched:
        out["tune"] = searched
    return out


def tune_search(plan: dict, results: list[dict]) -> dict | None:
    """A tune search's plan (plan.py --tune): each candidate's loads aggregated (vllm_fleet.tune: medians, spreads and
    every repeat), the Pareto front, the pick at the tuning reference's targets for the card, and every candidate
    figure by figure against vLLM's defaults (the exact Mann-Whitney U test over the repeats). Every round's record of
    an experiment counts: its loads from all the rounds it ran in, in the rounds' order, are the repeats of that
    setting (an interleaved search restarts each setting for each of its loads; an earlier plan's setting that a
    later round ran again adds its loads). A failed request in any repeat makes a candidate unfit."""
    spec = plan.get("tune")
    if not spec:
        return None
    runs_of: dict[str, list[dict]] = {}
    for name in (spec["defaults"], *spec["candidates"]):
        runs_of[tune.DEFAULTS if name == spec["defaults"] else name] = [
            tune.run_of(action["result"], action.get("preemptions"), action.get("prefix_cache"))
            for rec in results
            if rec.get("name") == name
            for action in rec.get("actions") or []
            if action.get("kind") == "bench" and (action.get("result") or {}).get("completed")
        ]
    card = plan["cards"][spec["card"]]
    return tune.search(
        spec["profile"], spec["card"], spec["load"], runs_of, tune.targets(None, card), spec.get("refused")
    )


class NothingToTake(ValueError):
    """A search whose decision gives no setting to take: the message says why."""


def measured_profile(plan: dict, summary: dict, environments: list[dict], name: str) -> dict:
    """The measured profile (vllm_fleet.tune.measured_profile: what the inventory takes as vllm_profile_measured) of a
    tune search's results: the chosen candidate's settings over the profile searched (vLLM's defaults as the knobs
    their experiment set), with the provenance of the run (the card emulated, the host's driver, the release, the
    model, the load, the date) and every candidate's figures."""
    search, spec = summary.get("tune"), plan.get("tune")
    if not search or not spec:
        raise NothingToTake("these results hold no tune search (plan.py --tune writes one)")
    decision = search.get("decision") or {}
    choice = decision.get("choice")
    if choice is None:
        raise NothingToTake(
            "the search chose no setting (%s): there is nothing measured to take, and the shipped profile %s stays"
            % (decision.get("verdict") or "no decision", spec["profile"])
        )
    experiments = {e["name"]: e for e in plan["experiments"]}
    if choice == tune.DEFAULTS:
        ran = experiments[spec["defaults"]]
        settings = {k: v for k, v in (ran.get("overrides") or {}).items() if k in tune.KNOBS}
    else:
        ran = experiments[choice]
        settings = dict(spec["candidates"][choice]["settings"])
    drivers = sorted(
        {
            (env.get("nvidia_smi") or "").split(", ")[3]
            for env in environments
            if len((env.get("nvidia_smi") or "").split(", ")) > 3
        }
    )
    provenance = {
        "card": "%s (emulated on an %s)" % (spec["card"], (plan.get("host_gpu") or {}).get("name", "H200"))
        if plan.get("host_gpu")
        else spec["card"],
        "driver": ", ".join(drivers),
        "vllm_version": summary.get("vllm_version"),
        "model": ran["settings"].get("model"),
        "load": spec["load"],
        "date": summary.get("date"),
    }
    return tune.measured_profile(name, spec["profile"], settings, decision, search["measured"], provenance)


# The five figures of issue #23 (lower is better except throughput) and whether a row may be higher.
FIGURES = (
    ("median_ttft_ms", "median TTFT"),
    ("p99_ttft_ms", "p99 TTFT"),
    ("mean_itl_ms", "mean ITL"),
    ("p99_itl_ms", "p99 ITL"),
    ("output_throughput", "output throughput"),
)


def side_by_side(plan: dict, loads: list[dict], records: dict[str, dict]) -> list[dict]:
    """Every configuration of a run against vLLM's defaults for the same card and model, on the same load and with
    the same tool, measured in that run (defaults named rN-default-*): the five figures of issue #23 (median and
    p99 TTFT, mean and p99 inter-token latency, output throughput) and the preemptions, which of them are worse
    than the defaults' ("gives_up"), and where vllm bench serve's per-request detail says the TTFT comes from
    (the first wave of simultaneous requests against the later ones) and how many inter-token gaps were stalled."""
    exps = {e["name"]: e for e in plan["experiments"]}
    detail = {}
    for name, rec in records.items():
        for action in rec.get("actions") or []:
            if action.get("detail"):
                d = action["detail"]
                detail[(name, action["name"])] = {
                    k: d.get(k)
                    for k in (
                        "first_wave",
                        "later",
                        "itl_gaps",
                        "itl_stalled_pct",
                        "itl_stalled_median_ms",
                        "itl_p999_ms",
                    )
                }
    key = lambda r: (r["card"], (exps.get(r["experiment"]) or {}).get("model"), r["load"], r["tool"])  # noqa: E731
    defaults = {key(r): r for r in loads if re.match(r"r\d+-default-", r["experiment"])}
    if not defaults:
        return []
    out = []
    for r in loads:
        base = defaults.get(key(r))
        if not base or not str(r["load"]).startswith("guide-"):
            continue
        row = {
            "card": r["card"],
            "model": exps[r["experiment"]]["model"],
            "load": r["load"],
            "tool": r["tool"],
            "experiment": r["experiment"],
            "defaults": base["experiment"],
            "is_defaults": r is base,
            "preemptions": r.get("preemptions"),
            "kv_cache_tokens": int(
                (records[r["experiment"]].get("cache_config") or {}).get("kv_cache_size_tokens") or 0
            )
            or None,
            "start_s": records[r["experiment"]].get("start_s"),
            **{k: r.get(k) for k, _ in FIGURES},
        }
        if r is not base:
            worse = [label for k, label in FIGURES if (r[k] < base[k] if k == "output_throughput" else r[k] > base[k])]
            if r.get("preemptions"):
                worse.append("preemptions")
            row["change_pct"] = {k: round((r[k] - base[k]) / base[k] * 100, 1) for k, _ in FIGURES}
            row["gives_up"] = worse
            row["no_worse_on_all_five"] = not worse
        row["detail"] = detail.get((r["experiment"], r["load"]))
        out.append(row)
    return out


def _repeat(rec: dict) -> dict:
    """An earlier record of an experiment that a later round ran again (served, or sized its cache before its
    start bound ran out): its KV size and reference loads, kept beside the later record that the tables use."""
    loads = [
        dict(
            load=a["name"],
            **{
                k: (a.get("result") or {}).get(k)
                for k in ("completed", "output_throughput", "p99_ttft_ms", "p99_itl_ms")
            },
            preemptions=a.get("preemptions"),
        )
        for a in rec.get("actions") or []
        if a.get("kind") in ("bench", "fleet") and a.get("result")
    ]
    return {
        "experiment": rec["name"],
        "round": rec["_round"],
        "status": rec["status"],
        "start_s": rec.get("start_s"),
        "engine_kv_tokens": engine_kv(rec)[0],
        "compile_cache": compile_cache(rec.get("_log", "")),
        "graph_capture_s": graph_captures(rec.get("_log", "")),
        "jit_cache_mib": rec.get("jit_cache_mib"),
        "loads": loads,
    }


def _single(entry: dict, exp: dict, rate: float | None) -> dict:
    """A single-stream decode rate against the planner's ceiling on the host (its datasheet bandwidth) and, on
    an H200, at the 3.9 TB/s measured there."""
    ceiling = exp["planner"]["decode_ceiling_h200"]  # the host's, whatever the key says
    weights = exp["planner"]["weights_bytes"] + exp["planner"]["draft_weights_bytes"]
    effective = int(H200_EFFECTIVE_GB_S * 1e9 // weights) if exp["host_gpu"]["name"] == "H200" else None
    return dict(
        entry,
        tokens_per_s=rate,
        planner_ceiling_h200=ceiling,
        ratio_pct=round(100 * rate / ceiling, 1) if rate else None,
        effective_ceiling_3_9_tb_s=effective,
        ratio_effective_pct=round(100 * rate / effective, 1) if rate and effective else None,
        planner_ceiling_card=exp["planner"]["decode_ceiling_card"],
    )


def compare(plan: dict, loads: list[dict], not_run: list[dict]) -> list[dict]:
    """Per emulated card: the shipped profile against vLLM's defaults on the tuning reference's load. The
    goal: lower p99 TTFT and p99 inter-token latency, at least the same output throughput, no preemptions."""
    out = []
    for card in plan["cards"]:
        runs = [r for r in loads if r.get("card") == card and str(r.get("load", "")).startswith("guide-")]
        default = next((r for r in runs if r["experiment"].startswith("default-")), None)
        # the shipped profile (fid-) and any candidate for it (cand-), each against the same defaults
        tuned_runs = [r for r in runs if r["experiment"].startswith(("fid-", "cand-"))]
        for tuned in tuned_runs or [None]:
            row: dict = {
                "card": card,
                "tuned": tuned and tuned["experiment"],
                "default": default and default["experiment"],
            }
            if not (tuned and default):
                card_of = {e["name"]: e["card"] for e in plan["experiments"]}
                missing = [n for n in not_run if card_of.get(n["experiment"]) == card]
                row.update(
                    verdict="not compared",
                    why="a load did not run: "
                    + ("; ".join(f"{n['experiment']} {n['action']} ({n['reason']})" for n in missing) or "no record"),
                )
                out.append(row)
                continue
            checks = {
                "p99_ttft_lower": tuned["p99_ttft_ms"] < default["p99_ttft_ms"],
                "p99_itl_lower": tuned["p99_itl_ms"] < default["p99_itl_ms"],
                "throughput_not_lower": tuned["output_throughput"] >= default["output_throughput"],
                "no_preemptions": not tuned.get("preemptions"),
            }
            row.update(
                checks=checks,
                verdict="goal met" if all(checks.values()) else "goal not met",
                p99_ttft_ms=[tuned["p99_ttft_ms"], default["p99_ttft_ms"]],
                p99_itl_ms=[tuned["p99_itl_ms"], default["p99_itl_ms"]],
                output_throughput=[tuned["output_throughput"], default["output_throughput"]],
                preemptions=[tuned.get("preemptions"), default.get("preemptions")],
            )
            out.append(row)
    return out


def _n(value, digits=0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and digits:
        return f"{value:,.{digits}f}"
    return f"{value:,.0f}" if isinstance(value, (int, float)) else str(value)


def _section(title: str, columns: list[str], rows: list[list]) -> list[str]:
    """A Markdown section: a heading, then a table of the given columns and rows (cells as text)."""
    return ["", f"### {title}", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] + [
        "| " + " | ".join(str(cell) for cell in row) + " |" for row in rows
    ]


def _fidelity_row(r: dict) -> list:
    m = r["memory"]
    usage = (
        "/".join(
            _n(m.get(k), 2)
            for k in ("usage_weights_gib", "usage_activation_gib", "usage_non_torch_gib", "usage_cuda_graph_gib")
        )
        if "usage_weights_gib" in m
        else f"{_n(m.get('weights_gib'), 2)} / - / - / - (crashed before)"
    )
    return [
        r["experiment"],
        r["card"],
        f"{_n(r['engine_kv_tokens'])} ({r['engine_source']})",
        _n(r["planner_card_tokens"]),
        f"{r['error_card_pct']:+.1f}%",
        _n(r["planner_budget_tokens"]),
        f"{r['error_budget_pct']:+.1f}%",
        usage,
        _n(r["start_s"], 0),
        _compile_cell(r),
    ]


def _compile_cell(r: dict) -> str:
    warm = r.get("warm_restart")
    cell = r.get("compile_cache") or "-"
    if warm and warm.get("planner_card_warm_tokens"):  # the harness's warm restart, against both predictions
        return cell + (
            f"; warm restart ({warm['compile_cache']}): {_n(warm['engine_kv_tokens'])}, first-start plan "
            f"{warm['error_card_pct']:+.1f}%, warm plan {_n(warm['planner_card_warm_tokens'])} "
            f"{warm['error_card_warm_pct']:+.1f}% (vLLM's budget {warm['error_budget_warm_pct']:+.1f}%)"
        )
    return cell + (
        f"; warm restart (round {warm['round']}): {_n(warm['engine_kv_tokens'])}, {warm['error_card_pct']:+.1f}%"
        if warm
        else ""
    )


def _comparison_row(r: dict) -> list:
    if "checks" not in r:
        return [
            r["card"],
            f"{r['tuned'] or '-'} / {r['default'] or '-'}",
            "-",
            "-",
            "-",
            "-",
            f"{r['verdict']}: {r['why']}",
        ]
    failed = [k for k, ok in r["checks"].items() if not ok]
    return [
        r["card"],
        f"{r['tuned']} / {r['default']}",
        f"{_n(r['p99_ttft_ms'][0], 1)} / {_n(r['p99_ttft_ms'][1], 1)}",
        f"{_n(r['p99_itl_ms'][0], 2)} / {_n(r['p99_itl_ms'][1], 2)}",
        f"{_n(r['output_throughput'][0], 1)} / {_n(r['output_throughput'][1], 1)}",
        f"{_n(r['preemptions'][0])} / {_n(r['preemptions'][1])}",
        r["verdict"] + (f" ({', '.join(failed)})" if failed else ""),
    ]


def tables(summary: dict) -> str:
    out = _section(
        "Planner fidelity",
        [
            "experiment",
            "card",
            "engine KV tokens",
            "planner (card)",
            "error",
            "planner (vLLM's budget)",
            "error",
            "weights / activation / non-torch / CUDA graphs GiB (vLLM)",
            "start s",
            "torch.compile cache",
        ],
        [_fidelity_row(r) for r in summary["fidelity"]],
    )[1:]
    out += _section(
        "Refused at start",
        ["experiment", "what vLLM said", "planner now"],
        [
            [
                r["experiment"],
                re.sub(r"\s+", " ", (r["vllm_said"] or "")).split(" [type=")[0][:260],
                "; ".join(e[:120] for e in r["planner_errors_now"]) or "no error",
            ]
            for r in summary["refusals"]
        ],
    )
    out += _section(
        "Verification",
        ["action", "expected", "rc", "errors", "read-back", "families", "smoke"],
        [
            [
                r["action"],
                r["expect"],
                r["returncode"],
                "; ".join(r["errors"] or []) or "none",
                r["readback"],
                f"{r['families']} (missing {len(r['missing'] or [])})",
                f"{r['smoke']['status']}, {r['smoke']['completion_tokens']} tokens",
            ]
            for r in summary["verification"]
        ],
    )
    out += _section(
        "Loads",
        [
            "experiment",
            "load",
            "completed",
            "output tok/s",
            "TTFT mean / p99 ms",
            "ITL mean / p99 ms",
            "TPOT mean ms",
            "preemptions",
            "ITL p99.9 ms / stalled % (vllm_fleet.bench, from run 4)",
        ],
        [
            [
                r["experiment"],
                r["load"],
                r.get("completed"),
                _n(r.get("output_throughput"), 1),
                f"{_n(r.get('mean_ttft_ms'), 1)} / {_n(r.get('p99_ttft_ms'), 1)}",
                f"{_n(r.get('mean_itl_ms'), 2)} / {_n(r.get('p99_itl_ms'), 2)}",
                _n(r.get("mean_tpot_ms"), 2),
                _n(r.get("preemptions")),
                f"{_n(r.get('p999_itl_ms'), 2)} / {_n(r.get('itl_stalled_pct'), 2)}",
            ]
            for r in summary["loads"]
            if "load" in r
        ],
    )
    out += _section(
        "Single stream",
        [
            "experiment",
            "tok/s",
            "planner ceiling (the host's bandwidth)",
            "ratio",
            "at 3.9 TB/s (measured on an H200)",
            "ratio",
        ],
        [
            [
                r["experiment"],
                r["tokens_per_s"],
                r["planner_ceiling_h200"],
                f"{r['ratio_pct']}%",
                _n(r["effective_ceiling_3_9_tb_s"]),
                f"{r['ratio_effective_pct']}%" if r["ratio_effective_pct"] else "-",
            ]
            for r in summary["single_stream"]
        ],
    )
    out += _section(
        "Shipped profile (fid-) and candidates (cand-) against vLLM's defaults (the tuning reference's load)",
        ["card", "tuned / default", "p99 TTFT ms", "p99 ITL ms", "output tok/s", "preemptions", "verdict"],
        [_comparison_row(r) for r in summary["comparisons"]],
    )
    if summary.get("repeats"):
        out += _section(
            "Earlier starts of an experiment that a later round ran again (loads above: the later one; "
            "fidelity: the first start that compiled)",
            [
                "experiment",
                "round",
                "status",
                "start s",
                "engine KV tokens",
                "torch.compile cache",
                "reference load: output tok/s, p99 TTFT / ITL ms, preemptions",
            ],
            [
                [
                    r["experiment"],
                    r["round"],
                    r["status"],
                    _n(r["start_s"], 0),
                    _n(r["engine_kv_tokens"]),
                    r["compile_cache"] or "-",
                    "; ".join(
                        f"{_n(x['output_throughput'], 1)}, {_n(x['p99_ttft_ms'], 1)} / {_n(x['p99_itl_ms'], 2)}, "
                        f"{_n(x['preemptions'])}"
                        for x in r["loads"]
                    )
                    or "-",
                ]
                for r in summary["repeats"]
            ],
        )
    if summary.get("side_by_side"):
        out += _section(
            "Side by side: each configuration against vLLM's defaults of the same run (issue #23's five figures)",
            [
                "experiment",
                "card",
                "output tok/s",
                "TTFT median / p99 ms",
                "ITL mean / p99 ms",
                "preemptions",
                "KV tokens",
                "start s",
                "first wave / later: TTFT median ms",
                "stalled gaps %",
                "gives up",
            ],
            [
                [
                    r["experiment"],
                    r["card"],
                    _n(r["output_throughput"], 1),
                    f"{_n(r['median_ttft_ms'], 1)} / {_n(r['p99_ttft_ms'], 1)}",
                    f"{_n(r['mean_itl_ms'], 2)} / {_n(r['p99_itl_ms'], 2)}",
                    _n(r["preemptions"]),
                    _n(r["kv_cache_tokens"]),
                    _n(r["start_s"], 1),
                    f"{_n((r['detail'] or {}).get('first_wave', {}).get('median_ttft_ms'), 1)} / "
                    f"{_n((r['detail'] or {}).get('later', {}).get('median_ttft_ms'), 1)}",
                    _n((r["detail"] or {}).get("itl_stalled_pct"), 2),
                    "(the defaults)"
                    if r["is_defaults"]
                    else (", ".join(r["gives_up"]) or "nothing: no worse on all five"),
                ]
                for r in summary["side_by_side"]
            ],
        )
    if summary.get("tune"):
        t = summary["tune"]

        def cell(n: str, f: dict, key: str, digits: int) -> str:
            """The median (lowest-highest) and, for a figure, n repeats and the verdict against the defaults."""
            v = f.get(key)
            if v is None:
                return "-"
            text = f"{_n(v['median'], digits)} ({_n(v['low'], digits)}-{_n(v['high'], digits)})"
            if "values" not in v:  # the prefix cache's hit rate: beside the figures, not tested
                return text
            versus = (t["against_defaults"].get(n) or {}).get(key)
            return f"{text}, n {len(v['values'])}" + (f"; {tune.verdict_text(versus)}" if versus else "")

        decision = t["decision"] or {}
        hit_rates = any("prefix_hit_rate" in f for f in t["measured"].values())
        out += _section(
            f"Tune search: {t['profile']} on the {t['card']} against vLLM's defaults (per figure: the median of the "
            f"repeats (lowest-highest), n repeats; the verdict, the medians' difference and the {tune.TEST} test's "
            f"p-value: better or worse only at p < {tune.SIGNIFICANCE:g}, else level); "
            f"{decision.get('verdict', 'no decision: the defaults were not measured')}",
            [
                "candidate",
                "repeats",
                "output tok/s",
                "TTFT median ms",
                "TTFT p99 ms",
                "ITL mean ms",
                "ITL p99 ms",
                "preemptions",
                *(["prefix cache hits"] if hit_rates else []),
                "failed",
                "front",
                "misses",
            ],
            [
                [
                    n,
                    f["repeats"],
                    cell(n, f, "output_throughput", 1),
                    cell(n, f, "median_ttft_ms", 1),
                    cell(n, f, "p99_ttft_ms", 1),
                    cell(n, f, "mean_itl_ms", 2),
                    cell(n, f, "p99_itl_ms", 2),
                    cell(n, f, "preemptions", 0),
                    *([cell(n, f, "prefix_hit_rate", 3)] if hit_rates else []),
                    f["failed"],
                    "yes" if n in decision.get("front", []) else "no",
                    ", ".join((decision.get("misses") or {}).get(n) or []) or "-",
                ]
                for n, f in t["measured"].items()
            ],
        )
    if summary["not_run"]:
        out += _section(
            "Not run",
            ["experiment", "action", "why"],
            [[n["experiment"], n["action"], n["reason"]] for n in summary["not_run"]],
        )
    return "\n".join(out) + "\n"


class _Indented(yaml.SafeDumper):
    """YAML with lists indented under their key, as the repository's yamllint wants them."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        return super().increase_indent(flow, False)


def _shown(folder: Path) -> str:
    """A results folder as the repository names it (its own path when it lies elsewhere)."""
    try:
        return folder.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return folder.as_posix()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, required=True, help="a folder of results, e.g. results/gpu/DATE-NAME")
    parser.add_argument(
        "--plan",
        type=Path,
        default=None,
        help="the plan the results were run with (default: RESULTS/experiments.json, the copy "
        "kept with them, else gpu/bench/experiments.json)",
    )
    parser.add_argument("--out", type=Path, default=None, help="default: RESULTS/summary.json")
    parser.add_argument(
        "--measured-profile",
        type=Path,
        default=None,
        help="also write the tune search's measured profile here (YAML: what the inventory takes whole as "
        "vllm_profile_measured); refused, with the reason, when the search chose no setting",
    )
    parser.add_argument("--name", default=None, help="the measured profile's name (default: PROFILE-measured-DATE)")
    parser.add_argument(
        "--tune-html",
        type=Path,
        default=None,
        help="also write the tune search as one HTML page here: the decision, the front plotted, every candidate",
    )
    args = parser.parse_args(argv)
    plan_file = args.plan or next(
        p for p in (args.results / "experiments.json", HERE / "experiments.json") if p.exists()
    )
    plan = json.loads(plan_file.read_text(encoding="utf-8"))
    summary = summarise(plan, load_results(args.results))
    (args.out or args.results / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print(tables(summary))
    if args.tune_html:
        if not summary.get("tune"):
            print(
                "no tune page written: these results hold no tune search (plan.py --tune writes one)", file=sys.stderr
            )
            return 1
        from vllm_fleet.report_html import render_tune_html

        title = "Tune search: %s, %s" % (summary["tune"]["profile"], summary.get("date"))
        args.tune_html.write_text(render_tune_html(summary["tune"], title), encoding="utf-8")
        print("tune page written: %s" % args.tune_html)
    if args.measured_profile:
        environments = [
            json.loads(p.read_text()).get("environment") or {} for p in sorted(args.results.glob("results-round*.json"))
        ]
        name = args.name or "%s-measured-%s" % ((plan.get("tune") or {}).get("profile", "profile"), summary.get("date"))
        try:
            doc = measured_profile(plan, summary, environments, name)
        except NothingToTake as exc:
            print("no measured profile written: %s" % exc, file=sys.stderr)
            return 1
        args.measured_profile.write_text(
            "---\n# A measured profile (gpu/bench/summarize.py --measured-profile) of %s.\n# Take it whole with\n"
            "#   vllm_profile_measured:\n"
            "#     \"{{ lookup('ansible.builtin.file', inventory_dir ~ '/PATH') | from_yaml }}\"\n%s"
            % (_shown(args.results), yaml.dump(doc, Dumper=_Indented, sort_keys=False, width=110)),
            encoding="utf-8",
        )
        print("measured profile written: %s" % args.measured_profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
