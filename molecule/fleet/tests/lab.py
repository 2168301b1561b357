"""What the fleet scenario's tests share: its hosts and instances, running the repository's playbooks against
them, and reading an instance's state from inside its host."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
INVENTORY = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent
REPORTS = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "reports"
HOSTS = {"fleet-1": "10.89.77.21", "fleet-2": "10.89.77.22"}
# Each lab host's two CPU slots: the plan's instances and their ports (inventories/lab/group_vars/lab_nodes.yml).
INSTANCES = {"cpu0": 8000, "cpu1": 8001}
GATEWAY_HOST = "fleet-gw"
GATEWAY = "https://10.89.77.20"
CACHE = Path(os.environ.get("CACHE_DIR", ROOT / ".cache"))
CA = CACHE / "lab" / "pki" / "ca.crt"
KEYS = CACHE / "lab" / "api-keys"
OUTPUTS = []  # every play's output, searched for keys at the end
ENV = dict(os.environ, PYTHONPATH=str(ROOT / "src"))


def playbook(path, *extra):
    """Run a playbook of the repository against the scenario's hosts; return (rc, output)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default", ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(INVENTORY), str(ROOT / path),
           "-e", f"vllm_report_dir={REPORTS}", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    OUTPUTS.append(proc.stdout + proc.stderr)
    return proc.returncode, proc.stdout + proc.stderr


def site(*extra, run_id):
    """Run site.yml against the scenario's hosts; return (rc, output)."""
    return playbook("site.yml", "-e", f"vllm_verify_report_run_id={run_id}", *extra)


def recap(output):
    """The play recap of a run: {host: {"ok": n, "changed": n, "failed": n, ...}}."""
    found = {}
    for line in output.split("PLAY RECAP", 1)[-1].splitlines()[1:]:
        name, sep, counts = line.partition(" : ")
        if not sep:
            break
        found[name.strip()] = {key: int(value) for key, value in (pair.split("=") for pair in counts.split())}
    return found


def on(host, *cmd, check=True):
    """A command inside a lab host; its stdout."""
    return subprocess.run(["podman", "exec", host, *cmd], capture_output=True, text=True, check=check).stdout


def args_of(host, instance="cpu0"):
    return json.loads(on(host, "cat", f"/etc/vllm/{instance}.args.json"))


def value_after(args, flag):
    return args[args.index(flag) + 1]


def unit_mtime(host, instance="cpu0"):
    return on(host, "stat", "-c", "%Y", f"/etc/systemd/system/vllm@{instance}.service").strip()


def state(host):
    """What a change may not touch: each instance's arguments and unit file time."""
    return {instance: (args_of(host, instance), unit_mtime(host, instance)) for instance in INSTANCES}


HISTORY = ("import json, os, sys; d = '/etc/vllm/releases/' + sys.argv[1]; print(json.dumps({'current': "
           "open(d + '/current').read().strip(), 'entries': {n: json.load(open(os.path.join(d, n, 'release.json'))) "
           "for n in os.listdir(d) if os.path.isfile(os.path.join(d, n, 'release.json'))}}))")


def history(host, instance="cpu0"):
    """The instance's release history on the host: (the current entry, {entry: release.json})."""
    data = json.loads(on(host, "python3", "-c", HISTORY, instance))
    return data["current"], data["entries"]


def serves(host, instance="cpu0"):
    """A real completion from the instance, from inside its host."""
    body = json.dumps({"model": "tiny-qwen2", "prompt": "Hello", "max_tokens": 4})
    out = on(host, "curl", "-s", "-m", "30", f"http://{HOSTS[host]}:{INSTANCES[instance]}/v1/completions",
             "-H", "Content-Type: application/json", "-d", body, check=False)
    return bool(out) and bool(json.loads(out).get("choices"))


def gateway_state(server):
    """A backend server's status at the gateway (UP, DRAIN, MAINT, DOWN), from HAProxy's runtime API."""
    out = on(GATEWAY_HOST, "sh", "-c", "echo 'show stat' | socat stdio /run/vllm-gateway/admin.sock")
    for line in out.splitlines():
        fields = line.split(",")
        if fields[:2] == ["vllm", server]:
            return fields[17]
    raise AssertionError(f"{server} is not a server of the gateway: {out[:500]}")
