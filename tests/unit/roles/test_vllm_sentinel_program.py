"""The sentinel's program (roles/vllm_sentinel/files/vllm-sentinel.py), its pieces and its rounds, here on the
controller.

Its Xid parsing against lines the NVIDIA driver writes (each quoted from where it was published); drift against a
recorded release in a temporary folder; its metrics read back with prometheus_client's parser; its agent and metrics
answers through real pipes and, as their socket units start them, through a listening socket handed over as
systemd hands it (LISTEN_FDS); and its round's decisions (when to heal,
the budget, a busy engine, a start, a pause, Xid codes) with the host's probes replaced by recorded answers, since
this machine runs no vLLM unit. The whole of it on real hosts: molecule/fleet/tests/test_sentinel.py.
"""

import http.server
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from conftest import ROOT, load_source, socket_activated

PROGRAM = ROOT / "roles" / "vllm_sentinel" / "files" / "vllm-sentinel.py"
DEFAULTS = yaml.safe_load((ROOT / "roles" / "vllm_defaults" / "defaults" / "main.yml").read_text())


def load():
    sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))
    spec = importlib.util.spec_from_file_location("vllm_sentinel_program", PROGRAM)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sentinel = load()
_filters = load_source("systemd_args_filter", ROOT / "plugins" / "filter" / "systemd_args.py")
systemd_env_quote, systemd_env_value = _filters.systemd_env_quote, _filters.systemd_env_value
XID = {
    "reset": DEFAULTS["vllm_sentinel_xid_reset"],
    "reboot": DEFAULTS["vllm_sentinel_xid_reboot"],
    "ignore": DEFAULTS["vllm_sentinel_xid_ignore"],
    "journal_match": ["_TRANSPORT=kernel"],
    "nvidia_smi": "nvidia-smi",
}


def config(tmp_path, **overrides):
    base = {
        "host": "gpu-1",
        "act": True,
        "interval_s": 10,
        "probe_timeout_s": 10,
        "verify_timeout_s": 30,
        "failures": 2,
        "heals_per_hour": 3,
        "health_timeout_s": 60,
        "gateways": 2,
        "agent_wait_s": 1,
        "run_dir": str(tmp_path / "run"),
        "state_dir": str(tmp_path / "state"),
        "pause_file": str(tmp_path / "paused-until"),
        "xid": XID,
        "instances": [instance(tmp_path, "gpu0", [0]), instance(tmp_path, "gpu1", [1])],
    }
    base.update(overrides)
    return base


def instance(tmp_path, name, gpus):
    etc = tmp_path / "etc"
    return {
        "name": name,
        "unit": f"vllm@{name}.service",
        "url": "http://127.0.0.1:1",
        "model": "m",
        "gpus": gpus,
        "unit_path": str(etc / f"vllm@{name}.service"),
        "env_path": str(etc / f"{name}.env"),
        "args_path": str(etc / f"{name}.args.json"),
        "releases_dir": str(etc / "releases" / name),
    }


# ---------------------------------------------------------------------------------------------------- Xid

# Lines as published: NVIDIA's Xid catalogue and its driver's format (open-gpu-kernel-modules kernel_rc.c), a cloud
# provider's GPU health guide (modal.com/docs/guide/gpu-health), NVSentinel issue #155, a GB200 NVLink5 line, the
# MIG form, and an older driver's form without "PCI:".
LINES = [
    ("NVRM: Xid (PCI:0000:c6:00): 79, pid=1101234, name=nvc:[driver], GPU has fallen off the bus.", "0000:c6:00", 79),
    ("NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus", "0000:44:00", 79),
    ("NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000", "0018:01:00", 149),
    (
        "NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:00): 13, Graphics Exception: ESR 0x404600=0x80000001",
        "0000:3b:00",
        13,
    ),
    ("NVRM: Xid (0000:03:00): 14, Channel 00000001", "0000:03:00", 14),
    ("NVRM: Xid (PCI:0000:01:00): 31, pid=2415, name=python3, Ch 00000008, intr 10000000. MMU Fault", "0000:01:00", 31),
]


@pytest.mark.parametrize("line,bus,code", LINES, ids=[str(c) + "-" + b for _, b, c in LINES])
def test_an_xid_line_gives_its_card_and_code(line, bus, code):
    hit = sentinel.XID.search("kernel: " + line)
    assert hit is not None
    assert (sentinel.bus_key(hit.group(1)), int(hit.group(2))) == (bus, code)


