#!/usr/bin/env python3
"""Issue #53 on a CUDA host: the GPU memory LoRA adapters take from vLLM's KV cache, against the planner, and what
serving adapters costs in throughput and time to first token.

    gpu/bench/lora.py plan [--host-gpu NAME,MIB,GB_S] [--out gpu/bench/lora-h100.json]     # on the controller
    bash gpu/bench/run.sh run --plan gpu/bench/lora-h100.json --budget-s 520                # on the host
    gpu/bench/lora.py summarize --results results/gpu/FOLDER [--cuda-total-mib MIB]         # on the controller

The plan is the harness's (gpu/bench/harness.py), three starts one after the other of the shipped profile
`rtx4090-7b-prefill` (Qwen2.5-7B, bf16, random weights) on an RTX 4090's memory budget emulated on the host's card
(plan.py's emulated_utilization, as runs 6 to 14), vLLM 0.26.0's arguments rendered by the project's renderer:

| start | LoRA | loads |
| --- | --- | --- |
| lora-8x64 | --max-loras 8 --max-lora-rank 64, adapters a1..a8 (2.41 GiB of slots: big enough to matter) | none |
| lora-4x16 | --max-loras 4 --max-lora-rank 16, adapters a1..a4 | 0, 1 and 4 adapters in use, twice each |
| base | none | none |

Each start's KV cache (vllm:cache_config_info, the engine's log) is compared with the planner's first-start prediction
for the same card and settings (vllm_lora_adapters, vllm_lora_max_loras, vllm_lora_max_rank: sizing.lora_reserve).
The loads are `vllm bench serve` on random prompts (its `--lora-modules` names the adapters in use, one per request
in turn; "0 adapters" asks for the base model on the same server), in the order 0, 1, 4, 4, 1, 0, each with its own
seed so that no load finds another's prompts in the prefix cache. The adapters are built on the host by
lab/scripts/build-lora-adapter.py (rank 16, random non-zero weights, every linear layer). The LoRA arguments are
written here as the product renders them (vllm_fleet.lora.args: --enable-lora --max-loras --max-lora-rank
--max-cpu-loras --lora-modules with one JSON object per adapter).

Not emulated: Ada's kernels (the host's own attention backend runs; runs 6 to 13 chose FlashAttention 2 for that,
which on Hopper costs a JIT of minutes). Bandwidth and compute are the host's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "src"))
sys.path.insert(0, str(HERE))
import plan as plan_mod  # noqa: E402  (gpu/bench/plan.py)
from vllm_fleet import catalogue, planner, profiles, render  # noqa: E402

DATE = "2026-12-07"
H100 = {"name": "H100", "memory_mib": 81559, "bandwidth_gb_s": 3350, "count": 1}
CARD = plan_mod.CARDS["RTX 4090"]
PROFILE = "rtx4090-7b-prefill"
MODEL = "Qwen/Qwen2.5-7B-Instruct"
ADAPTER_RANK = 16
# The starts, in the order they run: (name, max_loras, max_lora_rank, adapters served), None for no LoRA.
# In the order of what matters most: the two LoRA starts against the planner, the loads, then the start without LoRA
# (measured before on both cards: 117,952 tokens on an H100 in run 14, 118,624 on an H200 in run 4). A round cut short
# by its budget skips what does not fit, and the next round takes it up.
STARTS = [("lora-8x64", (8, 64, 8)), ("lora-4x16", (4, 16, 4)), ("base", None)]
# The loads: random prompts of 512 tokens, answers of 128 (ignore_eos), 96 requests 32 at a time.
LOAD = {"input_len": 512, "output_len": 128, "num_prompts": 96, "max_concurrency": 32}
IN_USE = {0: [], 1: ["a1"], 4: ["a1", "a2", "a3", "a4"]}
# Each repeat in turn, the second reversed (0, 1, 4, 4, 1, 0, then 0, 1, 4 again for a third), so that no count of
# adapters always runs first or last.
ORDER = [0, 1, 4, 4, 1, 0]


def order(repeats: int) -> list[int]:
    return [n for r in range(repeats) for n in (ORDER[:3] if r % 2 == 0 else ORDER[3:])]


ENVIRONMENT = {k: v for k, v in plan_mod.ENVIRONMENT.items() if k != "VLLM_DISABLED_KERNELS"}  # no Ada emulation
HARNESS_ARGS = ["--load-format", "dummy", "--tokenizer", "{tokenizer}", "--host", "127.0.0.1"]


def adapter_names(count: int) -> list[str]:
    return [f"a{i}" for i in range(1, count + 1)]


def lora_args(max_loras: int, max_rank: int, names: list[str], served: str) -> list[str]:
    """vLLM's LoRA arguments as the product renders them (vllm_fleet.lora.args), the paths as placeholders."""
    modules = [
        json.dumps(
            {"base_model_name": served, "name": n, "path": "{adapter:%s}" % n}, sort_keys=True, separators=(",", ":")
        )
        for n in names
    ]
    return [
        "--enable-lora",
        "--max-loras",
        str(max_loras),
        "--max-lora-rank",
        str(max_rank),
        "--max-cpu-loras",
        str(max(len(names), max_loras)),
        "--lora-modules",
        *modules,
    ]


