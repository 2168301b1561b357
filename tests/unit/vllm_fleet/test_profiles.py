"""profiles: the shipped profiles, resolution (name + overrides) and every bad input's message."""

import re

import pytest

from conftest import ROOT
from vllm_fleet import catalogue, profiles

GUIDE_PROFILES = {
    "rtx4090-7b-decode",
    "rtx4090-7b-prefill",
    "rtx4090-7b-awq",
    "rtx4090-7b-prefix-heavy",
    "l40-14b-decode",
    "l40-14b-awq-prefill",
}


def test_every_reference_configuration_of_the_guide_is_shipped():
    assert GUIDE_PROFILES | {"cpu-lab-tiny"} <= set(profiles.names())


@pytest.mark.parametrize("name", profiles.names())
def test_shipped_profiles_are_valid_and_documented(name):
    entry = profiles.shipped()[name]
    assert entry["description"] and entry["guide"]
    assert profiles.validate(name, profiles.resolve(name, name)) == []
    settings = entry["settings"]
    assert settings["model"] in catalogue.catalogue()
    if "speculative" in settings and "model" in settings["speculative"]:
        assert settings["speculative"]["model"] in catalogue.catalogue()


def test_guide_values_are_encoded_as_the_guide_gives_them():
    decode = profiles.resolve("h", "rtx4090-7b-decode")
    assert decode == {
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "dtype": "bfloat16",
        "gpu_memory_utilization": 0.92,
        "max_model_len": 8192,
        "max_num_seqs": 64,
        "max_num_batched_tokens": 8192,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": True,
        "kv_cache_dtype": "fp8",
        "calculate_kv_scales": True,
        "swap_space": 0,
        "speculative": {
            "model": "Qwen/Qwen2.5-0.5B-Instruct",
            "num_speculative_tokens": 5,
            "draft_tensor_parallel_size": 1,
            "use_heterogeneous_vocab": True,
        },
    }
    l40 = profiles.resolve("h", "l40-14b-decode")
    assert (l40["gpu_memory_utilization"], l40["max_model_len"], l40["max_num_seqs"]) == (0.90, 16384, 128)
    assert l40["speculative"] == {
        "model": "Qwen/Qwen2.5-1.5B-Instruct",
        "num_speculative_tokens": 5,
        "use_heterogeneous_vocab": True,
    }
    awq = profiles.resolve("h", "rtx4090-7b-awq")
    assert (awq["model"], awq["quantization"], awq["gpu_memory_utilization"]) == (
        "Qwen/Qwen2.5-7B-Instruct-AWQ",
        "awq",
        0.94,
    )
    assert profiles.resolve("h", "rtx4090-7b-prefix-heavy")["max_num_batched_tokens"] == 4096
    assert "swap_space" not in profiles.resolve("h", "rtx4090-7b-prefill")
    assert profiles.resolve("h", "l40-14b-awq-prefill")["model"] == "Qwen/Qwen2.5-14B-Instruct-AWQ"


def test_overrides_merge_key_by_key_and_null_removes():
    profile = profiles.resolve(
        "h", "rtx4090-7b-decode", {"max_num_seqs": 32, "speculative": {"num_speculative_tokens": 3}, "swap_space": None}
    )
    assert profile["max_num_seqs"] == 32
    assert profile["speculative"] == {
        "model": "Qwen/Qwen2.5-0.5B-Instruct",
        "num_speculative_tokens": 3,
        "draft_tensor_parallel_size": 1,
        "use_heterogeneous_vocab": True,
    }
    assert "swap_space" not in profile
    assert "speculative" not in profiles.resolve("h", "rtx4090-7b-decode", {"speculative": None})


def test_resolve_does_not_change_the_shipped_profile():
    profiles.resolve("h", "rtx4090-7b-decode", {"speculative": {"num_speculative_tokens": 2}})
    assert profiles.resolve("h", "rtx4090-7b-decode")["speculative"]["num_speculative_tokens"] == 5


