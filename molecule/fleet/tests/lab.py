"""What the fleet scenario's tests share: its hosts and instances, running the repository's playbooks against
them, and reading an instance's state from inside its host."""

import csv
import io
import json
import os
import random
import re
import shutil
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from http.server import BaseHTTPRequestHandler
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# tests/browser.py: the headless browser the report page's unit test uses too; tests/labtools: the load and watch
# clients (streamload, probe, failover) the scenario runs.
sys.path.append(str(ROOT / "tests"))
import browser  # noqa: E402,F401
import serving  # noqa: E402
from labtools import failover  # noqa: E402

REPORTS = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "reports"
# The operator's inventory: a copy of Molecule's (its group_vars and host_vars links resolved into files), which the
# tests edit as an operator edits theirs (release(): vllm_version in each vLLM host's host_vars).
INVENTORY = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "operator-inventory"
shutil.rmtree(INVENTORY, ignore_errors=True)
shutil.copytree(Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent, INVENTORY, symlinks=False)
HOSTS = {"fleet-1": "10.89.77.21", "fleet-2": "10.89.77.22"}
# The two models the fleet serves, one per host (the tiny model's weights under two names: molecule/fleet/host_vars),
# each a backend of its own at the gateways.
MODELS = {"fleet-1": "tiny-qwen2", "fleet-2": "tiny-qwen2-b"}
# Each lab host's two CPU slots: the plan's instances and their ports (lab/inventory/group_vars/lab_nodes.yml).
INSTANCES = {"cpu0": 8000, "cpu1": 8001}
GATEWAY_HOST = "fleet-gw"
MONITORING_HOST = "fleet-mon"
PROMETHEUS = "http://10.89.77.23:9090"
# Where the lab's Alertmanager sends (lab/inventory/group_vars/vllm_monitoring.yml): this machine's address on the
# lab network, the network's gateway.
RECEIVER = ("10.89.77.1", 9099)
GATEWAY = "https://10.89.77.20"
# The two gateways and the address they share (molecule/fleet/host_vars: keepalived's VRRP, fleet-gw first).
GATEWAY_HOSTS = ("fleet-gw", "fleet-gw2")
GATEWAY_ADDRESSES = {"fleet-gw": "10.89.77.20", "fleet-gw2": "10.89.77.24"}
VIP = "10.89.77.29"
SHARED = f"https://{VIP}"
CACHE = Path(os.environ.get("CACHE_DIR", ROOT / ".cache"))
CA = CACHE / "lab" / "pki" / "ca.crt"
KEYS = CACHE / "lab" / "api-keys"
OUTPUTS = []  # every play's output, searched for keys at the end
RUNS = CACHE / "logs" / "fleet-runs"  # this verify's runs only (the outputs, checked for keys at the end)
shutil.rmtree(RUNS, ignore_errors=True)
# The library and the lab's clients, for the `python -m` commands the tests start (labtools.probe, .streamload, the
# library's report --merge).
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")]))


def playbook(path, *extra, timeout=1800):
    """Run a playbook of the repository against the scenario's hosts; return (rc, output). A run still going after
    `timeout` seconds is stopped and returns rc 124 with what it printed until then (its last task shows where it
    hung)."""
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
    )
    cmd = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i",
        str(INVENTORY),
        str(ROOT / path),
        "-e",
        f"vllm_report_dir={REPORTS}",
        *extra,
    ]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        rc, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as stopped:

        def text(part):
            return part.decode(errors="replace") if isinstance(part, bytes) else part or ""

        rc, output = 124, f"{text(stopped.stdout)}{text(stopped.stderr)}\n{path} stopped after {timeout} s"
    OUTPUTS.append(output)
    # Kept for after the scenario (its ephemeral folder goes with it): each run's tasks and their times.
    RUNS.mkdir(parents=True, exist_ok=True)
    (RUNS / f"{len(OUTPUTS):02d}-{Path(path).stem}-rc{rc}.log").write_text(" ".join(cmd[1:]) + "\n\n" + output)
    return rc, output


def site(*extra, run_id, timeout=1800):
    """Run site.yml against the scenario's hosts; return (rc, output)."""
    return playbook("site.yml", "-e", f"vllm_verify_report_run_id={run_id}", *extra, timeout=timeout)


def release(version):
    """Pin every vLLM host of the operator's inventory to `version` (its host_vars' vllm_version line), as an operator
    upgrades: the next site.yml rolls the change out."""
    for host in HOSTS:
        path = INVENTORY / "host_vars" / f"{host}.yml"
        text, count = re.subn(r"(?m)^vllm_version: .*$", f'vllm_version: "{version}"', path.read_text())
        assert count == 1, f"{path} has no vllm_version line"
        path.write_text(text)


