"""vllm_fleet.sizing: what the sizing reads itself (the instance's sizing against measured vLLM starts is tested
through planner.plan_host in test_planner.py)."""

from __future__ import annotations

import pytest

from vllm_fleet import sizing

MIB = 1 << 20


@pytest.mark.parametrize(
    "text,value",
    [("1k", 1000), ("1K", 1024), ("25.6k", 25600), ("2M", 2 * MIB), ("1g", 10**9), (1073741824, 1073741824)],
)
def test_human_readable_bytes_as_vllm_reads_them(text, value):
    assert sizing.parse_bytes(text) == value
