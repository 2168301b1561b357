"""vllm_fleet.placement through the planner: a host's cards into instances (one per card or one per tensor-parallel
group), every shipped multi-GPU profile on its host, and the placements the plan refuses before anything changes.

The cards are the nvidia_driver role's detected list where a test gives one (made by hand in the shape of
nvidia_driver_gpus.gpus: the 4 x L40 capture of tests/unit/fixtures/gpu/l40 with device minors, NUMA nodes and
CPU lists as a two-socket host reports them), else vllm_gpu.count cards of the group's assumed kind."""

from __future__ import annotations

import pytest

from conftest import L40, RTX4090
from vllm_fleet import placement, planner, service_levels

GUIDE_LOAD = {"vllm_typical_prompt_tokens": 1024, "vllm_typical_output_tokens": 512}


def plan(profile_name=None, gpu=None, profile=None, **extra):
    values = {
        "vllm_profile_name": profile_name,
        "vllm_profile": profile or {},
        "vllm_gpu": gpu,
        "vllm_version": "0.33.0",
        **GUIDE_LOAD,
        **extra,
    }
    return planner.plan_host("h1", values)


def cards(n, name="NVIDIA L40", memory=46068, numa=(0, 0, 1, 1)):
    """A detected list: real-looking UUIDs, device minors in reverse PCI order, two NUMA nodes."""
    return [
        {
            "index": i,
            "name": name,
            "memory_mib": memory,
            "compute_cap": "8.9",
            "uuid": f"GPU-5f1c9e2a-7b3d-4e8f-9a0b-{i:012x}",
            "minor": n - 1 - i,
            "numa_node": numa[i % len(numa)],
            "cpus": "0-15,64-79" if numa[i % len(numa)] == 0 else "16-31,80-95",
        }
        for i in range(n)
    ]


def detected(n, **kwargs):
    """vllm_gpu as the plan takes it from the driver role's detection (planner.detected_gpu)."""
    return planner.detected_gpu(
        L40,
        {
            "name": "NVIDIA L40",
            "model": "L40",
            "count": n,
            "memory_mib": 46068,
            "compute_cap": "8.9",
            "gpus": cards(n, **kwargs),
        },
    )


# --- the shipped multi-GPU profiles ---------------------------------------------------------------------------


def test_four_l40s_run_one_14b_instance_per_card():
    entry = plan("l40x4-14b-per-gpu", detected(4))
    assert entry["errors"] == [] and entry["tensor_parallel_size"] == 1
    instances = entry["instances"]
    assert [(i["name"], i["port"], i["gpus"], i["unit"]) for i in instances] == [
        ("gpu0", 8000, [0], "vllm@gpu0.service"),
        ("gpu1", 8001, [1], "vllm@gpu1.service"),
        ("gpu2", 8002, [2], "vllm@gpu2.service"),
        ("gpu3", 8003, [3], "vllm@gpu3.service"),
    ]
    # Each sees its own card only, by UUID; its unit may open its own device node (the minor, not the index).
    assert instances[1]["environment"] == {"CUDA_VISIBLE_DEVICES": "GPU-5f1c9e2a-7b3d-4e8f-9a0b-000000000001"}
    assert instances[1]["devices"] == [*placement.CONTROL_DEVICES, "/dev/nvidia2"]
    # Beside its card: the CPUs and memory of its NUMA node.
    assert (instances[0]["numa_node"], instances[0]["cpus"]) == (0, "0-15,64-79")
    assert (instances[3]["numa_node"], instances[3]["cpus"]) == (1, "16-31,80-95")
    for instance in instances:
        args = instance["args"]
        assert args[args.index("--port") + 1] == str(instance["port"])
        assert args[:-2] == instances[0]["args"][:-2]  # the same arguments but the port


