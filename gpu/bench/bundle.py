#!/usr/bin/env python3
"""The offline wheel bundle for a GPU host without a package registry: built on the controller,
assembled on the host.

The wheels travel as one xz-compressed tar (split into parts for a host that takes files in pieces:
parts.py). Wheels are zips whose members are each deflated; xz over the whole set compresses the CUDA
kernels of vLLM about three times better when it sees them uncompressed, so each wheel is repacked
with its members *stored* (same names, same bytes, same RECORD: pip installs it unchanged) before
the tar is compressed. That roughly halves the bundle.

Controller:  bundle.py build  --wheels .gpu/wheels --out .gpu      (build-bundle.sh calls it)
Host:        bundle.py assemble --parts DIR [--parts DIR...] --sums .gpu/SHA256SUMS --to /tmp/gpu-bundle

Stdlib only: the host runs it with the image's python3 before anything is installed.
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from parts import PART_BYTES, sha256, split  # gpu/bench/parts.py

BUNDLE = "bundle.tar.xz"
SUMS = "SHA256SUMS"
MANIFEST = "manifest.json"


def read_pins(path: str | Path) -> dict[str, list[str]]:
    """wheels.txt: `[section]` headers, one `name==version` per line, `#` comments."""
    sections: dict[str, list[str]] = {}
    current = None
    for number, raw in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1].strip()
            sections.setdefault(current, [])
            continue
        if current is None:
            raise ValueError(f"{path}:{number}: {line!r} comes before any [section]")
        if line.count("==") != 1 or " " in line:
            raise ValueError(f"{path}:{number}: {line!r} is not a name==version pin")
        sections[current].append(line)
    return sections


def _norm(name: str) -> str:
    return name.replace("_", "-").replace(".", "-").lower()


def wheel_for(pin: str, folder: Path) -> Path:
    """The one wheel in folder that a pin names (name normalised as pip does)."""
    name, version = pin.split("==")
    found = [
        w
        for w in folder.glob("*.whl")
        if _norm(w.name.split("-")[0]) == _norm(name) and w.name.split("-")[1] == version
    ]
    if len(found) != 1:
        raise FileNotFoundError(f"{pin}: expected one wheel in {folder}, found {[w.name for w in found]}")
    return found[0]


def repack_stored(src: Path, dst: Path) -> int:
    """Copy a wheel with every member stored (no compression); same names, order, bytes and modes.
    Returns the member count. Raises ValueError when a member's CRC differs after the copy."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_suffix(".tmp")
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info)
            out = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            out.external_attr = info.external_attr
            out.create_system = info.create_system
            out.compress_type = zipfile.ZIP_STORED
            zout.writestr(out, data)
        members = len(zin.infolist())
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(tmp) as b:
        left = {i.filename: i.CRC for i in a.infolist()}
        right = {i.filename: i.CRC for i in b.infolist()}
        if left != right:
            tmp.unlink()
            raise ValueError(f"{src.name}: the stored copy differs from the wheel")
    tmp.replace(dst)
    return members


def _compress(tar_path: Path, out: Path) -> None:
    if shutil.which("xz"):
        with open(tar_path, "rb") as src, open(out, "wb") as dst:
            subprocess.run(["xz", "-6", "-T2", "-c"], stdin=src, stdout=dst, check=True)
    else:  # pragma: no cover - every controller we use has xz
        with open(tar_path, "rb") as src, lzma.open(out, "wb", preset=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)


