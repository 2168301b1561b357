"""The fingerprint of what a host should run, so that a re-run can tell a host that is already there.

The vllm_rollout role writes, after it has verified every instance of a host, a digest of everything the vllm role
derives the host's state from: the host's plan entry (its instances' arguments, cards and environment), the unit,
environment and firewall files rendered for it, the release and where it comes from, where the models come from,
and the role's own code and templates (:func:`tree_digest`, so that a new version of the project is a change).
A later run that computes the same digest, finds the same instances and each one healthy, has nothing to do on
that host: it leaves it alone instead of walking its ~100 tasks (docs/benchmarks.md). Any failure, a drift of a
file the role owns but the digest does not cover, or a model re-published under the same id are reasons to force
the full path: ``-e vllm_fast_path=false``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any


def digest(value: Any) -> str:
    """sha256 of a JSON-able value, keys sorted (the same value gives the same digest on any controller)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


@lru_cache(maxsize=16)
def _tree(paths: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for root in paths:
        base = Path(root)
        files = (
            sorted(p for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
            if base.is_dir()
            else [base]
        )
        for path in files:
            h.update(os.path.relpath(path, base.parent).encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def tree_digest(paths: Iterable[str]) -> str:
    """sha256 of the files under `paths` (names and contents, sorted): the role's code and templates."""
    return _tree(tuple(str(p) for p in paths))
