"""What the repository tracks: the folders scripts/bootstrap.sh builds stay out of it, whatever they are (a folder,
or a link made by hand to another checkout's, which an ignore rule ending in / would not match)."""
import subprocess

import pytest

from conftest import ROOT

BUILT = (".venv", ".venv-vllm", ".cache", ".whl", ".gl", ".gpu")


def _git(*args):
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"this test needs the checkout's git: {exc}")


def test_no_built_folder_or_link_out_of_the_tree_is_tracked():
    tracked = _git("ls-files", "-s").splitlines()
    assert not [line for line in tracked if line.split("\t", 1)[1].split("/", 1)[0] in BUILT]
    for line in tracked:
        if line.startswith("120000 "):  # a symbolic link: its blob is its target
            blob, path = line.split()[1], line.split("\t", 1)[1]
            target = _git("cat-file", "-p", blob)
            assert not target.startswith("/"), f"{path} links out of the tree to {target}"


def test_nothing_the_tests_write_is_tracked():
    """The tests' screenshots and the runs' reports are outputs: tests/artifacts/ and reports/ stay untracked."""
    tracked = _git("ls-files", "tests/artifacts", "reports").split()
    assert tracked == []
    for path in ("tests/artifacts/report.png", "reports/plan.json"):
        assert _git("check-ignore", "--no-index", path).strip() == path


@pytest.mark.parametrize("name", BUILT)
def test_the_built_folders_are_ignored_as_folders_and_as_links(name):
    assert _git("check-ignore", "--no-index", name).strip() == name
