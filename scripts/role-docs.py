#!/usr/bin/env python3
"""Write each role's variable page from its meta/argument_specs.yml, and the project README's list of roles.

    scripts/role-docs.py          rewrite, between the markers, roles/<role>/README.md (every entry point of the
                                  role's spec: its short description, description and options table; the page is
                                  created when the role has none) and README.md's list of roles
    scripts/role-docs.py --check  exit 1, naming each page, when any is not what the specs give

Every role with a meta/argument_specs.yml gets a page, so a role added later needs only this script run again.
Text outside the markers is the role's own and is kept as it is.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- role-variables:begin (scripts/role-docs.py) -->", "<!-- role-variables:end -->"
LEGEND = (
    "Generated from `meta/argument_specs.yml` by `scripts/role-docs.py` (a unit test keeps them in step). "
    'Variables marked "inventory" come from group_vars or host_vars.'
)
# Ansible's documentation markup: C(code), V(value), O(option)... shown as Markdown.
MARKUP = re.compile(r"\b([BCEIMOPV])\(([^()]*(?:\([^()]*\)[^()]*)*)\)")


def prose(text: Any) -> str:
    """One line of a spec's text as Markdown: Ansible's markup as code (bold, italic), and outside code spans
    `<` and `>` as entities (a Markdown page would take `<instance>` for an HTML tag and show nothing)."""

    def one(match: re.Match[str]) -> str:
        kind, inner = match.groups()
        return f"**{inner}**" if kind == "B" else f"*{inner}*" if kind == "I" else f"`{inner}`"

    parts = MARKUP.sub(one, " ".join(str(text).split())).split("`")
    for i in range(0, len(parts), 2):  # the even parts lie outside code spans
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def paragraphs(value: Any) -> list[str]:
    """A spec's description (a string or a list of paragraphs) as paragraphs of one line each."""
    items = value if isinstance(value, list) else [value] if value else []
    return [prose(item) for item in items if str(item).strip()]


def cell(value: Any) -> str:
    # A scalar dumps as a document of its own, ending in "..."; the cell shows the value only.
    if isinstance(value, str):
        text = value
    else:
        text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()
    text = " ".join(str(text).split()).replace("|", "\\|")
    return f"`{text}`" if text else ""


def options_table(options: dict[str, Any]) -> list[str]:
    if not options:
        return ["No options."]
    out = ["| variable | type | default | description |", "| --- | --- | --- | --- |"]
    for name, option in options.items():
        kind = str(option.get("type", "str"))
        if option.get("elements"):
            kind += f" of {option['elements']}"
        if option.get("choices"):
            kind += " (" + ", ".join(map(str, option["choices"])) + ")"
        if "default" in option:
            default = cell(option["default"])
        else:
            default = "required" if option.get("required") else "inventory"
        desc = " ".join(paragraphs(option.get("description", ""))).replace("|", "/")
        out.append(f"| `{name}` | {kind} | {default} | {desc} |")
    return out


def specs(spec_file: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(spec_file.read_text(encoding="utf-8")) or {}
    return dict(loaded.get("argument_specs") or {})


def role_block(entries: dict[str, Any]) -> str:
    """Every entry point of a role, `main` first, then in the spec's order."""
    out = [LEGEND, ""]
    for name in sorted(entries, key=lambda entry: entry != "main"):
        spec = entries[name] or {}
        short = prose(spec.get("short_description", ""))
        out += [f"### Entry point `{name}`" + (f": {short}" if short else ""), ""]
        if name != "main":
            out += [f"Run with `tasks_from: {name}`.", ""]
        for paragraph in paragraphs(spec.get("description")):
            out += [paragraph, ""]
        out += [*options_table(dict(spec.get("options") or {})), ""]
    return "\n".join(out)


def replace_block(text: str, block: str) -> str | None:
    """text with what lies between the markers replaced by block; None when the markers are missing."""
    if BEGIN not in text or END not in text:
        return None
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{block}{END}{tail}"


def role_page(role: str, entries: dict[str, Any], current: str | None) -> str:
    block = role_block(entries)
    if current is None:
        short = prose((entries.get("main") or {}).get("short_description", ""))
        intro = f"{short.rstrip('.')}.\n\n" if short else ""
        return f"# {role}\n\n{intro}## Variables\n\n{BEGIN}\n{block}{END}\n"
    replaced = replace_block(current, block)
    if replaced is not None:
        return replaced
    return f"{current.rstrip()}\n\n## Variables\n\n{BEGIN}\n{block}{END}\n"


def roles_list(roles: dict[str, dict[str, Any]]) -> str:
    out = []
    for role, entries in roles.items():
        short = prose((entries.get("main") or {}).get("short_description", ""))
        points = ", ".join(f"`{name}`" for name in sorted(entries, key=lambda entry: entry != "main"))
        out.append(f"- [`{role}`](roles/{role}/README.md): {short} (entry points: {points})")
    return "\n".join(out) + "\n"


def pages() -> dict[Path, str | None]:
    """Each page's path and what it should hold (None: README.md lacks the markers)."""
    roles = {p.parent.parent.name: specs(p) for p in sorted(ROOT.glob("roles/*/meta/argument_specs.yml"))}
    out: dict[Path, str | None] = {}
    for role, entries in roles.items():
        page = ROOT / "roles" / role / "README.md"
        out[page] = role_page(role, entries, page.read_text(encoding="utf-8") if page.exists() else None)
    readme = ROOT / "README.md"
    out[readme] = replace_block(readme.read_text(encoding="utf-8"), roles_list(roles))
    return out


def main(argv: list[str]) -> int:
    check = "--check" in argv
    failed = False
    for path, text in pages().items():
        name = path.relative_to(ROOT)
        if text is None:
            print(f"{name} lacks the markers {BEGIN} ... {END}")
            failed = True
        elif not path.exists() or path.read_text(encoding="utf-8") != text:
            if check:
                print(f"{name} is out of date with the roles' argument specs: run scripts/role-docs.py")
                failed = True
            else:
                path.write_text(text, encoding="utf-8")
                print(f"wrote {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
