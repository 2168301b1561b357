#!/usr/bin/env python3
"""Time planning and rendering for a fleet of hosts (target: 200 hosts in under 30 s on 2 cores).

    benchmarks/plan_200_hosts.py                 # the library: plan + render of 200 hosts, cold and warm
    benchmarks/plan_200_hosts.py --playbook      # also ansible-playbook playbooks/plan.yml on a 200-host inventory
    benchmarks/plan_200_hosts.py --hosts 1000
    benchmarks/plan_200_hosts.py --playbook --hosts 10000 --ansible-venv V1 --ansible-venv V2 --repeat 2
                                                 # plan.yml with each venv's ansible-playbook, in turns

The hosts cycle through every shipped profile, two vLLM releases and a few single-key overrides, so
the caches see the variety a real inventory has. Hosts are fictitious (.invalid, addresses in 198.18.0.0/15, the
benchmarking range): nothing connects.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(ROOT, "src"))

from vllm_fleet import catalogue, planner, profiles, render, sizing  # noqa: E402

GPUS = {
    "rtx4090": {"name": "NVIDIA GeForce RTX 4090", "memory_mib": 24564, "bandwidth_gb_s": 1008, "count": 1},
    "l40": {"name": "NVIDIA L40", "memory_mib": 46068, "bandwidth_gb_s": 864, "count": 1},
    "cpu": {"name": "cpu", "memory_mib": 4096, "bandwidth_gb_s": 20, "count": 1},
}
OVERRIDES = [
    {},
    {"max_num_seqs": 32},
    {"gpu_memory_utilization": 0.93},
    {"kv_cache_dtype": "auto", "calculate_kv_scales": None},
]


def fleet(count):
    names = profiles.names()
    hosts = {}
    for i in range(count):
        name = names[i % len(names)]
        kind = "cpu" if name.startswith("cpu") else ("l40" if name.startswith("l40") else "rtx4090")
        hosts[f"gpu-{i:04d}.invalid"] = {
            "vllm_profile_name": name,
            "vllm_profile": OVERRIDES[(i // len(names)) % len(OVERRIDES)],
            "vllm_gpu": GPUS[kind],
            "vllm_version": ("0.32.0", "0.33.0")[i % 2],
            "vllm_extra_args": {"kv_cache_memory_bytes": 1 << 30} if kind == "cpu" else {},
            # RFC 2544's benchmarking range: the egress check needs each fleet host's address; nothing connects.
            "ansible_host": f"198.18.{i // 256}.{i % 256}",
        }
    return hosts


def clear_caches():
    for cached in (
        catalogue.catalogue,
        catalogue._catalogue_architecture,
        profiles._shipped,
        render.table,
        render.parse_version,
        render._era_cached,
        sizing.memory_model,
    ):
        cached.cache_clear()


def time_library(hosts):
    clear_caches()
    start = time.perf_counter()
    result = planner.plan_hosts(hosts)
    cold = time.perf_counter() - start
    start = time.perf_counter()
    planner.plan_hosts(hosts)
    warm = time.perf_counter() - start
    return result, cold, warm


def time_playbook(hosts, ansible_playbook=None):
    with tempfile.TemporaryDirectory() as tmp:
        inventory = os.path.join(tmp, "hosts.json")
        with open(inventory, "w", encoding="utf-8") as f:
            json.dump({"vllm_nodes": {"hosts": list(hosts)}, "_meta": {"hostvars": hosts}}, f)
        script = os.path.join(tmp, "inventory.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(f"#!{sys.executable}\nimport sys\nprint(open({inventory!r}).read())\n")
        os.chmod(script, 0o755)
        ansible_playbook = ansible_playbook or os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
        start = time.perf_counter()
        run = subprocess.run(
            [ansible_playbook, "-i", script, "playbooks/plan.yml", "-e", f"vllm_report_dir={tmp}/out"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        elapsed = time.perf_counter() - start
        if run.returncode not in (0, 2):  # 2: the planning errors the fleet holds on purpose (the plan's own stop)
            sys.stderr.write(run.stdout[-3000:] + run.stderr[-3000:])
        with open(os.path.join(tmp, "out", "plan.json"), encoding="utf-8") as f:
            planned = len(json.load(f)["hosts"])
        # The profile_tasks callback's recap (ansible.cfg): where the time went, largest first.
        recap = run.stdout.split("TASKS RECAP", 1)[-1].splitlines()
        costs = [line.strip() for line in recap if line.rstrip().endswith("s") and "---" in line][:8]
        return elapsed, run.returncode, planned, costs


def ansible_version(ansible_playbook):
    """'ansible-core X, Python Y' of an ansible-playbook (this Python's when None)."""
    ansible_playbook = ansible_playbook or os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    out = subprocess.run([ansible_playbook, "--version"], capture_output=True, text=True, check=True).stdout
    core = out.splitlines()[0].split("[core ", 1)[-1].rstrip("]")
    python = next((line.split("=", 1)[1].split()[0] for line in out.splitlines() if "python version" in line), "?")
    return f"ansible-core {core}, Python {python}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--playbook", action="store_true", help="also time ansible-playbook playbooks/plan.yml")
    parser.add_argument(
        "--ansible-venv",
        action="append",
        default=[],
        metavar="DIR",
        help="with --playbook: a virtualenv whose ansible-playbook runs the plan (repeat it to compare versions, "
        "run in turns); default: this Python's",
    )
    parser.add_argument(
        "--clean",
        action="store_true",
        help="leave out the hosts whose plan has errors, so that plan.yml runs to its end (its later plays: each "
        "host's sentinel, gateway, monitoring and egress checks)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="with --playbook: runs of each ansible-playbook")
    options = parser.parse_args()

    hosts = fleet(options.hosts)
    result, cold, warm = time_library(hosts)
    errors = sum(bool(e["errors"]) for e in result["hosts"].values())
    if options.clean:
        hosts = {name: host for name, host in hosts.items() if not result["hosts"][name]["errors"]}
    warnings = sum(bool(e["warnings"]) for e in result["hosts"].values())
    print(
        f"plan + render, {options.hosts} hosts ({len(profiles.names())} profiles x 2 releases x "
        f"{len(OVERRIDES)} overrides), {os.cpu_count()} CPUs"
    )
    print(f"  library, cold caches: {cold:.3f} s ({cold / options.hosts * 1000:.2f} ms/host)")
    print(f"  library, warm caches: {warm:.3f} s ({warm / options.hosts * 1000:.2f} ms/host)")
    print(f"  hosts with errors: {errors}, with warnings: {warnings}")
    if options.clean:
        print(f"  --clean: plan.yml runs over the {len(hosts)} hosts without errors")
    if options.playbook:
        players = [os.path.join(v, "bin", "ansible-playbook") for v in options.ansible_venv] or [None]
        worst = 0
        for run in range(options.repeat):
            for player in players:
                version = ansible_version(player)
                elapsed, rc, planned, costs = time_playbook(hosts, player)
                print(
                    f"  ansible-playbook playbooks/plan.yml ({version}), run {run + 1}: {elapsed:.1f} s, rc={rc}, "
                    f"{planned} hosts in plan.json"
                )
                for line in costs:
                    print(f"    {line}")
                worst = max(worst, 0 if rc in (0, 2) else 1)
        return worst
    return 0


if __name__ == "__main__":
    sys.exit(main())