def version_of(host, instance="cpu0"):
    """The vLLM version the instance reports (/version, from inside its host)."""
    out = on(host, "curl", "-s", "-m", "30", f"http://{HOSTS[host]}:{INSTANCES[instance]}/version", check=False)
    return json.loads(out).get("version") if out.startswith("{") else None


def recap(output):
    """The play recap of a run: {host: {"ok": n, "changed": n, "failed": n, ...}}."""
    found = {}
    for line in output.split("PLAY RECAP", 1)[-1].splitlines()[1:]:
        name, sep, counts = line.partition(" : ")
        if not sep:
            break
        found[name.strip()] = {key: int(value) for key, value in (pair.split("=") for pair in counts.split())}
    return found


def changed_tasks(output, host):
    """The names of the tasks (and handlers) that reported a change on the host, in the run's order."""
    found, task = [], None
    for line in output.splitlines():
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            task = line.split("[", 1)[1].rsplit("]", 1)[0]
        elif line.startswith(f"changed: [{host}]"):
            found.append(task)
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


HISTORY = (
    "import json, os, sys; d = '/etc/vllm/releases/' + sys.argv[1]; print(json.dumps({'current': "
    "open(d + '/current').read().strip(), 'entries': {n: json.load(open(os.path.join(d, n, 'release.json'))) "
    "for n in os.listdir(d) if os.path.isfile(os.path.join(d, n, 'release.json'))}}))"
)


def history(host, instance="cpu0"):
    """The instance's release history on the host: (the current entry, {entry: release.json})."""
    data = json.loads(on(host, "python3", "-c", HISTORY, instance))
    return data["current"], data["entries"]


def completion_request(host, instance):
    """curl's arguments for a 4-token completion of the instance: its URL, the JSON header and the body."""
    body = json.dumps({"model": MODELS[host], "prompt": "Hello", "max_tokens": 4})
    url = f"http://{HOSTS[host]}:{INSTANCES[instance]}/v1/completions"
    return [url, "-H", "Content-Type: application/json", "-d", body]


def serves(host, instance="cpu0"):
    """A real completion from the instance, from inside its host."""
    out = on(host, "curl", "-s", "-m", "30", *completion_request(host, instance), check=False)
    return bool(out) and bool(json.loads(out).get("choices"))


def why_not_served(host, instance="cpu0"):
    """What a failed serves() leaves to go on, as the assertion's message: the same request again with curl's own
    error and timings, the host's sockets on the instance's port, its nftables ruleset, the connection tracking
    entries for the port, the instance's last journal lines, and how long until the instance served from inside its
    host again (polled for up to 120 s: the test has already failed, this only measures the window)."""
    port = INSTANCES[instance]

    def run(*cmd):
        done = subprocess.run(["podman", "exec", host, *cmd], capture_output=True, text=True, check=False)
        return f"$ {' '.join(cmd)}  (rc {done.returncode})\n{done.stdout[-3000:]}{done.stderr[-1500:]}"

    timings = "connect %{time_connect} total %{time_total} http %{http_code}\n"
    parts = [
        run("curl", "-sS", "-m", "10", "-o", "/dev/null", "-w", timings, *completion_request(host, instance)),
        run("ss", "-tanpoi", f"( sport = :{port} or dport = :{port} )"),
        run("nft", "list", "ruleset"),
        run("sh", "-c", f"grep -w 'dport={port}' /proc/net/nf_conntrack | head -n 40"),
        run("journalctl", "-u", f"vllm@{instance}.service", "-n", "30", "--no-pager"),
    ]
    failed_at = time.monotonic()
    while time.monotonic() - failed_at < 120:
        if serves(host, instance):
            parts.append(f"served again {time.monotonic() - failed_at:.0f} s after the evidence was taken")
            break
        time.sleep(5)
    else:
        parts.append("still not served 120 s after the evidence was taken")
    return f"{host}/{instance} did not serve a completion from inside its host:\n" + "\n".join(parts)


def runtime_api(host, command, check=True):
    """One command to a gateway's HAProxy runtime API (socat on its admin socket, inside the gateway); the answer."""
    return on(host, "sh", "-c", f"echo '{command}' | socat stdio /run/vllm-gateway/admin.sock", check=check)


def backend_rows(host, check=True):
    """The model backends' rows in a gateway's `show stat` (CSV: one backend per served model, model-NAME), each a
    {column: value} row. A LoRA adapter's backend (model-ADAPTER too) is left out: its servers track the model's
    (`tracked`), whose row says their state, takes their drain and counts their model's requests."""
    text = runtime_api(host, "show stat", check=check).lstrip("# ")
    return [
        row
        for row in csv.DictReader(io.StringIO(text))
        if (row.get("pxname") or "").startswith("model-") and not row.get("tracked")
    ]


