"""What the repository tracks: the folders scripts/bootstrap.sh builds stay out of it, whatever they are (a folder,
or a link made by hand to another checkout's, which an ignore rule ending in / would not match)."""

import ast
import re
import subprocess

import pytest
import yaml

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


def test_the_roles_reach_the_templates_folder_through_one_variable():
    """Every template a role renders from the project's templates/ is `{{ vllm_templates_dir }}/<file>` (or the
    role's copy of that one variable), the file is there, and that folder is the only setting that climbs out of a
    role to reach it."""
    import yaml

    templates = {p.name for p in (ROOT / "templates").iterdir()}
    seen = set()
    for defaults in sorted(ROOT.glob("roles/*/defaults/main.yml")):
        for name, value in (yaml.safe_load(defaults.read_text()) or {}).items():
            if not isinstance(value, str) or ("/../" not in value and not name.endswith("_template")):
                continue
            if name.endswith("templates_dir"):  # vllm_templates_dir, or a role's copy of it
                assert value in (
                    "{{ role_path }}/../../templates",
                    "{{ vllm_templates_dir | default(role_path ~ '/../../templates') }}",
                ), defaults
                continue
            folder = (
                "{{ vllm_templates_dir }}/"
                if defaults.parts[-3] == "vllm"
                else "{{ %s_templates_dir }}/" % defaults.parts[-3]
            )
            assert value.startswith(folder), f"{defaults}: {name}: {value}"
            assert value.removeprefix(folder) in templates, f"{defaults}: {name}: {value}"
            seen.add(value.rsplit("/", 1)[1])
    assert seen == templates, "a file in templates/ that no role renders"


def test_host_keys_are_checked_for_every_inventory_but_the_labs():
    """ansible.cfg checks host keys; only the lab's throw-away containers (new keys every time) turn it off, in the
    lab inventory's own group_vars, and the production example does not."""
    import configparser

    import yaml

    config = configparser.ConfigParser()
    config.read(ROOT / "ansible.cfg")
    assert config.getboolean("defaults", "host_key_checking") is True
    ssh_args = config.get("ssh_connection", "ssh_args", fallback="")
    assert "StrictHostKeyChecking=no" not in ssh_args and "UserKnownHostsFile=/dev/null" not in ssh_args
    lab = yaml.safe_load((ROOT / "lab" / "inventory" / "group_vars" / "lab.yml").read_text())
    assert lab["ansible_host_key_checking"] is False and "StrictHostKeyChecking=no" in lab["ansible_ssh_common_args"]
    production = "".join(p.read_text() for p in (ROOT / "inventories" / "production").rglob("*.yml"))
    assert "StrictHostKeyChecking" not in production and "host_key_checking" not in production


# The product (what an operator runs) and its proof (the lab, the GPU harness and GPU-host scripts, the recorded runs)
# live apart; the product never loads a file of the proof. A data file may name where a figure came from (the keys
# of PROVENANCE), which loads nothing.
PRODUCT = ("site.yml", "playbooks", "roles", "plugins", "src", "templates", "inventories")
PROOF = re.compile(r"(?<![\w.-])(lab/(playbooks|inventory|scripts)|gpu/(bench|host|inventory)|results/)")
PROVENANCE = {"source", "checked_against", "results"}


def _strings(node, key=None):
    """Every string value of parsed YAML with the key it sits under."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, k)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v, key)
    elif isinstance(node, str):
        yield key, node


def _code_strings(path):
    """A Python file's string constants, docstrings left out (they describe; they load nothing)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def test_the_product_never_loads_the_lab_or_the_gpu_harness():
    files = [ROOT / p for p in _git("ls-files", *PRODUCT).split()]
    assert len(files) > 100 and not [f for f in files if PROOF.match(str(f.relative_to(ROOT)))]
    found = []
    for path in files:
        if path.suffix in (".yml", ".yaml"):
            for key, value in _strings(yaml.safe_load(path.read_text(encoding="utf-8"))):
                if key not in PROVENANCE and PROOF.search(value):
                    found.append(f"{path.relative_to(ROOT)}: {key}: {value[:80]}")
        elif path.suffix == ".py":
            found += [
                f"{path.relative_to(ROOT)}: {s[:80]!r}"
                for s in _code_strings(path)
                if PROOF.search(s) and not s.lstrip().startswith(("-", "#"))
            ]
        elif path.suffix in (".j2", ".sh"):
            found += [
                f"{path.relative_to(ROOT)}: {line.strip()[:80]}"
                for line in path.read_text().splitlines()
                if PROOF.search(line) and not line.lstrip().startswith(("#", "{#"))
            ]
    assert not found, "the product loads files of the lab or the GPU harness:\n" + "\n".join(found)


def test_the_product_never_imports_the_labs_clients():
    """tests/labtools (streamload, probe, conversations, failover) load and watch a fleet for the tests, the scenarios
    and the benchmarks; the library, the plugins and the roles' programs never import them (nor the wheel ship them)."""
    assert not (ROOT / "src" / "labtools").exists()
    files = [ROOT / p for p in _git("ls-files", *PRODUCT).split() if p.endswith(".py")]
    assert len(files) > 50
    found = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "labtools"]
    assert not found, "the product imports the lab's clients:\n" + "\n".join(found)


def test_the_proof_has_folders_of_its_own():
    """Lab, GPU harness and recorded runs each have a folder; docs/ keeps the operator's pages only."""
    for folder in (
        "lab/playbooks",
        "lab/inventory",
        "lab/scripts",
        "gpu/bench",
        "gpu/host",
        "gpu/inventory",
        "results/gpu",
    ):
        assert _git("ls-files", folder).strip(), f"{folder} is empty"
    docs = _git("ls-files", "docs").split()
    assert docs and all(d.endswith(".md") and d.count("/") == 1 for d in docs), docs


def test_no_binary_file_is_tracked_outside_the_recorded_runs():
    """Binary objects are fetched or built by a script (gpu/bench/run.sh jit-cache save), never committed; only the
    recorded runs under results/ keep their raw archives (what a GPU run returned, which nothing can rebuild)."""
    empty_tree = _git("hash-object", "-t", "tree", "/dev/null").strip()
    numstat = _git("diff", "--cached", "--numstat", empty_tree).splitlines()
    binary = [line.split("\t")[2] for line in numstat if line.startswith("-\t-\t")]
    assert binary, "the check sees no binary at all: the runs' raw archives under results/ should be found"
    assert [p for p in binary if not p.startswith("results/")] == []
