#!/usr/bin/env python3
"""What a GPU host without a package registry or a model hub needs before site.yml runs there.

    prepare.py wheelhouse --wheels DIR --to DIR     the wheelhouse site.yml installs from (vllm_wheelhouse_url):
                                                    the [vllm] wheels of gpu/bench/wheels.txt and their
                                                    requirements.lock (one name==version a line, no torch)
    prepare.py model --id MODEL --to DIR            a dummy-weight copy of a catalogue model (vllm_model_src):
                                                    config.json with the catalogue's dimensions, a WordLevel
                                                    tokenizer in tokenizer/, and SHA256SUMS over both
    prepare.py ansible-cfg --to FILE --work DIR     an ansible.cfg for this checkout that needs no collection
                                                    (ansible.posix's task timer when a copy is found)

Stdlib and PyYAML only (the image's python3).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "gpu" / "bench"))
sys.path.insert(0, str(ROOT / "src"))
import bundle  # noqa: E402  (gpu/bench/bundle.py: the pins)
import harness  # noqa: E402  (gpu/bench/harness.py: the dummy model's config and tokenizer)
from vllm_fleet import catalogue  # noqa: E402


def wheelhouse(wheels: Path, to: Path, pins: Path, section: str) -> list[str]:
    to.mkdir(parents=True, exist_ok=True)
    lock = []
    for pin in bundle.read_pins(pins)[section]:
        wheel = bundle.wheel_for(pin, wheels)
        shutil.copy2(wheel, to / wheel.name)
        lock.append(pin)
    (to / "requirements.lock").write_text("\n".join(lock) + "\n", encoding="utf-8")
    return lock


def model(model_id: str, to: Path) -> Path:
    config = catalogue.catalogue()[model_id]["config"]
    folder = to / model_id.replace("/", "--")
    (folder / "tokenizer").mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(harness.model_config(config), indent=1) + "\n", encoding="utf-8")
    for name, content in harness.tokenizer_files(config["vocab_size"]).items():
        (folder / "tokenizer" / name).write_text(json.dumps(content), encoding="utf-8")
    files = sorted(
        p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != "SHA256SUMS"
    )
    sums = [f"{hashlib.sha256((folder / f).read_bytes()).hexdigest()}  {f}" for f in files]
    (folder / "SHA256SUMS").write_text("\n".join(sums) + "\n", encoding="utf-8")
    return folder


def ansible_cfg(to: Path, work: Path, collections: Path) -> None:
    posix = collections / "ansible_collections" / "ansible" / "posix"
    timer = posix.is_dir()
    lines = [
        "[defaults]",
        # the repository as the collection vllm_fleet.fleet (collections/ links to it), then the carried collections
        f"collections_path = {ROOT}/collections:{collections}",
        "stdout_callback = ansible.builtin.default",
        "callback_result_format = yaml",
        "callbacks_enabled = ansible.posix.profile_tasks" if timer else None,
        "host_key_checking = false",
        "retry_files_enabled = false",
        f"local_tmp = {work}/local-tmp",
        "nocolor = true",
        "",
    ]
    to.write_text("\n".join(line for line in lines if line is not None) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wheelhouse")
    w.add_argument("--wheels", type=Path, required=True)
    w.add_argument("--to", type=Path, required=True)
    w.add_argument("--pins", type=Path, default=ROOT / "gpu" / "bench" / "wheels.txt")
    w.add_argument("--section", default="vllm")
    m = sub.add_parser("model")
    m.add_argument("--id", required=True)
    m.add_argument("--to", type=Path, required=True)
    a = sub.add_parser("ansible-cfg")
    a.add_argument("--to", type=Path, required=True)
    a.add_argument("--work", type=Path, required=True)
    a.add_argument("--collections", type=Path, default=ROOT / ".cache" / "collections")
    args = parser.parse_args(argv)
    if args.cmd == "wheelhouse":
        lock = wheelhouse(args.wheels, args.to, args.pins, args.section)
        print(f"{len(lock)} wheels and requirements.lock in {args.to}")
    elif args.cmd == "model":
        print(model(args.id, args.to))
    else:
        ansible_cfg(args.to, args.work, args.collections)
        print(args.to)
    return 0


if __name__ == "__main__":
    sys.exit(main())