def hostvars(lora: tuple[int, int, int] | None, gpu: dict, utilization: float | None = None) -> dict:
    profile = {} if utilization is None else {"gpu_memory_utilization": utilization}
    out = {
        "vllm_profile_name": PROFILE,
        "vllm_profile": profile,
        "vllm_gpu": gpu,
        "vllm_version": plan_mod.VLLM_VERSION,
        "vllm_typical_prompt_tokens": 1024,
        "vllm_typical_output_tokens": 512,
    }
    if lora:
        max_loras, max_rank, count = lora
        out.update(
            vllm_lora_adapters=[
                {"name": n, "url": f"http://mirror.invalid/adapters/{n}"} for n in adapter_names(count)
            ],
            vllm_lora_max_loras=max_loras,
            vllm_lora_max_rank=max_rank,
        )
    return out


def loads(served: str, repeats: int = 2) -> list[dict]:
    out = []
    sequence = order(repeats)
    for index, in_use in enumerate(sequence):
        repeat = 1 + sequence[:index].count(in_use)
        out.append(
            dict(
                LOAD,
                kind="bench",
                name=f"adapters-{in_use}-r{repeat}",
                lora_modules=IN_USE[in_use],
                seed=100 + index,  # its own prompts: none of them in the prefix cache from a load before
                timeout_s=90,
                est_s=25,
            )
        )
    return out


def build(host: dict = H100, starts: list[str] | None = None, repeats: int = 2) -> dict:
    """The plan: every start of STARTS (or those named in `starts`, in STARTS's order), the loads `repeats` times."""
    settings = profiles.resolve("lora", PROFILE)
    util = settings["gpu_memory_utilization"]
    emulated = plan_mod.emulated_utilization(CARD["memory_mib"], util, host["memory_mib"])
    served = settings.get("served_model_name") or settings["model"]
    rendered = render.render_args(
        dict(settings, gpu_memory_utilization=emulated), plan_mod.VLLM_VERSION, model_path="{model:%s}" % MODEL
    )
    experiments = []
    for name, lora in STARTS:
        if starts is not None and name not in starts:
            continue
        card = planner.plan_host(name, hostvars(lora, CARD))
        args = list(rendered.args)
        actions: list[dict] = []
        if lora:
            args += lora_args(lora[0], lora[1], adapter_names(lora[2]), served)
        if name == "lora-4x16":
            actions = loads(served, repeats)
        experiments.append(
            {
                "name": name,
                "card": CARD["name"],
                "profile": PROFILE,
                "lora": None
                if lora is None
                else dict(zip(("max_loras", "max_lora_rank", "adapters"), lora, strict=True)),
                "model": MODEL,
                "draft": None,
                "served_model_name": served,
                "utilization": util,
                "emulated_utilization": emulated,
                "args": args,
                "planner": {
                    "errors": card["errors"],
                    "kv_cache_tokens": card["capacity"]["kv_cache_tokens"],
                    "kv_cache_bytes": card["capacity"]["kv_cache_bytes"],
                    "kv_bytes_per_token": card["capacity"]["kv_bytes_per_token"],
                    "weights_bytes": card["capacity"]["weights_bytes"],
                    "estimates": card["estimates"],
                    "notes": card["notes"],
                },
                "actions": actions,
                "est_s": 130 + sum(a["est_s"] for a in actions),
                "start_timeout_s": 300,
            }
        )
    return {
        "date": DATE,
        "vllm_version": plan_mod.VLLM_VERSION,
        "host_gpu": host,
        "cards": {CARD["name"]: CARD},
        "port": 8000,
        "environment": ENVIRONMENT,
        "harness_args": HARNESS_ARGS,
        "tokenizer_vocab_size": catalogue.catalogue()[MODEL]["config"]["vocab_size"],
        "models": {MODEL: {"config": catalogue.catalogue()[MODEL]["config"]}},
        "adapters": {n: {"model": MODEL, "rank": ADAPTER_RANK, "seed": i} for i, n in enumerate(adapter_names(8), 1)},
        "load_repeats": repeats,
        "experiments": experiments,
    }


