"""plugins/modules/nvidia_gpu_facts.py, run by Ansible on this machine with a stand-in `nvidia-smi` that prints the
fixtures (no GPU here; the module ran against a real H200's nvidia-smi: results/gpu-host-driver-check/)."""

import pytest

from conftest import GPU_FIXTURES as FIXTURES
from conftest import run_module


def _standin(tmp_path, body):
    script = tmp_path / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script)


@pytest.mark.integration
def test_module_end_to_end_ok(tmp_path):
    csv = FIXTURES / "rtx4090" / "query-gpu-nounits.csv"
    header = FIXTURES / "rtx4090" / "nvidia-smi-q-compute.txt"
    path = _standin(
        tmp_path, '[ "$LC_ALL" = C ] || exit 3\ncase "$1" in -q) cat %s;; *) cat %s;; esac\n' % (header, csv)
    )
    result = run_module(tmp_path, "nvidia_gpu_facts", {"nvidia_smi": path, "mask_uuids": True})
    assert not result["failed"], result
    assert result["changed"] is False
    assert result["count"] == 2 and result["cuda_version"] == "13.0"
    assert result["ansible_facts"]["nvidia_gpu"]["short_names"] == ["RTX 4090", "RTX 4090"]
    assert set(result["uuids"]) == {"GPU-00000000-0000-0000-0000-000000000000"}


@pytest.mark.integration
def test_module_end_to_end_mismatch_fails_clearly(tmp_path):
    path = _standin(tmp_path, "cat %s >&2; exit 18\n" % (FIXTURES / "errors" / "nvml-mismatch.txt"))
    result = run_module(tmp_path, "nvidia_gpu_facts", {"nvidia_smi": path})
    assert result["failed"] is True
    assert "Driver/library version mismatch" in result["msg"]
    assert result["status"] == "nvml_mismatch"
    probe = run_module(tmp_path, "nvidia_gpu_facts", {"nvidia_smi": path, "require": False})
    assert not probe["failed"] and probe["status"] == "nvml_mismatch"
