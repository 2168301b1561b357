"""Which NVIDIA driver a vLLM release needs (data/cuda_compat.yml: one table for the whole project)."""

from __future__ import annotations

import functools
from typing import Any

from packaging.version import InvalidVersion, Version

from . import datafiles


@functools.lru_cache(maxsize=1)
def lines() -> list[dict[str, Any]]:
    data = datafiles.load("cuda_compat.yml")
    return sorted(data["lines"], key=lambda line: Version(line["vllm"]), reverse=True)


def min_driver(vllm_version: str) -> dict[str, str]:
    """The {vllm, cuda, driver} line that applies to `vllm_version` (the newest line not after it)."""
    try:
        wanted = Version(str(vllm_version))
    except InvalidVersion as exc:
        raise ValueError(f"vllm_version={vllm_version!r} is not a version; fix: quote it as X.Y.Z") from exc
    for line in lines():
        if Version(line["vllm"]) <= wanted:
            return {"vllm": line["vllm"], "cuda": line["cuda"], "driver": line["driver"]}
    raise ValueError(f"no driver requirement covers vLLM {vllm_version}")  # the table ends at 0.0.0


def driver_ok(loaded: str, vllm_version: str) -> bool:
    """Whether the loaded driver (e.g. 580.159.04) is new enough for `vllm_version`."""
    return Version(str(loaded)) >= Version(min_driver(vllm_version)["driver"])
