#!/usr/bin/env python3
"""Write the README's role-variable tables from each role's meta/argument_specs.yml.

    scripts/role-docs.py          rewrite the part of README.md between the markers
    scripts/role-docs.py --check  exit 1 when README.md is not what the specs give
"""
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- role-variables:begin (scripts/role-docs.py) -->", "<!-- role-variables:end -->"


def cell(value) -> str:
    # A scalar dumps as a document of its own, ending in "..."; the cell shows the value only.
    text = value if isinstance(value, str) else \
        yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()
    text = " ".join(str(text).split()).replace("|", "\\|")
    return f"`{text}`" if text else ""


def tables() -> str:
    out = []
    for spec_file in sorted(ROOT.glob("roles/*/meta/argument_specs.yml")):
        role = spec_file.parent.parent.name
        main = yaml.safe_load(spec_file.read_text())["argument_specs"]["main"]
        out += [f"### `{role}`: {main.get('short_description', '')}", "",
                "| variable | type | default | description |", "| --- | --- | --- | --- |"]
        for name, option in main.get("options", {}).items():
            kind = option.get("type", "str")
            if option.get("choices"):
                kind += " (" + ", ".join(map(str, option["choices"])) + ")"
            default = cell(option["default"]) if "default" in option else "inventory"
            desc = option.get("description", "")
            desc = " ".join(desc) if isinstance(desc, list) else desc
            out.append(f"| `{name}` | {kind} | {default} | {' '.join(desc.split()).replace('|', '/')} |")
        out.append("")
    return "\n".join(out)


def main() -> int:
    readme = ROOT / "README.md"
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        print(f"README.md lacks the markers {BEGIN} ... {END}")
        return 1
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{tables()}{END}{tail}"
    if "--check" in sys.argv:
        if new != text:
            print("README.md's role variables are out of date: run scripts/role-docs.py")
            return 1
        return 0
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
