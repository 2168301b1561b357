"""Files the controller writes for a run (plan.json, the run reports): each replaced whole, so that a reader never sees
half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_whole(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace ``path`` with ``text``: a temporary file beside it, renamed over it (one step on one file system)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
