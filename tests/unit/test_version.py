"""The project's version: one home (src/vllm_fleet/__init__.py's __version__), which pyproject.toml reads and every
other file that states the version agrees with, and CHANGELOG.md's shape (Keep a Changelog: a section per version,
newest first, the newest released one the package's version, every entry one or two lines).

:func:`stated_versions` is the one reader of the places that state our version outside its home; a place added later
(the collection's galaxy.yml, whose ``version`` every tracked galaxy.yml is already held to) gets a pattern there."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.version import Version

from conftest import ROOT
from vllm_fleet import __version__

# Semantic Versioning 2.0.0's own expression (https://semver.org, "Is there a suggested regular expression").
SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?"
)
VERSION = r"v?(\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?)"
# Text that states vllm-fleet's own version: the execution environment's image tag (vllm-fleet-ee:X), a pin or a
# file name (vllm-fleet==X, vllm_fleet-X), the words "vllm-fleet X" (a report's "by vllm-fleet X", a bundle's
# "(vllm-fleet X)"), and a bundle's trusted comment (vllm-fleet bundle NAME, ..., version X).
STATES_OUR_VERSION = (
    re.compile(r"vllm[-_]fleet[-\w]*(?:==|[:@=-])" + VERSION + r"\b"),
    re.compile(r"vllm-fleet " + VERSION + r"\b"),
    re.compile(r"vllm-fleet bundle [^\n]*?, version " + VERSION + r"\b"),
)
# The version's home, the file that keeps the history of every version, and the tests (whose data may name a
# version of their own, e.g. a bundle built at another one: they take the package's from vllm_fleet.__version__).
NOT_SWEPT = ("src/vllm_fleet/__init__.py", "CHANGELOG.md", "tests/")

CHANGELOG = ROOT / "CHANGELOG.md"
SECTION = re.compile(r"^## \[(?P<name>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?$")
KINDS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")  # Keep a Changelog 1.1.0's, in its order
LINE_MAX = 120


def _files() -> list[str]:
    """Every file of the checkout that git tracks or would (untracked files that are not ignored)."""
    try:
        listed = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"this test needs the checkout's git: {exc}")
    return sorted({path for path in listed.split("\0") if path and (ROOT / path).is_file()})


def stated_versions(path: str, text: str) -> list[str]:
    """The versions of vllm-fleet that the file at `path` (relative to the checkout) states: a galaxy.yml's
    ``version`` (the collection is this project), and wherever the text says vllm-fleet's version."""
    found: list[str] = []
    if Path(path).name == "galaxy.yml":
        data = yaml.safe_load(text)
        if isinstance(data, dict) and "version" in data:
            found.append(str(data["version"]))
    for pattern in STATES_OUR_VERSION:
        found += pattern.findall(text)
    return found


def test_the_version_is_semantic():
    assert SEMVER.fullmatch(__version__), f"{__version__!r} is not a semantic version (https://semver.org)"


def test_pyproject_reads_the_version_from_its_one_home():
    with (ROOT / "pyproject.toml").open("rb") as handle:
        pyproject = tomllib.load(handle)
    assert "version" not in pyproject["project"], 'pyproject.toml states a version; fix: dynamic = ["version"]'
    assert "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "vllm_fleet.__version__"}


def test_the_readers_find_our_version_where_it_is_stated():
    """Each pattern on the text it is meant for, and none on the versions of other things."""
    text = (
        "tags: [vllm-fleet-ee:1.2.3]\nvllm-fleet==1.2.4\nvllm_fleet-1.2.5.dist-info\nby vllm-fleet 1.2.6.\n"
        "vllm-fleet bundle lab, 3 files, 9 bytes, project 0123abc, version 1.2.7\n"
    )
    assert stated_versions("docs/x.md", text) == ["1.2.3", "1.2.4", "1.2.5", "1.2.6", "1.2.7"]
    others = 'version_added: "0.1.0"\nvllm_version: 0.32.0\nvllm-cpu 0.31.0\nansible-core==2.19.14\n'
    assert stated_versions("plugins/filter/x.yml", others) == []
    assert stated_versions("galaxy.yml", "namespace: vllm_fleet\nname: fleet\nversion: 1.2.8\n") == ["1.2.8"]


def test_every_other_file_states_the_packages_version():
    """Where a file names vllm-fleet's version (the execution environment's image tag, the docs' examples, a
    galaxy.yml), it is the package's: a release changes src/vllm_fleet/__init__.py and then each of these."""
    checked, wrong = [], []
    for path in _files():
        if path.startswith(NOT_SWEPT):
            continue
        try:
            text = (ROOT / path).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # a binary file (a recorded run's plot): it states nothing
        for version in stated_versions(path, text):
            checked.append(path)
            if version != __version__:
                wrong.append(f"{path}: {version}")
    assert not wrong, f"these state another version than vllm_fleet.__version__ {__version__}: {wrong}"
    # The places known today: the sweep reads them (a pattern that stopped matching would pass silently otherwise).
    assert {"execution-environment.yml", "docs/awx.md", "docs/air-gap.md", "galaxy.yml"} <= set(checked), sorted(
        set(checked)
    )


def _sections() -> list[tuple[str, str | None, list[str]]]:
    """CHANGELOG.md's version sections: (name, date or None, their lines)."""
    sections: list[tuple[str, str | None, list[str]]] = []
    for number, line in enumerate(CHANGELOG.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("## "):
            match = SECTION.fullmatch(line)
            assert match, f"CHANGELOG.md, line {number}: {line!r} is not '## [X.Y.Z] - YYYY-MM-DD' or '## [Unreleased]'"
            sections.append((match["name"], match["date"], []))
        elif sections:
            sections[-1][2].append(line)
    return sections


def test_the_changelog_has_a_section_per_version_newest_first():
    sections = _sections()
    assert sections and sections[0][:2] == ("Unreleased", None), "the first section is ## [Unreleased], undated"
    released = sections[1:]
    assert released, "no released version"
    for name, date, _ in released:
        assert SEMVER.fullmatch(name) and date, f"## [{name}] - {date}: a semantic version and its date"
    versions = [Version(name) for name, _, _ in released]
    assert versions == sorted(versions, reverse=True) and len(set(versions)) == len(versions), versions
    dates = [date for _, date, _ in released]
    assert dates == sorted(dates, reverse=True), dates
    assert released[0][0] == __version__, (
        f"the newest released section is {released[0][0]}, the package is {__version__}: a release moves "
        "[Unreleased]'s entries under its version"
    )


def test_each_section_groups_its_entries_by_kind_in_one_or_two_lines_each():
    for name, _, lines in _sections():
        kinds = [line[4:] for line in lines if line.startswith("### ")]
        assert all(kind in KINDS for kind in kinds), f"[{name}]: {kinds}; the kinds are {KINDS}"
        assert kinds == sorted(kinds, key=KINDS.index) and len(set(kinds)) == len(kinds), f"[{name}]: {kinds}"
        entries: list[list[str]] = []
        for line in lines:
            assert len(line) <= LINE_MAX, f"[{name}]: a line of {len(line)} characters: {line[:60]}..."
            if line.startswith("- "):
                entries.append([line])
            elif line.startswith("  ") and entries and entries[-1]:
                entries[-1].append(line)
            else:
                entries.append([])  # a heading, a blank line or a paragraph ends an entry
        long = [entry[0] for entry in entries if len(entry) > 2]
        assert not long, f"[{name}]: entries of more than two lines (link the docs instead): {long}"
        if name != "Unreleased":
            assert any(entries), f"[{name}] lists nothing"