def test_custom_profile_without_a_name():
    assert profiles.resolve("h", "", {"model": "m"}) == {"model": "m"}
    assert profiles.validate("h", {"model": "m"}) == []


@pytest.mark.parametrize(
    "name,overrides,message",
    [
        (
            "rtx4090-7b-decoded",
            None,
            "h1: vllm_profile_name='rtx4090-7b-decoded' is not a shipped profile; fix: use one of cpu-lab-tiny",
        ),
        (
            "rtx4090-7b-decode",
            ["max_num_seqs", 32],
            "h1: vllm_profile=['max_num_seqs', 32] is a list, not a dict; fix: give vllm_profile as a mapping",
        ),
    ],
)
def test_resolve_errors(name, overrides, message):
    with pytest.raises(profiles.ProfileError, match=re.escape(message)):
        profiles.resolve("h1", name, overrides)


# (overrides of rtx4090-7b-decode, the message expected): each names host, key, value and fix.
BAD_INPUTS = [
    ({"max_num_seq": 32}, "h1: unknown profile key max_num_seq=32; fix: remove it, or use one of model, "),
    (
        {"max_num_seqs": "64"},
        "h1: max_num_seqs='64' must be an integer (requests scheduled at once); fix: set max_num_seqs to an integer",
    ),
    ({"max_model_len": 8192.0}, "h1: max_model_len=8192.0 must be an integer"),
    ({"max_num_seqs": True}, "h1: max_num_seqs=True must be an integer"),
    ({"enable_prefix_caching": "yes"}, "h1: enable_prefix_caching='yes' must be true or false"),
    ({"gpu_memory_utilization": "0.9"}, "h1: gpu_memory_utilization='0.9' must be a number"),
    (
        {"gpu_memory_utilization": 92},
        "h1: gpu_memory_utilization=92 is impossible: it is a share of the GPU's total "
        "memory; fix: use a value in (0, 1]",
    ),
    ({"gpu_memory_utilization": 0}, "h1: gpu_memory_utilization=0 is impossible"),
    ({"max_model_len": 0}, "h1: max_model_len=0 is impossible; fix: use a positive integer"),
    ({"max_num_seqs": -1}, "h1: max_num_seqs=-1 is impossible; fix: use a positive integer"),
    ({"tensor_parallel_size": 0}, "h1: tensor_parallel_size=0 is impossible"),
    ({"swap_space": -4}, "h1: swap_space=-4 is negative; fix: use 0 (no swapping) or GiB > 0"),
    (
        {"kv_cache_dtype": "fp4"},
        "h1: kv_cache_dtype='fp4' is not supported; fix: use one of auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2",
    ),
    ({"dtype": "bf16"}, "h1: dtype='bf16' is not supported; fix: use one of auto, half, float16, bfloat16"),
    ({"quantization": "int4"}, "h1: quantization='int4' is not supported; fix: use one of awq,"),
    ({"model": ""}, "h1: model='' must be a non-empty string"),
    ({"model": None}, "h1: the profile has no model; fix: set vllm_profile_name to a shipped profile"),
    ({"max_num_batched_tokens": 32}, "h1: max_num_batched_tokens=32 is below max_num_seqs=64: vLLM refuses it"),
    (
        {"kv_cache_dtype": "auto"},
        "h1: calculate_kv_scales=true with kv_cache_dtype='auto': scales only exist for "
        "an FP8 KV cache; fix: set kv_cache_dtype: fp8 or drop calculate_kv_scales",
    ),
    ({"speculative": "Qwen/Qwen2.5-0.5B-Instruct"}, "h1: speculative='Qwen/Qwen2.5-0.5B-Instruct' must be a mapping"),
    ({"speculative": {"num_tokens": 5}}, "h1: unknown key speculative.num_tokens=5; fix: use model, method, "),
    ({"speculative": {"num_speculative_tokens": 0}}, "h1: speculative.num_speculative_tokens=0 is outside 1-16"),
    ({"speculative": {"num_speculative_tokens": "5"}}, "h1: speculative.num_speculative_tokens='5' must be an integer"),
    ({"speculative": {"method": "lookahead"}}, "h1: speculative.method='lookahead' is not supported; fix: use one of"),
    (
        {"speculative": {"model": None, "method": "eagle"}},
        "h1: speculative has no model (method='eagle'); fix: set speculative.model",
    ),
    ({"speculative": {"num_speculative_tokens": None}}, "h1: speculative.num_speculative_tokens is missing; fix: "),
    ({"speculative": {"draft_tensor_parallel_size": 0}}, "h1: speculative.draft_tensor_parallel_size=0 is impossible"),
    (
        {"dtype": "bfloat16", "model": "Qwen/Qwen2.5-7B-Instruct-AWQ", "quantization": "awq"},
        "h1: dtype='bfloat16' with quantization='awq': vLLM's awq kernels run in float16; fix: set dtype: auto",
    ),
]