def test_two_rtx4090s_run_one_32b_awq_instance_over_both():
    entry = plan("rtx4090x2-32b-awq-tp2", dict(RTX4090, count=2))
    assert entry["errors"] == [] and entry["tensor_parallel_size"] == 2
    (instance,) = entry["instances"]
    assert (instance["name"], instance["gpus"], instance["port"]) == ("tp0-1", [0, 1], 8000)
    assert "--tensor-parallel-size" in instance["args"]
    assert instance["args"][instance["args"].index("--tensor-parallel-size") + 1] == "2"
    # GeForce cards have no P2P: NCCL's transport is turned off, and the plan says why. No UUIDs known (an assumed
    # card): the cards by index, in nvidia-smi's (PCI) order.
    assert instance["environment"] == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NCCL_P2P_DISABLE": "1",
    }
    assert any("NCCL_P2P_DISABLE=1" in note for note in entry["notes"])
    assert instance["devices"][-2:] == ["/dev/nvidia0", "/dev/nvidia1"]


@pytest.mark.parametrize(
    "name, gpu, instances",
    [
        ("l40x4-14b-per-gpu", dict(L40, count=4), 4),
        ("rtx4090x2-32b-awq-tp2", dict(RTX4090, count=2), 1),
    ],
)
def test_the_multi_gpu_profiles_carry_the_planners_numbers_and_derived_batching(name, gpu, instances):
    """Not run on real GPUs: what the profile says it expects is the plan's, and its scheduler settings are
    service_levels.derived_batching of the plan's KV cache at the reference's load (a fixed point)."""
    shipped = planner.profiles.shipped()[name]
    entry = plan(name, gpu)
    assert entry["errors"] == [] and entry["warnings"] == [] and len(entry["instances"]) == instances
    planned = shipped["planned"]
    assert "not run on real GPUs" in planned["note"]
    assert entry["capacity"]["kv_cache_tokens"] == planned["kv_cache_tokens"]
    assert entry["service_levels"]["ttft_ms"] == planned["estimated_ttft_ms"]
    assert entry["service_levels"]["decode_tokens_per_s_per_user"] == planned["estimated_decode_tokens_per_s_per_user"]
    derived = service_levels.derived_batching(entry["capacity"]["kv_cache_tokens"], 1024, 512)
    settings = shipped["settings"]
    assert (settings["max_num_seqs"], settings["max_num_batched_tokens"]) == (
        derived["max_num_seqs"],
        derived["max_num_batched_tokens"],
    )


# --- what the plan chooses and sizes --------------------------------------------------------------------------


def test_without_a_size_the_plan_picks_the_smallest_group_the_model_fits():
    profile = dict(planner.profiles.shipped()["rtx4090x2-32b-awq-tp2"]["settings"])
    del profile["tensor_parallel_size"]
    entry = plan(profile=profile, gpu=dict(RTX4090, count=4))
    assert entry["errors"] == [] and entry["tensor_parallel_size"] == 2
    assert [(i["name"], i["gpus"], i["port"]) for i in entry["instances"]] == [
        ("tp0-1", [0, 1], 8000),
        ("tp2-3", [2, 3], 8001),
    ]
    assert entry["profile_effective"]["tensor_parallel_size"] == 2