def test_lines_that_are_not_xid_give_nothing():
    for line in (
        "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module",
    ):
        assert sentinel.XID.search(line) is None


def test_nvidia_smis_bus_ids_are_read_in_the_kernels_form(monkeypatch):
    """`nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader` as the real H200 answered (its query-gpu.csv
    fixture, those two columns): 00000000:00:06.0 is the card the kernel names 0000:00:06."""
    rows = (ROOT / "tests" / "unit" / "fixtures" / "gpu" / "h200" / "query-gpu.csv").read_text().splitlines()
    header = [h.strip() for h in rows[0].split(",")]
    answer = "".join(
        "%s, %s\n" % (cells[header.index("index")], cells[header.index("pci.bus_id")])
        for cells in ([c.strip() for c in row.split(",")] for row in rows[1:] if row.strip())
    )
    monkeypatch.setattr(sentinel.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(argv, 0, answer, ""))
    assert sentinel.gpu_buses("nvidia-smi") == {0: "0000:00:06"}
    assert sentinel.bus_key("00000000:C6:00.0") == sentinel.bus_key("0000:c6:00") == "0000:c6:00"


def test_the_shipped_codes_sort_into_what_clears_them():
    action = lambda code: sentinel.xid_action(code, XID)  # noqa: E731
    assert [action(c) for c in (79, 154)] == ["reboot", "reboot"]
    assert [action(c) for c in (48, 95, 119, 120, 74)] == ["reset"] * 5
    assert [action(c) for c in (43, 45, 63, 92)] == ["ignore"] * 4
    assert [action(c) for c in (13, 31, 94, 8)] == ["restart"] * 4
    lists = [set(XID[k]) for k in ("reset", "reboot", "ignore")]
    assert not (lists[0] & lists[1] or lists[0] & lists[2] or lists[1] & lists[2])


def test_an_xid_marks_the_instances_of_its_card_or_all_when_the_card_is_unknown(tmp_path):
    instances = config(tmp_path)["instances"]
    buses = {0: "0000:01:00", 1: "0000:02:00"}
    assert sentinel.instances_of_bus(instances, buses, "0000:02:00") == ["gpu1"]
    assert sentinel.instances_of_bus(instances, buses, "0000:99:00") == ["gpu0", "gpu1"]
    assert sentinel.instances_of_bus(instances, {}, "0000:01:00") == ["gpu0", "gpu1"]


