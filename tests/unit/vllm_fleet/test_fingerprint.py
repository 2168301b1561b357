"""vllm_fleet.fingerprint and the vllm_fingerprint filter: the digest of what a host should run, which site.yml's fast
path compares with the one recorded after the host's last verified rollout."""

from __future__ import annotations

from conftest import ROOT, load_source
from vllm_fleet import fingerprint, planner

plugin = load_source("vllm_fast_path_filter", ROOT / "plugins" / "filter" / "vllm_fast_path.py")
HOST = {
    "vllm_profile_name": "cpu-lab-tiny",
    "vllm_version": "0.32.0",
    "vllm_api_key": "sk-lab-1",
    "vllm_gpu": {"name": "cpu", "memory_mib": 1024, "bandwidth_gb_s": 20, "count": 2},
    "vllm_environment": {"VLLM_CPU_KVCACHE_SPACE": "1"},
}


def _digest(**over):
    values = dict(HOST, **over)
    entry = planner.plan_host("lab-1", values)
    return plugin.vllm_fingerprint(values, "lab-1", entry, {"ipv4": ["10.89.77.10/32"], "ipv6": []})


def test_the_same_inputs_give_the_same_digest():
    assert _digest() == _digest()
    assert len(_digest()) == 64


def test_any_change_of_what_the_host_runs_changes_it():
    base = _digest()
    changed = [
        _digest(vllm_profile={"max_num_seqs": 6}),  # the plan's arguments
        _digest(vllm_environment={"VLLM_CPU_KVCACHE_SPACE": "2"}),  # the environment file
        _digest(vllm_api_key="sk-lab-2"),  # a secret, by its digest
        _digest(vllm_version="0.33.0"),  # the release
        _digest(vllm_syscall_filter=["@system-service", "@io-event"]),  # a unit setting
        _digest(vllm_sentinel_service_template="/site/vllm-sentinel.service.j2"),  # the sentinel role's setting
    ]
    assert base not in changed and len(set(changed)) == len(changed)
    values = dict(HOST)
    entry = planner.plan_host("lab-1", values)
    other_gateway = plugin.vllm_fingerprint(values, "lab-1", entry, {"ipv4": ["10.89.77.99/32"], "ipv6": []})
    assert other_gateway != base  # the firewall admits another gateway


def test_the_secret_is_never_in_what_is_hashed_in_clear(monkeypatch):
    seen = []
    real = fingerprint.digest
    monkeypatch.setattr(fingerprint, "digest", lambda value: seen.append(value) or real(value))
    _digest()
    final = seen[-1]
    assert "sk-lab-1" not in repr(final["variables"])
    assert final["variables"]["vllm_api_key"] == real("sk-lab-1")


def test_the_roles_code_is_part_of_it(tmp_path):
    (tmp_path / "role").mkdir()
    (tmp_path / "role" / "main.yml").write_text("a: 1\n")
    before = fingerprint.tree_digest([str(tmp_path / "role")])
    fingerprint._tree.cache_clear()
    (tmp_path / "role" / "main.yml").write_text("a: 2\n")
    assert fingerprint.tree_digest([str(tmp_path / "role")]) != before
    assert all((ROOT / p.split(str(ROOT) + "/", 1)[-1]).exists() for p in plugin.ROLE_CODE)
    # The host's sentinel (its program, tasks) is part of what the host runs.
    assert plugin.os.path.join(plugin.ROOTDIR, "roles", "vllm_sentinel") in plugin.ROLE_CODE