def test_sizing_is_per_card_each_worker_pays_its_own_runtime():
    """A group of two holds the KV cache its weakest worker can: each worker pays the CUDA context, buffers and
    graphs in full, and holds half the weights, half the activation peak and half the KV heads."""
    one = plan("rtx4090-7b-prefill", RTX4090)
    two = plan("rtx4090-7b-prefill", dict(RTX4090, count=2), profile={"tensor_parallel_size": 2})
    c1, c2 = one["capacity"], two["capacity"]
    e1, e2 = one["estimates"], two["estimates"]
    assert e2["runtime_reserve_bytes"] == 2 * e1["runtime_reserve_bytes"]
    assert c2["kv_bytes_per_token"] == c1["kv_bytes_per_token"]  # 4 KV heads split over 2 cards: the same in all
    per_card = (c2["kv_cache_bytes"] // 2) // (c2["kv_bytes_per_token"] // 2) // 16 * 16
    assert c2["kv_cache_tokens"] == per_card
    # More than twice one card's: the second card holds no second copy of the weights.
    assert c2["kv_cache_tokens"] > 2 * c1["kv_cache_tokens"]


def test_l40_groups_run_nccls_all_reduce():
    entry = plan("l40-14b-awq-prefill", dict(L40, count=2), profile={"tensor_parallel_size": 2})
    (instance,) = entry["instances"]
    assert "--disable-custom-all-reduce" in instance["args"]
    assert any("custom all-reduce has hung on L40S" in note for note in entry["notes"])


def test_cards_left_over_stay_idle_with_a_warning():
    entry = plan("rtx4090x2-32b-awq-tp2", dict(RTX4090, count=3))
    assert [i["name"] for i in entry["instances"]] == ["tp0-1"]
    assert any("GPU(s) 2 stay idle: 3 GPUs in groups of tensor_parallel_size=2" in w for w in entry["warnings"])


def test_cpu_slots_are_instances_too():
    lab = {"name": "cpu", "memory_mib": 1024, "bandwidth_gb_s": 20, "count": 2}
    entry = plan("cpu-lab-tiny", lab, vllm_environment={"VLLM_CPU_KVCACHE_SPACE": "1"}, vllm_bind_address="10.0.0.5")
    assert entry["errors"] == []
    assert [(i["name"], i["port"], i["url"]) for i in entry["instances"]] == [
        ("cpu0", 8000, "http://10.0.0.5:8000"),
        ("cpu1", 8001, "http://10.0.0.5:8001"),
    ]
    assert "environment" not in entry["instances"][0] and "devices" not in entry["instances"][0]
    single = plan("cpu-lab-tiny", dict(lab, count=0), vllm_environment={"VLLM_CPU_KVCACHE_SPACE": "1"})
    assert [i["name"] for i in single["instances"]] == ["main"]


def test_vllm_gpus_leaves_the_other_cards_alone_and_an_instance_keeps_its_name_and_port():
    entry = plan("l40x4-14b-per-gpu", detected(4), vllm_gpus=[1, 3])
    assert entry["errors"] == []
    assert [(i["name"], i["port"], i["gpus"]) for i in entry["instances"]] == [("gpu1", 8001, [1]), ("gpu3", 8003, [3])]
    one = plan(
        "cpu-lab-tiny",
        {"name": "cpu", "memory_mib": 1024, "bandwidth_gb_s": 20, "count": 2},
        vllm_environment={"VLLM_CPU_KVCACHE_SPACE": "1"},
        vllm_gpus=[0],
    )
    assert [(i["name"], i["port"]) for i in one["instances"]] == [("cpu0", 8000)]


@pytest.mark.parametrize(
    "wanted, message",
    [
        (
            [4],
            "h1: vllm_gpus=[4] names card(s) 4 the host does not have (it has 4: 0, 1, 2, 3); fix: indices of its "
            "cards, each once (nvidia-smi -L lists them)",
        ),
        ([1, 1], "h1: vllm_gpus=[1, 1] names a card twice (it has 4: 0, 1, 2, 3)"),
        (
            ["0"],
            "h1: vllm_gpus=['0'] must be a list of card indices; fix: for example [0, 1] (the host has 0, 1, 2, 3)",
        ),
    ],
)
def test_vllm_gpus_must_name_the_hosts_cards(wanted, message):
    entry = plan("l40x4-14b-per-gpu", detected(4), vllm_gpus=wanted)
    (error,) = entry["errors"]
    assert error.startswith(message), error


def test_masked_uuids_fall_back_to_the_pci_order():
    gpu = detected(2)
    for card in gpu["cards"]:
        card["uuid"] = "GPU-00000000-0000-0000-0000-000000000000"
    entry = plan("l40x4-14b-per-gpu", gpu)
    assert entry["instances"][1]["environment"] == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1"}


def test_one_masked_or_repeated_uuid_makes_the_whole_host_count_by_pci_order():
    """A capture masked card by card (GPU-0...0, GPU-0...1) or two cards with one UUID: no instance of the host
    names its card by UUID, so that the host's instances never count cards two ways."""
    for uuids in (
        ["GPU-00000000-0000-0000-0000-000000000000", "GPU-00000000-0000-0000-0000-000000000001"],
        ["GPU-5f1c9e2a-7b3d-4e8f-9a0b-000000000000"] * 2,
    ):
        gpu = detected(2)
        for card, uuid in zip(gpu["cards"], uuids, strict=True):
            card["uuid"] = uuid
        entry = plan("l40x4-14b-per-gpu", gpu)
        assert [i["environment"] for i in entry["instances"]] == [
            {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0"},
            {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1"},
        ], uuids


def test_a_group_across_numa_nodes_gets_no_cpu_affinity():
    entry = plan("l40-14b-awq-prefill", detected(4, numa=(0, 1)), profile={"tensor_parallel_size": 2})
    assert [(i["name"], i["numa_node"], i["cpus"]) for i in entry["instances"]] == [
        ("tp0-1", None, ""),
        ("tp2-3", None, ""),
    ]


# --- what the plan refuses ------------------------------------------------------------------------------------


def test_fewer_gpus_than_the_profile_needs_is_refused():
    """What the re-plan with the detected cards says of a host that has one card where its profile needs two."""
    entry = plan("rtx4090x2-32b-awq-tp2", dict(RTX4090, count=1))
    assert entry["errors"] == [
        "h1: tensor_parallel_size=2 but the host has 1 GPU(s) (NVIDIA GeForce RTX 4090); fix: tensor_parallel_size <= 1"
    ]
    assert entry["instances"] == []


def test_a_size_that_does_not_divide_the_heads_is_refused():
    entry = plan("l40x4-14b-per-gpu", dict(L40, count=4), profile={"tensor_parallel_size": 3})
    assert entry["errors"] == [
        "h1: tensor_parallel_size=3 does not divide Qwen/Qwen2.5-14B-Instruct's 40 attention "
        "heads and 8 KV heads: vLLM refuses to start; fix: one of 1, 2, 4, 8, 40"
    ]


def test_mixed_cards_in_one_group_are_refused():
    gpu = detected(2)
    gpu["cards"][1].update(name="NVIDIA L40S", memory_mib=46068)
    entry = plan("l40-14b-awq-prefill", gpu, profile={"tensor_parallel_size": 2})
    (error,) = entry["errors"]
    assert error.startswith(
        "h1: the tensor-parallel group of GPUs 0, 1 mixes cards (0: NVIDIA L40 (46068 MiB), 1: NVIDIA L40S (46068 MiB))"
    )
    assert "fix: cards of one kind per group" in error


def test_a_model_that_fits_no_placement_names_the_smallest_that_would():
    profile = dict(planner.profiles.shipped()["rtx4090x2-32b-awq-tp2"]["settings"])
    del profile["tensor_parallel_size"]
    entry = plan(profile=profile, gpu=RTX4090)
    (error,) = entry["errors"]
    # One card leaves 6,080 tokens of KV cache, below max_model_len: vLLM would refuse to start.
    assert error.startswith(
        "h1: the KV cache holds 6,080 tokens (1.49 GiB at 262,144 B/token), below "
        "max_model_len=8,192: vLLM refuses to start"
    )
    assert error.endswith(
        "or the smallest placement that fits is 2 x NVIDIA GeForce RTX 4090 per instance "
        "(tensor_parallel_size: 2; the host has 1)"
    )


def test_a_model_too_large_for_eight_cards_says_so():
    entry = plan("l40-14b-decode", {"name": "NVIDIA T4", "memory_mib": 1000, "bandwidth_gb_s": 320, "count": 1})
    assert any("no placement of up to 8 x NVIDIA T4 fits" in e for e in entry["errors"]), entry["errors"]