# --- after the run ----------------------------------------------------------------------------------------------------
def summarize(results: Path, cuda_total_mib: int | None = None) -> dict:
    """The KV cache each start sized against the planner (on the card, and on the budget vLLM had: CUDA's total memory
    x the emulated utilization, when given), and the loads' figures by adapters in use (median and range)."""
    plan = json.loads((results / "experiments.json").read_text())
    runs = {}
    for path in sorted(results.glob("results-round*.json")):
        for rec in json.loads(path.read_text()).get("experiments", []):
            runs[rec["name"]] = rec
    starts = []
    for exp in plan["experiments"]:
        rec = runs.get(exp["name"], {})
        engine = rec.get("cache_config", {}).get("kv_cache_size_tokens")
        row = {
            "name": exp["name"],
            "lora": exp["lora"],
            "status": rec.get("status", "not run"),
            "start_s": rec.get("start_s"),
            "engine_kv_tokens": int(engine) if engine else None,
            "engine_memory": rec.get("memory"),
            "planner_card_kv_tokens": exp["planner"]["kv_cache_tokens"],
            "planner_lora_reserve_bytes": exp["planner"]["estimates"].get("lora_reserve_bytes", 0),
        }
        if engine:
            row["error_card_pct"] = round((row["planner_card_kv_tokens"] - int(engine)) / int(engine) * 100, 2)
        if cuda_total_mib:
            lora = exp["lora"]
            gpu = dict(plan["host_gpu"], memory_mib=cuda_total_mib)
            mine = planner.plan_host(
                exp["name"],
                hostvars(
                    None if lora is None else (lora["max_loras"], lora["max_lora_rank"], lora["adapters"]),
                    gpu,
                    exp["emulated_utilization"],
                ),
            )
            row["planner_budget_kv_tokens"] = mine["capacity"]["kv_cache_tokens"]
            if engine:
                row["error_budget_pct"] = round((row["planner_budget_kv_tokens"] - int(engine)) / int(engine) * 100, 2)
        starts.append(row)
    base = next((s for s in starts if s["lora"] is None and s["engine_kv_tokens"]), None)
    if base:
        per_token = plan["experiments"][0]["planner"]["kv_bytes_per_token"]
        for s in starts:
            if s["lora"] and s["engine_kv_tokens"]:
                s["engine_kv_tokens_given_up"] = base["engine_kv_tokens"] - s["engine_kv_tokens"]
                s["engine_kv_bytes_given_up"] = s["engine_kv_tokens_given_up"] * per_token
    figures = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "median_tpot_ms")
    loads = []
    for server in ("lora-4x16",):
        by_use: dict[int, list[dict]] = {}
        for action in runs.get(server, {}).get("actions", []):
            if action.get("result"):
                by_use.setdefault(int(action["name"].split("-")[1]), []).append(action["result"])
        for in_use, results_ in sorted(by_use.items()):
            row = {"server": server, "adapters_in_use": in_use, "repeats": len(results_)}
            for figure in figures:
                values = [r[figure] for r in results_ if r.get(figure) is not None]
                if values:
                    row[figure] = {
                        "median": round(statistics.median(values), 2),
                        "low": round(min(values), 2),
                        "high": round(max(values), 2),
                    }
            loads.append(row)
    return {"starts": starts, "loads": loads}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="write the plan (the harness's format)")
    p.add_argument("--host-gpu", default=None, help='the host card, "NAME,MIB,GB_S" (default: an H100)')
    p.add_argument("--out", type=Path, default=HERE / "lora-h100.json")
    p.add_argument("--starts", default=None, help="only these starts, by name, comma-separated (default: every one)")
    p.add_argument("--repeats", type=int, default=2, help="how many times each count of adapters in use is loaded")
    s = sub.add_parser("summarize", help="the KV caches against the planner and the loads, as JSON")
    s.add_argument("--results", type=Path, required=True, help="the results folder (with the plan as experiments.json)")
    s.add_argument("--cuda-total-mib", type=int, default=None, help="CUDA's total memory of the host card, MiB")
    args = parser.parse_args(argv)
    if args.cmd == "plan":
        host = plan_mod._host_gpu(args.host_gpu) if args.host_gpu else H100
        starts = args.starts.split(",") if args.starts else None
        unknown = sorted(set(starts or []) - {name for name, _ in STARTS})
        if unknown or args.repeats < 1:
            parser.error(f"--starts takes {', '.join(n for n, _ in STARTS)} and --repeats 1 or more; not {unknown}")
        args.out.write_text(json.dumps(build(host, starts, args.repeats), indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")
        return 0
    summary = summarize(args.results, args.cuda_total_mib)
    (args.results / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