def test_the_journal_is_read_from_its_cursor_on(monkeypatch, tmp_path):
    """journalctl --output=json: MESSAGE as text or (not UTF-8) as a byte array; the cursor kept for the next round;
    before any entry matched, from the sentinel's first round on (an entry that is the first ever to match is read,
    not skipped as the journal's end)."""
    calls = []
    line = "NVRM: Xid (PCI:0000:01:00): 48, pid=7, name=python3, An uncorrectable double bit error"
    out = "\n".join(
        [
            json.dumps({"MESSAGE": line}),
            json.dumps({"MESSAGE": list(line.encode())}),
            json.dumps({"MESSAGE": "something else"}),
            "-- cursor: s=abc;i=42",
        ]
    )

    def run(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr(sentinel.subprocess, "run", run)
    state = {"journal_since": 1796359678}
    assert sentinel.xid_events(config(tmp_path), state) == [("0000:01:00", 48), ("0000:01:00", 48)]
    assert "--since=@1796359678" in calls[0] and "_TRANSPORT=kernel" in calls[0]
    assert state["cursor"] == "s=abc;i=42"
    sentinel.xid_events(config(tmp_path), state)
    assert "--after-cursor=s=abc;i=42" in calls[1]


# ---------------------------------------------------------------------------------------------------- drift


def recorded(tmp_path, name="gpu0"):
    """An instance's files and its verified release with the same files (what record_release.yml keeps)."""
    item = instance(tmp_path, name, [0])
    release = Path(item["releases_dir"]) / "20261204T000000-abc"
    release.mkdir(parents=True)
    (Path(item["releases_dir"]) / "current").write_text("20261204T000000-abc\n")
    files = {
        item["unit_path"]: "[Service]\nExecStart=/opt/vllm/venvs/x/bin/python launch serve /m --port 8000\n",
        item["env_path"]: 'HF_HUB_OFFLINE=1\nVLLM_API_KEY="sk-1"\n',
        item["args_path"]: json.dumps(["/m", "--port", "8000", "--api-key", "sk-1"]),
    }
    for path, text in files.items():
        Path(path).write_text(text)
        (release / os.path.basename(path)).write_text(text)
    return item


def test_no_drift_when_the_files_are_the_verified_release(tmp_path):
    assert sentinel.drift(recorded(tmp_path), None) == {}


def test_a_hand_edit_of_each_file_is_its_own_drift(tmp_path):
    item = recorded(tmp_path)
    Path(item["unit_path"]).write_text(Path(item["unit_path"]).read_text() + "# a hand edit\n")
    assert set(sentinel.drift(item, None)) == {"unit_file"}
    Path(item["env_path"]).write_text("HF_HUB_OFFLINE=0\n")
    Path(item["args_path"]).unlink()
    assert set(sentinel.drift(item, None)) == {"unit_file", "environment_file", "arguments_file"}


def test_nothing_verified_yet_is_no_drift(tmp_path):
    item = instance(tmp_path, "gpu0", [0])
    assert sentinel.drift(item, None) == {}


def test_the_running_command_line_and_environment_are_read_back(monkeypatch, tmp_path):
    """Flags only, never their values (an API key is a value)."""
    item = recorded(tmp_path)
    monkeypatch.setattr(sentinel, "process_arguments", lambda pid: ["/m", "--port", "8001", "--api-key", "sk-2", "--x"])
    monkeypatch.setattr(sentinel, "process_environment", lambda pid: {"HF_HUB_OFFLINE": "1", "VLLM_API_KEY": "sk-9"})
    found = sentinel.drift(item, "1234")
    assert found["command_line"] == "the running process: --api-key changed, --port changed, --x added"
    assert found["environment"] == "the running process differs in VLLM_API_KEY"
    assert "sk-" not in json.dumps(found)


def test_an_environment_file_is_read_as_systemd_reads_it():
    text = '# comment\nA=1\nB="two words"\nC=\'x\'\n\nD="a \\"quoted\\" word"\n'
    assert sentinel.env_file(text) == {"A": "1", "B": "two words", "C": "x", "D": 'a "quoted" word'}


# The production example's lab key (molecule/production/inventory/lab-layer.yml) and others with each character the
# role's writer escapes: what the sentinel reads back must be what vLLM's process was given, or its probes get 401.
@pytest.mark.parametrize("value", ['lab "key" \\ $HOME %h', "a`b`\\\\c", '\\"', "$$x\\$", "plain"])
def test_a_value_the_role_quotes_reads_back_exactly(value):
    text = "VLLM_API_KEY=" + systemd_env_quote(value) + "\n"
    assert sentinel.env_file(text)["VLLM_API_KEY"] == systemd_env_value(text, "VLLM_API_KEY") == value


class Answers(http.server.BaseHTTPRequestHandler):
    """A local server answering each POST with the status its path's last part names (200 with one token)."""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        code = int(self.server.code)
        body = json.dumps({"usage": {"completion_tokens": 1}} if code == 200 else {"error": "no"}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(
    ("code", "verdict"),
    [(200, "ok"), (401, "refused"), (404, "refused"), (429, "failed"), (500, "failed"), (503, "failed")],
)
def test_a_probe_refused_by_a_running_server_is_told_from_a_failed_one(code, verdict):
    server = http.server.HTTPServer(("127.0.0.1", 0), Answers)
    server.code = code
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    try:
        instance = {"url": "http://127.0.0.1:%d" % server.server_port, "model": "m"}
        assert sentinel.completion(instance, "k", 5)[0] == verdict
    finally:
        thread.join(10)
        server.server_close()


# ---------------------------------------------------------------------------------------------------- metrics, agent


def samples(text):
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_metrics_parse_and_name_each_instance_as_host_slash_instance(tmp_path):
    state = {"instances": {"gpu0": sentinel.fresh_entry()}, "last_round": 5.0}
    entry = state["instances"]["gpu0"]
    entry.update(failures=1, drift={"unit_file": "x"}, xid={"79": 2}, xid_at={"79": 3.0}, needs_operator=79)
    entry["heals"]["healed"] = 4
    entry["last_heal"] = {"out_s": 12.5, "serving_s": 40.0, "back_s": 43.0, "at": 1.0}
    found = samples(sentinel.render_metrics(config(tmp_path), state))
    one = (("instance", "gpu-1/gpu0"),)
    assert found[("vllm_sentinel_probe_failures", one)] == 1
    assert found[("vllm_sentinel_heals_total", (("instance", "gpu-1/gpu0"), ("result", "healed")))] == 4
    assert found[("vllm_sentinel_drift", (("instance", "gpu-1/gpu0"), ("what", "unit_file")))] == 1
    assert found[("vllm_sentinel_drift", (("instance", "gpu-1/gpu0"), ("what", "command_line")))] == 0
    xid = (("action", "reboot"), ("code", "79"), ("instance", "gpu-1/gpu0"))
    assert found[("vllm_sentinel_xid_total", xid)] == 2
    assert found[("vllm_sentinel_xid_needs_operator", one)] == 79
    assert found[("vllm_sentinel_last_heal_seconds", (("instance", "gpu-1/gpu0"), ("phase", "out")))] == 12.5
    assert ("vllm_sentinel_paused", ()) not in found  # read at each scrape, not at the round


def run_program(tmp_path, command, stdin, env=None):
    path = tmp_path / "sentinel.json"
    path.write_text(json.dumps(config(tmp_path)))
    return subprocess.run(
        [sys.executable, "-I", "-S", str(PROGRAM), command, "--config", str(path)],
        input=stdin,
        capture_output=True,
        env={**(env or {}), "PATH": os.environ["PATH"]},
        check=True,
    ).stdout


def test_the_agent_answers_the_instances_state_and_records_who_asked(tmp_path):
    assert run_program(tmp_path, "agent", b"gpu0\n", {"REMOTE_ADDR": "10.0.0.5"}) == b"up\n"
    sentinel.set_agent(config(tmp_path), "gpu0", "down")
    assert run_program(tmp_path, "agent", b"gpu0\n", {"REMOTE_ADDR": "10.0.0.5"}) == b"down\n"
    assert run_program(tmp_path, "agent", b"gpu0\n", {"REMOTE_ADDR": "10.0.0.6"}) == b"down\n"
    assert sentinel.agent_polls(config(tmp_path), "gpu0", 0, "down") == 2
    # A name that is not an instance's (a path, a wrong line) is answered "up" and records nothing.
    assert run_program(tmp_path, "agent", b"../../etc/passwd\n", {"REMOTE_ADDR": "10.0.0.7"}) == b"up\n"
    assert sorted(os.listdir(tmp_path / "run" / "polls")) == ["gpu0@10.0.0.5", "gpu0@10.0.0.6"]


def test_the_metrics_answer_is_http_with_the_last_rounds_file_and_the_pause_as_it_is_now(tmp_path):
    """A round while paused, then the rollout lifts the pause: the next scrape says so at once, though the next round
    may be an interval away (a scrape once read 1 for up to vllm_sentinel_interval_s after a failed rollout)."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.prom").write_text("# TYPE vllm_sentinel_gave_up gauge\nvllm_sentinel_gave_up 0\n")

    def scrape():
        answer = run_program(tmp_path, "metrics", b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200 OK") and b"version=0.0.4" in head
        assert b"Content-Length: %d\r\n" % len(body) in head + b"\r\n"
        return samples(body.decode())

    (tmp_path / "paused-until").write_text(str(int(sentinel.time.time()) + 600))
    assert scrape() == {("vllm_sentinel_gave_up", ()): 0, ("vllm_sentinel_paused", ()): 1}
    (tmp_path / "paused-until").unlink()  # what the vllm_sentinel role's resume does
    assert scrape() == {("vllm_sentinel_gave_up", ()): 0, ("vllm_sentinel_paused", ()): 0}
    # A file the program's earlier release wrote (the pause in it, from the last round): the pause once, as it is now.
    earlier = "# HELP vllm_sentinel_paused 1 while a rollout works on the host.\n# TYPE vllm_sentinel_paused gauge\n"
    (tmp_path / "run" / "metrics.prom").write_text(
        earlier + "vllm_sentinel_paused 1\n# TYPE vllm_sentinel_gave_up gauge\nvllm_sentinel_gave_up 0\n"
    )
    assert scrape() == {("vllm_sentinel_gave_up", ()): 0, ("vllm_sentinel_paused", ()): 0}
    answer = run_program(tmp_path, "metrics", b"GET /metrics HTTP/1.1\r\n\r\n").decode()
    assert answer.count("# TYPE vllm_sentinel_paused gauge") == 1
    assert run_program(tmp_path, "metrics", b"GET /other HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.0 404")


def served(tmp_path, command):
    """The program started as its socket unit starts it (Accept=no: conftest.socket_activated); returns (the process,
    the port)."""
    path = tmp_path / "sentinel.json"
    path.write_text(json.dumps(config(tmp_path)))
    return socket_activated([sys.executable, "-I", "-S", str(PROGRAM), command, "--config", str(path)])


def ask(port, question, timeout=10):
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as connection:
        connection.sendall(question)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


def test_one_process_answers_every_agent_check_while_a_silent_client_waits(tmp_path):
    """Under its socket unit the agent is one process answering every connection, each in a thread: a client that
    connects and sends nothing holds up no other, and each asker is recorded by its own address."""
    process, port = served(tmp_path, "agent")
    try:
        silent = socket.create_connection(("127.0.0.1", port), timeout=10)
        sentinel.set_agent(config(tmp_path), "gpu1", "down")
        # Each within 2 s, less than the silent client's time limit: it holds up no other connection.
        answers = [ask(port, b"gpu0\n" if n % 2 else b"gpu1\n", timeout=2) for n in range(40)]
        assert answers == [b"up\n" if n % 2 else b"down\n" for n in range(40)]
        assert sorted(os.listdir(tmp_path / "run" / "polls")) == ["gpu0@127.0.0.1", "gpu1@127.0.0.1"]
        assert ask(port, b"../../etc/passwd\n") == b"up\n"
        # The silent client is let go after the connection's time limit, answered "up" (a line that names nothing).
        silent.settimeout(sentinel.CONNECTION_TIMEOUT_S + 5)
        assert silent.recv(16) in (b"up\n", b"")
        silent.close()
        assert process.poll() is None, process.stderr.read().decode()
    finally:
        process.kill()
        process.wait(timeout=10)


def test_one_process_answers_every_scrape(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.prom").write_text("# TYPE vllm_sentinel_gave_up gauge\nvllm_sentinel_gave_up 0\n")
    process, port = served(tmp_path, "metrics")
    try:
        for _ in range(5):
            head, _, body = ask(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.0 200 OK"), head
            assert samples(body.decode()) == {("vllm_sentinel_gave_up", ()): 0, ("vllm_sentinel_paused", ()): 0}
        assert ask(port, b"GET /other HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.0 404")
        assert process.poll() is None, process.stderr.read().decode()
    finally:
        process.kill()
        process.wait(timeout=10)


# ---------------------------------------------------------------------------------------------------- rounds


class Host:
    """The host's side of a round, recorded: each unit's state, each probe's answer, the heals asked for."""

    def __init__(self, monkeypatch, answers, moving=False, healthy=True):
        self.answers, self.heals, self.probed = answers, [], []
        self.invocation = {"vllm@gpu0.service": "a", "vllm@gpu1.service": "b"}
        monkeypatch.setattr(
            sentinel,
            "unit_show",
            lambda unit: {
                "ActiveState": "active",
                "SubState": "running",
                "MainPID": "0",
                "InvocationID": self.invocation[unit],
            },
        )
        monkeypatch.setattr(sentinel, "health", lambda url, timeout: (200 if healthy else None, None, ""))
        counter = iter(range(0, 10**6, 7))
        monkeypatch.setattr(sentinel, "progress", lambda url: next(counter) if moving else 5)
        monkeypatch.setattr(sentinel.time, "sleep", lambda s: None)
        monkeypatch.setattr(sentinel, "xid_events", lambda config, state: [])
        monkeypatch.setattr(sentinel, "drift", lambda item, pid: {})
        monkeypatch.setattr(sentinel, "api_key_of", lambda item: "")

        def completion(item, key, timeout):
            self.probed.append(item["name"])
            return self.answers.get(item["name"], ("ok", "a token"))

        def heal(config, state, item, why):
            self.heals.append((item["name"], why))
            state["instances"][item["name"]]["failures"] = 0
            state["instances"][item["name"]]["heals"]["healed"] += 1

        monkeypatch.setattr(sentinel, "completion", completion)
        monkeypatch.setattr(sentinel, "heal", heal)


def state_of(tmp_path):
    return json.loads((tmp_path / "state" / "state.json").read_text())


def test_two_failed_probes_in_a_row_heal_the_instance_once(monkeypatch, tmp_path):
    host = Host(monkeypatch, {"gpu0": ("failed", "no answer within 10 s (timed out)")})
    cfg = config(tmp_path)
    sentinel.check(cfg)
    assert host.heals == [] and state_of(tmp_path)["instances"]["gpu0"]["failures"] == 1
    sentinel.check(cfg)
    assert host.heals == [("gpu0", "no answer within 10 s (timed out)")]
    assert state_of(tmp_path)["instances"]["gpu1"]["failures"] == 0


def test_a_refused_probe_is_counted_apart_and_never_heals(monkeypatch, tmp_path):
    host = Host(monkeypatch, {"gpu0": ("refused", "HTTP 401")})
    cfg = config(tmp_path)
    for _ in range(3):
        sentinel.check(cfg)
    entry = state_of(tmp_path)["instances"]["gpu0"]
    assert host.heals == [] and entry["failures"] == 0 and entry["refused"] == "HTTP 401"
    found = samples((tmp_path / "run" / "metrics.prom").read_text())
    assert found[("vllm_sentinel_probe_refused", (("instance", "gpu-1/gpu0"),))] == 1
    assert found[("vllm_sentinel_probe_refused", (("instance", "gpu-1/gpu1"),))] == 0
    host.answers.clear()
    sentinel.check(cfg)
    assert state_of(tmp_path)["instances"]["gpu0"]["refused"] == ""


def test_a_probe_that_times_out_while_tokens_move_is_a_busy_engine(monkeypatch, tmp_path):
    host = Host(monkeypatch, {"gpu0": ("failed", "no answer within 10 s (timed out)")}, moving=True)
    for _ in range(4):
        sentinel.check(config(tmp_path))
    assert host.heals == [] and state_of(tmp_path)["instances"]["gpu0"]["failures"] == 0


def test_an_instance_still_loading_is_not_probed(monkeypatch, tmp_path):
    host = Host(monkeypatch, {"gpu0": ("failed", "HTTP 503")}, healthy=False)
    for _ in range(3):
        sentinel.check(config(tmp_path))
    assert host.probed == [] and host.heals == []


def test_a_restart_by_someone_else_starts_the_count_again(monkeypatch, tmp_path):
    host = Host(monkeypatch, {"gpu0": ("failed", "HTTP 500")})
    sentinel.check(config(tmp_path))
    host.invocation["vllm@gpu0.service"] = "c"  # systemd or an operator restarted it between two rounds
    sentinel.check(config(tmp_path))
    assert host.heals == [] and state_of(tmp_path)["instances"]["gpu0"]["failures"] == 1


def test_past_the_budget_it_stops_acting_and_says_so(monkeypatch, tmp_path):
    host = Host(monkeypatch, {"gpu0": ("failed", "HTTP 500"), "gpu1": ("failed", "HTTP 500")})
    cfg = config(tmp_path, heals_per_hour=1, failures=1)
    sentinel.check(cfg)  # both fail: one heal, one instance of the host at a time
    assert [name for name, _ in host.heals] == ["gpu0"]
    sentinel.check(cfg)
    assert [name for name, _ in host.heals] == ["gpu0"]
    found = samples((tmp_path / "run" / "metrics.prom").read_text())
    assert found[("vllm_sentinel_gave_up", ())] == 1


def test_watching_only_never_heals(monkeypatch, tmp_path):
    host = Host(monkeypatch, {"gpu0": ("failed", "HTTP 500")})
    for _ in range(3):
        sentinel.check(config(tmp_path, act=False))
    assert host.heals == [] and state_of(tmp_path)["instances"]["gpu0"]["failures"] == 3


def test_the_rollouts_pause_is_written_and_waits_for_a_round_in_progress(monkeypatch, tmp_path):
    """`pause`: the file every round reads, then back once the round unit is no longer activating (a heal in it
    ended); a round that never ends is named, with the fix, after the wait."""
    states = iter(["activating", "activating", "inactive"])
    asked = []

    def systemctl(*args, **kw):
        asked.append(args)
        return subprocess.CompletedProcess(args, 0, next(states) + "\n", "")

    monkeypatch.setattr(sentinel, "systemctl", systemctl)
    monkeypatch.setattr(sentinel.time, "sleep", lambda s: None)
    cfg = config(tmp_path)
    assert sentinel.pause(cfg, 600, 60) == 0 and len(asked) == 3
    until = float((tmp_path / "paused-until").read_text())
    assert 590 < until - sentinel.time.time() <= 600
    assert sentinel.paused_until(cfg, sentinel.time.time()) == until
    states = iter(["activating"] * 10**6)
    clock = iter(range(0, 10**6, 30))
    monkeypatch.setattr(sentinel.time, "monotonic", lambda: next(clock))
    assert sentinel.pause(cfg, 600, 60) == 1


def test_a_pause_in_the_future_stops_every_probe(monkeypatch, tmp_path):
    host = Host(monkeypatch, {"gpu0": ("failed", "HTTP 500")})
    (tmp_path / "paused-until").write_text(str(int(sentinel.time.time()) + 600))
    for _ in range(3):
        sentinel.check(config(tmp_path, failures=1))
    assert host.probed == [] and host.heals == []
    assert samples(sentinel.render_paused(config(tmp_path), sentinel.time.time()))[("vllm_sentinel_paused", ())] == 1
    (tmp_path / "paused-until").write_text("1")  # expired: a run that stopped midway
    sentinel.check(config(tmp_path, failures=1))
    assert host.heals == [("gpu0", "HTTP 500")]


def test_an_xid_of_a_card_heals_its_instance_but_one_needing_a_reboot_only_marks_it(monkeypatch, tmp_path):
    host = Host(monkeypatch, {})
    events = [("0000:02:00", 13)]
    monkeypatch.setattr(sentinel, "xid_events", lambda config, state: events)
    monkeypatch.setattr(sentinel, "gpu_buses", lambda command: {0: "0000:01:00", 1: "0000:02:00"})
    sentinel.check(config(tmp_path))
    assert host.heals == [("gpu1", "NVIDIA Xid 13 on its card 0000:02:00")]
    events[:] = [("0000:01:00", 79)]
    sentinel.check(config(tmp_path))
    assert len(host.heals) == 1
    entry = state_of(tmp_path)["instances"]["gpu0"]
    assert entry["needs_operator"] == 79 and entry["xid"] == {"79": 1}


def test_a_heal_takes_the_instance_out_restarts_verifies_and_puts_it_back(monkeypatch, tmp_path):
    real_heal = sentinel.heal
    calls = []
    monkeypatch.setattr(sentinel, "systemctl", lambda *args, **kw: calls.append(args))
    monkeypatch.setattr(sentinel, "api_key_of", lambda item: "")
    cfg = config(tmp_path)
    told = []
    monkeypatch.setattr(sentinel, "wait_for_gateways", lambda c, name, word: told.append(word) or 0.5)
    outcome = [(True, "healthy")]

    def verify(config, item, key):
        assert (tmp_path / "run" / "agent" / "gpu0").read_text() == "down\n"  # out while it restarts
        return outcome[0]

    monkeypatch.setattr(sentinel, "verify", verify)
    state = {"instances": {"gpu0": sentinel.fresh_entry(), "gpu1": sentinel.fresh_entry()}}
    real_heal(cfg, state, cfg["instances"][0], "HTTP 500")
    assert told == ["down", "up"] and (tmp_path / "run" / "agent" / "gpu0").read_text() == "up\n"
    assert [c[0] for c in calls] == ["kill", "reset-failed", "restart"]
    assert state["instances"]["gpu0"]["heals"] == {"healed": 1, "failed": 0}
    outcome[0] = (False, "the completion after the restart: HTTP 500")
    real_heal(cfg, state, cfg["instances"][0], "HTTP 500")
    assert (tmp_path / "run" / "agent" / "gpu0").read_text() == "down\n"  # not verified: it stays out
    assert state["instances"]["gpu0"]["heals"] == {"healed": 1, "failed": 1}
    assert state["instances"]["gpu0"]["heal_failed"] and state["instances"]["gpu0"]["out"]
