"""The one driver/CUDA table of the project (data/cuda_compat.yml) and its filter."""

import re

import pytest

from vllm_fleet import compat


@pytest.mark.parametrize(
    "version,cuda,driver",
    [
        ("0.33.0", "13.0", "580.65.06"),  # today's wheels: CUDA 13
        ("0.26.0", "13.0", "580.65.06"),  # the release served on the H200 host, 2026-11-29 (driver 580.159.04)
        ("0.20.0", "13.0", "580.65.06"),  # the boundary itself
        ("0.19.1", "12", "525.60.13"),
        ("0.8.5", "12", "525.60.13"),
    ],
)
def test_line_for_each_release(version, cuda, driver):
    assert compat.min_driver(version) == {"vllm": compat.min_driver(version)["vllm"], "cuda": cuda, "driver": driver}


def test_the_h200_driver_passes_and_an_r570_driver_does_not():
    assert compat.driver_ok("580.159.04", "0.33.0")
    assert not compat.driver_ok("570.172.08", "0.33.0")
    assert compat.driver_ok("570.172.08", "0.19.0")


def test_bad_version_names_the_fix():
    with pytest.raises(ValueError, match=re.escape("quote it as X.Y.Z")):
        compat.min_driver("latest")
