"""Carrying the benchmark to a GPU host in pieces, and running it there in rounds.

On a host you reach over SSH none of this is needed: copy the checkout (and, offline, the whole
.gpu/bundle.tar.xz), then `run.sh run` goes through the plan in one round. The H200 host that the
project's own results come from is reached through a channel with three limits, and this module is
where they live:

- it takes at most 64 MiB of files per command, so the wheel bundle travels as parts of 48 MiB
  (PART_BYTES: a part, the checkout and the carried JIT cache fit beside each other), which
  `parts.py stage` (run.sh stage) collects into /tmp one command at a time while the machine stays up;
- it returns files of at most 16 MiB, so the driver's JIT cache comes back as parts of 15 MiB
  (JIT_PART_BYTES);
- a command runs for at most about ten minutes, so the harness runs the plan in rounds
  (`run --budget-s`), and `schedule` says how the plan packs into them.

Stdlib only: the host runs it with the image's python3 before anything is installed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

PART_BYTES = 48 * 1024 * 1024  # bundle parts: 64 MiB per command in all, with the checkout and the JIT cache
JIT_PART_BYTES = 15 << 20  # JIT cache parts: files come back at 16 MiB each at most


def sha256(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def split(path: Path, out_dir: Path, part_bytes: int, prefix: str = "part-") -> list[Path]:
    """Cut a file into PREFIX00, PREFIX01... of at most part_bytes in out_dir (earlier parts removed)."""
    for old in out_dir.glob(f"{prefix}*"):
        old.unlink()
    parts = []
    with open(path, "rb") as f:
        while chunk := f.read(part_bytes):
            parts.append(out_dir / f"{prefix}{len(parts):02d}")
            parts[-1].write_bytes(chunk)
    return parts


def stage(carried: Path, sums: dict[str, str], dest: Path) -> tuple[list[str], list[str]]:
    """Copy the parts carried into `carried` whose sha256 matches `sums` into `dest`, where they stay while
    the machine does; returns (what was staged now, the parts still missing)."""
    dest.mkdir(parents=True, exist_ok=True)
    staged = []
    for part in sorted(carried.glob("part-*")):
        if sha256(part) == sums.get(part.name):
            shutil.copy(part, dest / part.name)
            staged.append(part.name)
        else:
            staged.append(f"{part.name} (checksum mismatch, not staged)")
    have = {p.name for p in dest.glob("part-*")}
    missing = sorted(n for n in sums if n.startswith("part-") and n not in have)
    return staged, missing


# Time around the experiments, measured on the H200 host: the machine start and the commands that stage
# the parts (45-52 s), the install in the first round (20-25 s, and 1.7 s to unpack the JIT cache), and a
# few seconds per round.
STAGING_S, INSTALL_S, PER_ROUND_S = 60, 30, 8


def schedule(
    experiments: list[dict], budgets: tuple[float, ...] = (550.0, 560.0), only: set[str] | None = None
) -> dict:
    """How the harness packs the plan into rounds of `run --budget-s`: in order, an experiment runs in a
    round while its est_s fits what is left of the round (the first also installs), else it waits for the
    next; optional candidates only when named. Returns the rounds and the expected GPU time."""
    todo = [e for e in experiments if (e["name"] in only if only else not e.get("optional"))]
    rounds: list[list[str]] = []
    while todo:
        budget = budgets[0] if not rounds else budgets[-1]
        left = budget - (INSTALL_S if not rounds else 0)
        this = []
        for exp in list(todo):
            if exp["est_s"] <= left:
                this.append(exp["name"])
                left -= exp["est_s"]
                todo.remove(exp)
        if not this:
            raise ValueError(f"{todo[0]['name']} (est_s {todo[0]['est_s']}) does not fit in a round of {budget} s")
        rounds.append(this)
    by_name = {e["name"]: e["est_s"] for e in experiments}
    experiment_s = sum(by_name[n] for r in rounds for n in r)
    return {
        "rounds": rounds,
        "experiment_s": experiment_s,
        "gpu_s": STAGING_S + INSTALL_S + PER_ROUND_S * len(rounds) + experiment_s,
    }


def main(argv: list[str] | None = None) -> int:
    """`parts.py stage`: copy the bundle parts carried into the checkout's .gpu/ to where the harness's install
    looks for them, and say which parts are still missing."""
    import bundle  # imported here: bundle and harness both import this module
    import harness

    if (argv if argv is not None else sys.argv[1:]) != ["stage"]:
        print("usage: parts.py stage", file=sys.stderr)
        return 2
    sums = harness.REPO / ".gpu" / bundle.SUMS
    if not sums.exists():
        harness.log(f"no {sums.relative_to(harness.REPO)}: copy it with the part (build-bundle.sh writes both)")
        return 1
    staged, missing = stage(harness.REPO / ".gpu", bundle.read_sums(sums), harness.BUNDLE_DIR / "parts")
    harness.log(f"staged {', '.join(staged) or 'nothing'}; missing: {missing or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
