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


def test_the_roles_reach_the_templates_folder_through_one_variable():
    """Every template a role renders from the project's templates/ is `{{ vllm_templates_dir }}/<file>` (or the
    role's copy of that one variable), the file is there, and that folder is the only setting that climbs out of a
    role to reach it."""
    import yaml

    templates = {p.name for p in (ROOT / "templates").iterdir()}
    seen = set()
    for defaults in sorted(ROOT.glob("roles/*/defaults/main.yml")):
        for name, value in (yaml.safe_load(defaults.read_text()) or {}).items():
            if not isinstance(value, str) or "/../" not in value and not name.endswith("_template"):
                continue
            if name.endswith("templates_dir"):  # vllm_templates_dir, or a role's copy of it
                assert value in ("{{ role_path }}/../../templates",
                                 "{{ vllm_templates_dir | default(role_path ~ '/../../templates') }}"), defaults
                continue
            folder = "{{ vllm_templates_dir }}/" if defaults.parts[-3] == "vllm" else \
                "{{ %s_templates_dir }}/" % defaults.parts[-3]
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
    lab = yaml.safe_load((ROOT / "inventories" / "lab" / "group_vars" / "lab.yml").read_text())
    assert lab["ansible_host_key_checking"] is False and "StrictHostKeyChecking=no" in lab["ansible_ssh_common_args"]
    production = "".join(p.read_text() for p in (ROOT / "inventories" / "production").rglob("*.yml"))
    assert "StrictHostKeyChecking" not in production and "host_key_checking" not in production