@pytest.mark.parametrize("overrides,message", BAD_INPUTS, ids=[m.split(":")[1][:40] for _, m in BAD_INPUTS])
def test_bad_inputs_name_host_key_value_and_fix(overrides, message):
    errors = profiles.validate("h1", profiles.resolve("h1", "rtx4090-7b-decode", overrides))
    assert any(e.startswith(message) for e in errors), errors
    assert all(e.startswith("h1: ") and "fix:" in e for e in errors)


def test_at_least_fifteen_bad_inputs_are_covered():
    assert len(BAD_INPUTS) >= 15


def test_model_free_speculation_needs_no_model():
    assert profiles.validate("h", profiles.resolve("h", "cpu-lab-tiny-ngram")) == []


def test_measured_numbers_in_the_profiles_are_the_committed_gpu_results():
    """Each shipped GPU profile's `measured` block says what the summary of its run says
    (results/gpu/2026-11-29-run2-ada-emulation/summary.json, or the folder its `results` names), the tuned and
    default loads from the same run; the experiment it names
    (fid-<profile>, or the candidate that ran these settings) ran exactly the shipped settings where the run's
    plan recorded them. A profile's `measured.earlier` (the settings it shipped before: its settings with
    `overrides`) names the experiment of its search that ran those, and the KV cache vLLM sized there."""
    import json

    repo = ROOT
    shipped = profiles._shipped()
    gpu_profiles = [name for name in shipped if "measured" in shipped[name]]
    assert len(gpu_profiles) == 6
    compared = []
    for name in gpu_profiles:
        measured = shipped[name]["measured"]
        folder = repo / measured.get("results", "results/gpu/2026-11-29-run2-ada-emulation")
        summary = json.loads((folder / "summary.json").read_text())
        experiment = measured.get("experiment", f"fid-{name}")
        ran = {e["name"]: e for e in json.loads((folder / "experiments.json").read_text())["experiments"]}[experiment]
        if "settings" in ran:
            assert ran["settings"] == profiles.resolve("h", name), name
        engine = {r["experiment"]: r["engine_kv_tokens"] for r in summary["fidelity"]}
        single = {r["experiment"]: r["tokens_per_s"] for r in summary["single_stream"]}
        loads = {r["experiment"]: r for r in summary["loads"] if "load" in r}
        assert measured["kv_cache_tokens"] == engine[experiment], name
        if "single_stream_tokens_per_s" in measured:
            assert measured["single_stream_tokens_per_s"] == single[experiment], name
        if "guide_load" in measured:
            run = loads[experiment]
            assert measured["guide_load"]["output_tokens_per_s"] == round(run["output_throughput"], 1), name
            assert measured["guide_load"]["p99_ttft_ms"] == round(run["p99_ttft_ms"], 1), name
            assert measured["guide_load"]["p99_itl_ms"] == round(run["p99_itl_ms"], 2), name
            assert measured["guide_load"]["preemptions"] == run["preemptions"] == 0, name
        if "vllm_defaults" in measured:
            (comparison,) = [c for c in summary["comparisons"] if c["tuned"] == experiment]
            run = loads[comparison["default"]]
            defaults = measured["vllm_defaults"]
            assert defaults["output_tokens_per_s"] == round(run["output_throughput"], 1), name
            assert defaults["p99_ttft_ms"] == round(run["p99_ttft_ms"], 1), name
            assert defaults["p99_itl_ms"] == round(run["p99_itl_ms"], 2), name
            assert defaults["preemptions"] == run["preemptions"], name
            compared.append((name, comparison["verdict"]))
        if "earlier" in measured:
            earlier = measured["earlier"]
            folder = repo / earlier["search"]["results"]
            experiment = earlier["search"]["experiment"]
            ran = {e["name"]: e for e in json.loads((folder / "experiments.json").read_text())["experiments"]}
            assert ran[experiment]["settings"] == profiles.resolve("h", name, earlier["overrides"]), name
            assert ran[experiment]["settings"] != profiles.resolve("h", name), name
            engine = {
                r["experiment"]: r["engine_kv_tokens"]
                for r in json.loads((folder / "summary.json").read_text())["fidelity"]
            }
            assert earlier["kv_cache_tokens"] == engine[experiment], name
    assert compared == [("rtx4090-7b-prefill", "goal met")]


