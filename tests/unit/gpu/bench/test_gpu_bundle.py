"""gpu/bench/bundle.py: the offline wheel bundle for a GPU host without a registry (pins, repacked wheels,
parts split and assembled)."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest

from gpu_modules import GPU, bundle


def _wheel(path: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    whl = path / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for member, data in files.items():
            z.writestr(member, data)
    return whl


def test_pins_are_read_by_section(tmp_path):
    pins = tmp_path / "wheels.txt"
    pins.write_text("# c\n[vllm]\nvllm==0.26.0\nuvloop==0.22.1  # x\n\n[ansible]\nansible-core==2.19.14\n")
    assert bundle.read_pins(pins) == {"vllm": ["vllm==0.26.0", "uvloop==0.22.1"], "ansible": ["ansible-core==2.19.14"]}
    pins.write_text("vllm==0.26.0\n")
    with pytest.raises(ValueError, match="before any"):
        bundle.read_pins(pins)
    pins.write_text("[a]\nvllm>=0.26\n")
    with pytest.raises(ValueError, match="not a name==version pin"):
        bundle.read_pins(pins)


def test_shipped_pins_match_gpu_host_list():
    pins = bundle.read_pins(GPU / "wheels.txt")
    assert pins["vllm"][0] == "vllm==0.26.0" and len(pins["vllm"]) == 39
    assert {p.split("==")[0] for p in pins["ansible"]} == {
        "ansible-core",
        "jinja2",
        "markupsafe",
        "pyyaml",
        "cryptography",
        "cffi",
        "pycparser",
        "packaging",
        "resolvelib",
    }


def test_repacked_wheel_keeps_every_member_stored(tmp_path):
    src = _wheel(tmp_path, "demo", "1.0", {"demo/__init__.py": b"x = 1\n" * 1000, "demo-1.0.dist-info/RECORD": b"r"})
    dst = tmp_path / "out" / src.name
    assert bundle.repack_stored(src, dst) == 2
    with zipfile.ZipFile(dst) as z:
        assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_STORED}
        assert z.read("demo/__init__.py") == b"x = 1\n" * 1000


def test_build_split_assemble_round_trip(tmp_path):
    wheels = tmp_path / "wheels"
    (wheels / "a").mkdir(parents=True)
    (wheels / "b").mkdir(parents=True)
    _wheel(wheels / "a", "alpha", "1.0", {"alpha/x.bin": os.urandom(50_000)})
    _wheel(wheels / "b", "beta_pkg", "2.0", {"beta_pkg/y.py": b"y = 2\n"})
    pins = tmp_path / "wheels.txt"
    pins.write_text("[a]\nalpha==1.0\n[b]\nbeta-pkg==2.0\n")
    out = tmp_path / "gpu"
    out.mkdir()
    manifest = bundle.build(wheels, pins, out, part_bytes=20_000)
    assert len(manifest["parts"]) >= 2 and all((out / p).stat().st_size <= 20_000 for p in manifest["parts"])
    sums = bundle.read_sums(out / bundle.SUMS)
    assert set(sums) == {bundle.BUNDLE, *manifest["parts"]}
    # the parts arrive in two places (carried into the repo copy, staged into /tmp)
    staged = tmp_path / "staged"
    staged.mkdir()
    (out / manifest["parts"][0]).rename(staged / manifest["parts"][0])
    folder = bundle.assemble([staged, out], out / bundle.SUMS, tmp_path / "unpacked")
    assert sorted(p.name for p in (folder / "a").iterdir()) == ["alpha-1.0-py3-none-any.whl"]
    assert json.loads((folder / bundle.MANIFEST).read_text())["sections"]["b"][0]["pin"] == "beta-pkg==2.0"


def test_assemble_names_a_missing_or_damaged_part(tmp_path):
    wheels = tmp_path / "wheels" / "a"
    wheels.mkdir(parents=True)
    _wheel(wheels, "alpha", "1.0", {"alpha/x.bin": os.urandom(30_000)})
    (tmp_path / "p.txt").write_text("[a]\nalpha==1.0\n")
    out = tmp_path / "gpu"
    out.mkdir()
    manifest = bundle.build(tmp_path / "wheels", tmp_path / "p.txt", out, part_bytes=12_000)
    last = out / manifest["parts"][-1]
    data = last.read_bytes()
    last.write_bytes(b"\0" + data[1:])
    with pytest.raises(ValueError, match="sha256 differs"):
        bundle.assemble([out], out / bundle.SUMS, tmp_path / "x")
    last.unlink()
    with pytest.raises(ValueError, match="carry it first"):
        bundle.assemble([out], out / bundle.SUMS, tmp_path / "x")
