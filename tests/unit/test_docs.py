"""The operator's pages: a README read in ten minutes whose first two commands are the lab and the tests, every
relative link of the pages resolving to a file of the checkout, and every page of docs/ reachable from the README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import ROOT

README_MAX_BYTES = 20_000
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)


def _pages() -> list[Path]:
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md"]
    pages += sorted((ROOT / "docs").glob("*.md")) + sorted(ROOT.glob("roles/*/README.md"))
    return [page for page in pages if page.exists()]


def _links(text: str) -> list[str]:
    """The link targets of a Markdown page, those in code blocks and code spans left out."""
    prose = CODE_SPAN.sub("", FENCE.sub("", text))
    return INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose)


def _relative_targets(page: Path) -> list[tuple[str, Path]]:
    out = []
    for link in _links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", link, re.I) or link.startswith(("#", "/")):
            continue  # a URL, an anchor in the page itself, or a path from a web root (none is written)
        path = link.split("#", 1)[0].split("?", 1)[0]
        out.append((link, (page.parent / path).resolve()))
    return out


def test_the_link_reader_finds_links_outside_code_only() -> None:
    text = '[a](docs/a.md) `[b](b.md)` ![c](c.png "title")\n```\n[d](d.md)\n```\n[e]: e.md\n'
    assert _links(text) == ["docs/a.md", "c.png", "e.md"]


def test_the_readme_is_read_in_ten_minutes() -> None:
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes, over {README_MAX_BYTES}: move a section to docs/"


def test_the_readmes_first_two_commands_are_the_lab_and_the_tests() -> None:
    """The first code block starts the lab (set-up included), the second runs every test, exactly what .ci/run runs."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = [match.group(0).split("\n", 1)[1].rsplit("\n", 1)[0].strip() for match in FENCE.finditer(readme)]
    assert blocks[:2] == ["lab/scripts/lab.sh up", "scripts/test.sh"], blocks[:2]
    assert "exec scripts/test.sh" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


@pytest.mark.parametrize("page", _pages(), ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_of_the_checkout(page: Path) -> None:
    missing = [link for link, target in _relative_targets(page) if not target.exists()]
    outside = [link for link, target in _relative_targets(page) if not target.is_relative_to(ROOT)]
    assert not missing, f"{page.relative_to(ROOT)}: links to nothing: {missing}"
    assert not outside, f"{page.relative_to(ROOT)}: links out of the checkout: {outside}"


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    seen, todo = set(), [(ROOT / "README.md").resolve()]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".md" or not page.is_file():
            continue
        seen.add(page)
        todo += [target for _, target in _relative_targets(page)]
    unreachable = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in seen]
    assert not unreachable, f"pages no link from README.md leads to: {unreachable}"


def test_the_readme_links_every_roles_page() -> None:
    """Each role's variables live on its own page (scripts/role-docs.py); the README links each of them."""
    links = {target for _, target in _relative_targets(ROOT / "README.md")}
    roles = sorted(p.parent.parent.name for p in ROOT.glob("roles/*/meta/argument_specs.yml"))
    assert roles and not [r for r in roles if (ROOT / "roles" / r / "README.md").resolve() not in links]