def gateway_state(server):
    """A backend server's status at the gateway (UP, DRAIN, MAINT, DOWN), from HAProxy's runtime API."""
    rows = backend_rows(GATEWAY_HOST)
    for row in rows:
        if row["svname"] == server:
            return row["status"]
    raise AssertionError(f"{server} is not a server of the gateway: {[r['svname'] for r in rows]}")


class AlertReceiver(serving.LocalServer):
    """The webhook Alertmanager sends to, on this machine for as long as a test waits for alerts: it records each
    alert of each notification (status, labels, start, time received). Use as a context manager."""

    def __init__(self):
        self.alerts = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                for alert in body.get("alerts") or []:
                    starts = datetime.fromisoformat(alert["startsAt"]).timestamp()  # RFC 3339, Z or an offset
                    receiver.alerts.append(
                        {
                            "status": alert.get("status"),
                            "labels": alert.get("labels") or {},
                            "starts_at": starts,
                            "received": time.time(),
                        }
                    )
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        super().__init__(Handler, RECEIVER)

    def wait(self, status, alertname, instance, timeout, since=0.0):
        """The first alert of that name and instance label received with that status (firing or resolved) that
        started at `since` (unix time) or later (Alertmanager may still deliver an earlier one), waiting at most
        `timeout` seconds; AssertionError with what was received otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for alert in self.alerts:
                labels = alert["labels"]
                if (alert["status"], labels.get("alertname"), labels.get("instance")) == (
                    status,
                    alertname,
                    instance,
                ) and alert["starts_at"] >= since:
                    return alert
            time.sleep(1)
        raise AssertionError(f"no {status} {alertname} for {instance} within {timeout} s; received: {self.alerts}")


def prometheus(path, **params):
    """One answer of the lab's Prometheus HTTP API (a GET), as JSON."""
    url = PROMETHEUS + path + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.loads(answer.read())


def wait_instance_not_down(instance, timeout=120):
    """Wait until Prometheus holds no VllmInstanceDown (pending or firing) for `instance` (host/instance), at most
    `timeout` seconds: a restart leaves the alert standing until the next scrape and evaluation, and a test that
    then stops the instance would see that alert go on, not a new one start."""
    deadline = time.monotonic() + timeout
    while any(
        a["labels"].get("alertname") == "VllmInstanceDown" and a["labels"].get("instance") == instance
        for a in prometheus("/api/v1/alerts")["data"]["alerts"]
    ):
        if time.monotonic() > deadline:
            raise AssertionError(f"Prometheus still holds VllmInstanceDown for {instance} after {timeout} s")
        time.sleep(2)


def load(url, model, seconds, max_requests, concurrency=8, max_tokens=300, stop=None):
    """A bounded load on one instance (at most `seconds` and `max_requests`, or until stop() is true): completions
    of short varied prompts (no prefix shared between requests; within one, a few words said three times, so that
    n-gram speculation finds something to propose), sampled at temperature 1, each generating max_tokens tokens
    (short prompts are admitted together, then their answers outgrow a small KV cache). Returns
    {"requests", "ok", "failed"}."""
    words = ["alpha", "bravo", "delta", "echo", "golf", "hotel", "kilo", "lima", "oscar", "papa", "tango", "zulu"]
    deadline = time.monotonic() + seconds
    counts = {"requests": 0, "ok": 0, "failed": 0}
    lock = threading.Lock()

    def worker(seed):
        rng = random.Random(seed)
        while time.monotonic() < deadline and not (stop and stop()):
            with lock:
                if counts["requests"] >= max_requests:
                    return
                counts["requests"] += 1
            prompt = " ".join([rng.choice(words) + str(rng.randrange(1000)) for _ in range(4)] * 3)
            body = json.dumps(
                {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 1.0, "ignore_eos": True}
            ).encode()
            request = urllib.request.Request(
                url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=120) as answer:
                    ok = bool(json.loads(answer.read()).get("choices"))
            except OSError:
                ok = False
            with lock:
                counts["ok" if ok else "failed"] += 1

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(worker, range(concurrency)))
    return counts


def vip_holders():
    """The gateways that hold the shared address now (ip addr, inside each; a stopped one holds nothing)."""
    return [host for host in GATEWAY_HOSTS if VIP in on(host, "ip", "-o", "addr", "show", "to", VIP, check=False)]


