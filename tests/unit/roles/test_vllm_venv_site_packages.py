"""vllm_venv_site_packages: the .pth file the vllm role writes into a release's virtualenv (install_release.yml) makes a
vendor's site-packages (e.g. the CUDA torch of an image) importable after the venv's own packages, and reads that
folder's own .pth files, as a system site-packages folder is read. Run for real on an H200 host on 2026-12-01
(docs/gpu-host-site.md); here with a throwaway venv and a stand-in vendor folder."""

import json
import subprocess
import sys
from pathlib import Path

import jinja2
import yaml

from conftest import ROOT


def _pth_task():
    tasks = yaml.safe_load((ROOT / "roles" / "vllm" / "tasks" / "install_release.yml").read_text())
    block = next(t for t in tasks if "block" in t and any("Create the virtualenv" in b["name"] for b in t["block"]))[
        "block"
    ]
    return next(t for t in block if t["name"] == "Let the virtualenv see the host's packages")


def _render(folders):
    env = jinja2.Environment()
    env.filters["to_json"] = json.dumps
    return env.from_string(_pth_task()["ansible.builtin.copy"]["content"]).render(vllm_venv_site_packages=folders)


def test_the_pth_file_is_written_only_when_folders_are_named():
    task = _pth_task()
    assert task["when"] == "vllm_venv_site_packages | length > 0"
    assert task["ansible.builtin.copy"]["dest"].endswith("/zz-vllm-host-site-packages.pth")


def test_each_folder_is_one_addsitedir_line_quoted_as_python():
    text = _render(["/opt/torch/.venv/lib/python3.12/site-packages", '/odd "dir"'])
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert lines == [
        'import site; site.addsitedir("/opt/torch/.venv/lib/python3.12/site-packages")',
        'import site; site.addsitedir("/odd \\"dir\\"")',
    ]


def test_a_venv_sees_the_vendor_folder_after_its_own_packages(tmp_path):
    vendor = tmp_path / "vendor"
    (vendor / "deeper").mkdir(parents=True)
    (vendor / "vendor_only.py").write_text("WHERE = 'vendor'\n")
    (vendor / "shadowed.py").write_text("WHERE = 'vendor'\n")
    (vendor / "deeper" / "from_vendor_pth.py").write_text("WHERE = 'vendor pth'\n")
    (vendor / "extra.pth").write_text(str(vendor / "deeper") + "\n")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (purelib / "shadowed.py").write_text("WHERE = 'venv'\n")
    (purelib / "zz-vllm-host-site-packages.pth").write_text(_render([str(vendor)]))
    out = subprocess.run(
        [
            str(python),
            "-c",
            "import vendor_only, shadowed, from_vendor_pth; "
            "print(vendor_only.WHERE, shadowed.WHERE, from_vendor_pth.WHERE, sep='|')",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    ).stdout.strip()
    assert out == "vendor|venv|vendor pth"