def build(wheels_dir: Path, pins_file: Path, out_dir: Path, part_bytes: int = PART_BYTES) -> dict:
    """Repack every pinned wheel stored, tar and xz them, split the result; write SHA256SUMS and the
    manifest (the original wheels' sha256, for the record). Returns the manifest."""
    pins = read_pins(pins_file)
    stage = out_dir / "stage"
    if stage.exists():
        shutil.rmtree(stage)
    manifest: dict = {"sections": {}, "part_bytes": part_bytes}
    for section, section_pins in pins.items():
        entries = []
        for pin in section_pins:
            wheel = wheel_for(pin, wheels_dir / section)
            members = repack_stored(wheel, stage / "wheels" / section / wheel.name)
            entries.append(
                {
                    "pin": pin,
                    "wheel": wheel.name,
                    "sha256": sha256(wheel),
                    "bytes": wheel.stat().st_size,
                    "members": members,
                }
            )
        manifest["sections"][section] = entries
    (stage / "wheels" / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    tar_path = out_dir / "bundle.tar"
    with tarfile.open(tar_path, "w") as tar:
        tar.add(stage / "wheels", arcname="wheels")
    bundle = out_dir / BUNDLE
    _compress(tar_path, bundle)
    tar_path.unlink()
    shutil.rmtree(stage)
    parts = split(bundle, out_dir, part_bytes)
    lines = [f"{sha256(bundle)}  {BUNDLE}"] + [f"{sha256(p)}  {p.name}" for p in parts]
    (out_dir / SUMS).write_text("\n".join(lines) + "\n", encoding="utf-8")
    manifest["bundle_bytes"] = bundle.stat().st_size
    manifest["parts"] = [p.name for p in parts]
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def read_sums(path: Path) -> dict[str, str]:
    sums = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            digest, name = line.split(None, 1)
            sums[name.strip().lstrip("*")] = digest
    return sums


def assemble(part_dirs: list[Path], sums_file: Path, to: Path) -> Path:
    """Find every part named in SHA256SUMS in part_dirs, check each, join them, check the bundle,
    unpack it into `to`. Returns the folder holding the wheels (to/wheels). Raises ValueError naming
    the missing or damaged part."""
    sums = read_sums(sums_file)
    names = sorted(n for n in sums if n.startswith("part-"))
    to.mkdir(parents=True, exist_ok=True)
    bundle = to / BUNDLE
    with open(bundle, "wb") as out:
        for name in names:
            candidates = [d / name for d in part_dirs if (d / name).is_file()]
            if not candidates:
                raise ValueError(f"{name} is in none of {[str(d) for d in part_dirs]}: carry it first")
            good = [c for c in candidates if sha256(c) == sums[name]]
            if not good:
                raise ValueError(f"{name}: sha256 differs from {sums_file} in every copy ({candidates})")
            with open(good[0], "rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
    if sha256(bundle) != sums[BUNDLE]:
        raise ValueError(f"the joined {BUNDLE} does not match {sums_file}")
    if shutil.which("xz"):
        with (
            subprocess.Popen(["xz", "-dc", "-T0", str(bundle)], stdout=subprocess.PIPE) as xz,
            tarfile.open(fileobj=xz.stdout, mode="r|") as tar,
        ):
            tar.extractall(to, filter="data")
        if xz.returncode:
            raise ValueError(f"xz failed on {bundle} (exit {xz.returncode})")
    else:
        with tarfile.open(bundle, "r:xz") as tar:
            tar.extractall(to, filter="data")
    bundle.unlink()
    return to / "wheels"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="controller: repack, tar, xz, split")
    b.add_argument("--wheels", type=Path, default=Path(".gpu/wheels"))
    b.add_argument("--pins", type=Path, default=Path(__file__).with_name("wheels.txt"))
    b.add_argument("--out", type=Path, default=Path(".gpu"))
    b.add_argument("--part-bytes", type=int, default=PART_BYTES)
    a = sub.add_parser("assemble", help="host: check, join, unpack")
    a.add_argument("--parts", type=Path, action="append", required=True)
    a.add_argument("--sums", type=Path, required=True)
    a.add_argument("--to", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.cmd == "build":
        manifest = build(args.wheels, args.pins, args.out, args.part_bytes)
        wheels = sum(len(v) for v in manifest["sections"].values())
        print(
            f"{wheels} wheels -> {args.out / BUNDLE}: {manifest['bundle_bytes'] / 2**20:.1f} MiB in "
            f"{len(manifest['parts'])} parts ({', '.join(manifest['parts'])})"
        )
        return 0
    try:
        folder = assemble(args.parts, args.sums, args.to)
    except ValueError as exc:
        print(f"bundle: {exc}", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