def sessions_by_server():
    """{backend server: sessions it was sent since its gateway started}, summed over the running gateways (the
    runtime API's show stat, stot)."""
    totals = {}
    for host in GATEWAY_HOSTS:
        for row in backend_rows(host, check=False):
            if row["svname"] not in ("BACKEND", "FRONTEND"):
                totals[row["svname"]] = totals.get(row["svname"], 0) + int(row["stot"] or 0)
    return totals


SETTLED = ("UP", "DRAIN", "UP (agent)", "DRAIN (agent)")


def wait_gateways_settled(timeout=120):
    """Wait until no request is in flight at any running gateway's backend servers (scur 0) and each is UP or DRAIN
    (DRAIN only as a test set it), at most `timeout` seconds: the prefix balance bounds each instance's load, so a
    request that finds its instance busy with another (a load loop's last answer, the monitoring of an earlier test)
    or down for a moment goes to the next one by design, and a test of where requests go must start from a settled
    gateway. AssertionError with the rows otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        rows = [
            (host, row["svname"], row["status"], row["scur"])
            for host in GATEWAY_HOSTS
            for row in backend_rows(host, check=False)
            if row["svname"] not in ("BACKEND", "FRONTEND")
        ]
        # HAProxy adds "(agent)" to a state the sentinel's agent check set or confirms; "UP 1/2" is on its way down.
        if rows and all(status in SETTLED and scur in ("", "0") for _, _, status, scur in rows):
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the gateways did not settle within {timeout} s (host, server, status, in flight): {rows}"
            )
        time.sleep(1)


def set_server_state(server, state):
    """Drain a backend server, or make it ready again, at every running gateway (HAProxy's runtime API), as the
    rollout's drain.yml and ready.yml do."""
    backend = next(
        row["pxname"] for host in GATEWAY_HOSTS for row in backend_rows(host, check=False) if row["svname"] == server
    )
    for host in GATEWAY_HOSTS:
        runtime_api(host, f"set server {backend}/{server} state {state}")


def watch_shared_address(seconds=120):
    """A watch of the shared address's /health from this machine (labtools.failover: every 50 ms, 0.5 s each)."""
    return failover.Watch(VIP, ssl.create_default_context(cafile=str(CA)), seconds=seconds)


def stop_gateway(host):
    """Stop a gateway's host (systemd's clean shutdown, as an operator's `poweroff`)."""
    subprocess.run(["podman", "stop", host], check=True, capture_output=True)


def kill_gateway(host):
    """Take a gateway's host away at once (podman kill: every process gets SIGKILL and its network goes, no clean
    stop of anything: as a power loss)."""
    subprocess.run(["podman", "kill", host], check=True, capture_output=True)


def start_gateway(host, timeout=120):
    """Start a stopped gateway's host again and wait until its SSH, HAProxy and keepalived run."""
    subprocess.run(["podman", "start", host], check=True, capture_output=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        units = subprocess.run(
            ["podman", "exec", host, "systemctl", "is-active", "ssh", "haproxy", "keepalived"],
            capture_output=True,
            text=True,
        )
        if units.returncode == 0:
            return
        time.sleep(1)
    raise AssertionError(f"{host} did not come back within {timeout} s: {units.stdout} {units.stderr}")


def stream_loop(run_id, seconds=1200, think=2, url=GATEWAY, connect_retries=0, models=None):
    """Start a bounded loop of streamed chat completions through the gateway (2 users at a time, each pausing
    `think` s between answers, so that the loop leaves the 2 cores to what it watches: with 4 users and 1 s, each
    instance's start took 80 to 106 s on the lab instead of 26 s, and the good change 1,178 s); stop() ends it and
    returns its result (labtools.streamload). One user streams each of the fleet's two models (MODELS), so both
    backends are under load. With `connect_retries`, a request that could not connect (1 s each) tries again, a
    quarter second apart, as the openai SDK's client does. `models`: the names streamed (a LoRA adapter's too), in place
    of the fleet's two models."""
    stop = REPORTS / f"{run_id}.gateway.stop"
    stop.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "labtools.streamload",
            "--url",
            url,
            "--connect-retries",
            str(connect_retries),
            "--connect-timeout",
            "1" if connect_retries else "120",
            "--key-file",
            str(KEYS / "lab-team-a"),
            "--cafile",
            str(CA),
            *(arg for model in sorted(set(models or MODELS.values())) for arg in ("--model", model)),
            "--concurrency",
            "2",
            "--max-tokens",
            "32",
            "--max-seconds",
            str(seconds),
            "--max-requests",
            "6000",
            "--stop-file",
            str(stop),
            "--think-seconds",
            str(think),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
    )

    def stop_loop():
        stop.touch()
        return json.loads(proc.communicate(timeout=180)[0])

    return stop_loop
