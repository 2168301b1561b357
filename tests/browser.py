"""A real headless browser (Debian's Chromium) opens a report page from disk: whether every image decoded, the
console's errors, and a screenshot kept as an artifact. Shared by the unit test of the page and the fleet scenario's
test of a real day-2 report."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

CHROMIUM = shutil.which("chromium")
ARTIFACTS = Path(os.environ.get("VLLM_FLEET_ARTIFACTS", Path(__file__).resolve().parent / "artifacts"))


def open_page(page: Path, workdir: Path, screenshot: str) -> dict:
    """Open `page` in headless Chromium: {"images": (decoded, total), "console_errors": [...], "screenshot": path}.
    AssertionError when Chromium is missing (scripts/bootstrap.sh installs it)."""
    assert CHROMIUM, "chromium is not installed: scripts/bootstrap.sh installs Debian's chromium"
    page, workdir = page.resolve(), workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    check = workdir / "check.html"
    # The page itself, then a script that reports how many images decoded (naturalWidth > 0) in the title.
    check.write_text(
        page.read_text().replace(
            "</body>",
            "<script>window.onload = () => { document.title = "
            "'images:' + [...document.images].filter(i => i.naturalWidth > 0).length + '/' + "
            "document.images.length; };</script></body>",
        )
    )
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={workdir / 'profile'}",
        "--enable-logging=stderr",
        "--v=0",
    ]
    dom = subprocess.run(
        [CHROMIUM, *flags, "--virtual-time-budget=5000", "--dump-dom", check.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    title = re.search(r"<title>images:(\d+)/(\d+)</title>", dom.stdout)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / screenshot
    subprocess.run(
        [CHROMIUM, *flags, "--window-size=1280,2400", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return {
        "images": (int(title.group(1)), int(title.group(2))) if title else None,
        "console_errors": [line for line in dom.stderr.splitlines() if "CONSOLE" in line and "ERROR" in line.upper()],
        "screenshot": shot,
        "stderr": dom.stderr[-2000:],
    }
