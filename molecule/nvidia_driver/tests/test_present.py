"""nvd-present: the wanted driver "is loaded" (an nvidia-smi stand-in replays the real H200 capture):
nothing installed, no repository added, the detected GPU published as nvidia_driver_gpus."""

import json

testinfra_hosts = ["podman://nvd-present"]

DEBIAN_SOURCES = "/etc/apt/sources.list.d/nvidia-driver-debian.sources"
CUDA_SOURCES = "/etc/apt/sources.list.d/nvidia-cuda.sources"
PIN = "/etc/apt/preferences.d/nvidia-driver.pref"


def facts(host):
    return json.loads(host.file("/root/nvidia_driver_facts.json").content_string)


def test_present_host_adds_no_repository(host):
    for path in (DEBIAN_SOURCES, CUDA_SOURCES, PIN, "/etc/apt/keyrings/nvidia-cuda.asc"):
        assert not host.file(path).exists, path


def test_present_host_facts_come_from_the_replayed_h200(host):
    found = facts(host)
    assert found["nvidia_driver_present"] is True
    assert found["nvidia_driver_loaded_version"] == "580.159.04"
    assert found["nvidia_driver_reboot_required"] is False
    assert found["nvidia_driver_detected"] is True
    assert found["nvidia_driver_secure_boot"] is False
    # The detected card, not the group's assumption (the host sits in l40_nodes); the plan sizes the host with it
    # (vllm_fleet.planner.detected_gpu, tests/unit).
    gpu = found["nvidia_driver_gpus"]
    assert {key: gpu[key] for key in ("name", "memory_mib", "count", "bandwidth_gb_s", "compute_cap")} == {
        "name": "NVIDIA H200",
        "memory_mib": 143771,
        "count": 1,
        "bandwidth_gb_s": 4800,
        "compute_cap": "9.0",
    }
    assert gpu["model"] == "H200"
    assert found["nvidia_driver_min_version"] == "580.65.06"
    assert gpu["name"] == "NVIDIA H200"
    assert gpu["compute_cap"] == "9.0"
    assert gpu["cuda_version"] == "13.0"
    assert gpu["persistence_mode"] is True
    assert found["nvidia_driver_simulated_install"] is None


def test_standin_replays_the_capture_under_c_locale(host):
    query = (
        "--query-gpu=index,uuid,name,memory.total,memory.used,driver_version,compute_cap,pci.bus_id,"
        "persistence_mode --format=csv,noheader,nounits"
    )
    assert host.run(f"nvidia-smi {query}").rc == 3  # refuses to answer without LC_ALL=C
    out = host.check_output(f"LC_ALL=C nvidia-smi {query}")
    assert out == (
        "0, GPU-00000000-0000-0000-0000-000000000000, NVIDIA H200, 143771, 0, 580.159.04, 9.0, 00000000:00:06.0, "
        "Enabled"
    )