FIVE = {
    "output_tokens_per_s": ("output_throughput", 1),
    "median_ttft_ms": ("median_ttft_ms", 1),
    "p99_ttft_ms": ("p99_ttft_ms", 1),
    "mean_itl_ms": ("mean_itl_ms", 2),
    "p99_itl_ms": ("p99_itl_ms", 2),
}


def measured_blocks(key: str):
    """(label, profile, holder, overrides) for each shipped profile whose `measured` has a `key` block: the profile's
    own (holder: `measured`, no overrides), and that of the settings it shipped before, where `measured.earlier` keeps
    them (holder: `measured.earlier`, its `overrides` over the profile's settings make those settings)."""
    for name, entry in profiles._shipped().items():
        measured = entry.get("measured") or {}
        if key in measured:
            yield name, name, measured, {}
        earlier = measured.get("earlier") or {}
        if key in earlier:
            yield f"{name}, earlier", name, earlier, earlier["overrides"]


def test_side_by_side_numbers_in_the_profiles_are_the_committed_gpu_results():
    """A profile's `measured.side_by_side` (issue #23: the five figures against vLLM's defaults of the same run)
    says what the summary's side_by_side rows of its run say, for an experiment that ran exactly the shipped
    settings; every GPU profile without speculation carries one, rtx4090-7b-prefix-heavy for its earlier fp8
    settings only (run 9; measured.earlier, shipped until run 12), which ran with the overrides it names."""
    import json

    carrying = []
    for label, name, holder, overrides in measured_blocks("side_by_side"):
        carrying.append(label)
        block = holder["side_by_side"]
        results = block.get("results", holder.get("results"))
        experiment = block.get("experiment", holder.get("experiment"))
        folder = ROOT / results
        ran = {e["name"]: e for e in json.loads((folder / "experiments.json").read_text())["experiments"]}[experiment]
        assert ran["settings"] == profiles.resolve("h", name, overrides), label
        rows = {r["experiment"]: r for r in json.loads((folder / "summary.json").read_text())["side_by_side"]}
        row, base = rows[experiment], rows[block["vllm_defaults"]["experiment"]]
        assert row["defaults"] == base["experiment"] and base["is_defaults"], label
        for mine, theirs in ((block["this"], row), (block["vllm_defaults"], base)):
            for key, (column, digits) in FIVE.items():
                assert mine[key] == round(theirs[column], digits), (label, key)
            assert mine["preemptions"] == theirs["preemptions"], label
        assert block["gives_up"] == row["gives_up"], label
        load = block["load"]
        assert row["load"] == f"guide-{load['users']}u-bench" and load["tool"] == row["tool"], label
    assert sorted(carrying) == [
        "l40-14b-awq-prefill",
        "rtx4090-7b-awq",
        "rtx4090-7b-prefill",
        "rtx4090-7b-prefix-heavy, earlier",
    ]


def test_a_profiles_search_block_is_its_committed_tune_search():
    """A profile's `measured.search` (issue #34: what the tune search found for it) says what the run's summary.json
    says: the experiment ran exactly the shipped settings, wins and losses are the figures `against_defaults` calls
    better and worse (the exact Mann-Whitney test separates them; with two repeats a side, none), on_front and choice
    are the decision's. The three searched
    profiles carry one; the prefix-heavy one (searched under shared-prefix traffic again in run 13, five repeats a
    side) keeps, in measured.earlier, run 12's verdict on the fp8 settings it shipped until then."""
    import json

    from vllm_fleet import tune

    carrying = []
    for label, name, holder, overrides in measured_blocks("search"):
        carrying.append(label)
        block = holder["search"]
        folder = ROOT / block["results"]
        ran = {e["name"]: e for e in json.loads((folder / "experiments.json").read_text())["experiments"]}
        assert ran[block["experiment"]]["settings"] == profiles.resolve("h", name, overrides), label
        search = json.loads((folder / "summary.json").read_text())["tune"]
        assert search["profile"] == name
        verdicts = search["against_defaults"][block["experiment"]]
        assert block["wins"] == [k for k, _ in tune.FIGURES if verdicts[k]["verdict"] == "better"], label
        assert block["loses"] == [k for k, _ in tune.FIGURES if verdicts[k]["verdict"] == "worse"], label
        assert block["repeats"] == search["measured"][block["experiment"]]["repeats"], label
        assert block["on_front"] == (block["experiment"] in search["decision"]["front"]), label
        assert block["choice"] == search["decision"]["choice"], label
    assert sorted(carrying) == [
        "l40-14b-awq-prefill",
        "rtx4090-7b-prefill",
        "rtx4090-7b-prefix-heavy",
        "rtx4090-7b-prefix-heavy, earlier",
    ]
    # The prefix-heavy profile keeps its settings with the trade-off its five-repeat search separated (run 13):
    # better inter-token latencies for a worse median TTFT; the search's pick is vLLM's defaults, and the profile's
    # trade_off says both.
    heavy = profiles._shipped()["rtx4090-7b-prefix-heavy"]["measured"]
    assert heavy["search"]["repeats"] >= 5 and heavy["search"]["loses"] == ["median_ttft_ms"]
    assert heavy["search"]["choice"] == "vllm-defaults" and "vLLM's defaults are the choice" in heavy["trade_off"]


@pytest.mark.parametrize(
    "key,value",
    [
        ("served_model_name", "a\nb"),
        ("served_model_name", "a\u2028b"),
        ("model", "Qwen/Qwen2.5-7B-Instruct\u0085"),
        ("served_model_name", "\ufeffq"),
        ("served_model_name", "q\u200b"),
    ],
)
def test_a_profile_string_with_a_control_or_format_character_is_refused(key, value):
    """The model and its served name reach the unit's command line: refused at plan time, not when the unit is
    rendered."""
    (message,) = profiles.validate("h1", profiles.resolve("h1", "rtx4090-7b-decode", {key: value}))
    assert message.startswith(f"h1: {key}={value!r}") and "control or format character" in message
    assert f"fix: remove it from vllm_profile.{key}" in message and value not in message


def test_speculative_given_as_a_list_names_the_setting():
    (message,) = profiles.validate(
        "h1", profiles.resolve("h1", "rtx4090-7b-decode", {"speculative": [{"model": "Qwen/Qwen2.5-0.5B-Instruct"}]})
    )
    assert message.startswith("h1: speculative=[{'model': 'Qwen/Qwen2.5-0.5B-Instruct'}] must be a mapping")
    assert "fix: give vllm_profile.speculative as a mapping" in message and "null" in message


def test_a_profile_name_that_is_not_a_string_is_a_profile_error():
    with pytest.raises(profiles.ProfileError, match=re.escape("h1: vllm_profile_name=['a'] is not a shipped profile")):
        profiles.resolve("h1", ["a"])
