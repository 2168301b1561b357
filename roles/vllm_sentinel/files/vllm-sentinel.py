"""The sentinel of a vLLM host: takes an instance that stops answering out of every gateway, heals it, puts it back.

    vllm-sentinel check   [--config FILE]   one round (what vllm-sentinel.timer starts every interval)
    vllm-sentinel agent   [--config FILE]   answer the gateways' agent checks (vllm-sentinel-agent.service)
    vllm-sentinel metrics [--config FILE]   answer the scrapes of its metrics (vllm-sentinel-metrics.service)

`agent` and `metrics` run as one process each for as long as their socket (vllm-sentinel-agent.socket,
vllm-sentinel-metrics.socket) listens: systemd hands them its listening socket (LISTEN_FDS) and each connection is
answered in a thread. Without that socket they answer one connection on standard input and output: what a
per-connection service of an earlier release (Accept=yes) still does with this program while a run replaces it.

Installed by the vllm_sentinel role (tasks/main.yml) with vllm_unit.py beside it. Standard library only, but for reading
vLLM's /metrics (prometheus_client's parser): `check` runs with the Python of the host's vLLM release, `agent` and
`metrics` with the host's python3. The configuration (/etc/vllm-sentinel/sentinel.json) is rendered from the host's
plan; it holds no secret: an instance's API key is read from its own environment file when a probe needs it.

One round, for each instance whose unit runs:
  1. once it has answered /health since its unit started (a start is the rollout's and systemd's business), a bounded
     one-token completion on its local address; a failed one counts unless vLLM's token counters still move over
     the next 2 s (a busy engine, not a hung one);
  2. the kernel's NVIDIA Xid lines since the last round: an Xid of the instance's card marks it as failed at once,
     unless the code needs a GPU reset or a reboot (vllm_sentinel_xid_reset, vllm_sentinel_xid_reboot): those are
     only counted and alerted (vllm_sentinel_xid_needs_operator), never acted on;
  3. drift: its unit file, environment file and arguments file against the release the rollout recorded as
     verified (/etc/vllm/releases/<instance>/current), and its running process's command line and environment
     against those files. Drift is reported, never changed.
After `failures` failures in a row, and within the budget (`heals_per_hour`, one instance of the host at a time), it
heals the instance: its agent answers "down" to every gateway's agent check (HAProxy stops sending it requests) and
the sentinel waits until each gateway has asked; the unit is killed and started again; the health wait of the
rollout (vllm_unit.wait_healthy) runs; the instance is verified (a completion, and the command line and environment
read back against the recorded release); only then its agent answers "up" again. An instance that fails
verification stays out of the gateways. Past the budget it stops acting and says so in its metrics (the shipped
alert VllmSentinelGaveUp). While a rollout works on the host (the pause file it writes) the sentinel does nothing.
"""

# urllib (its ssl import) is imported where a probe needs it: the agent's and the metrics' processes need none.
import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time

DEFAULT_CONFIG = "/etc/vllm-sentinel/sentinel.json"
ROUND_UNIT = "vllm-sentinel.service"
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# What the NVIDIA driver writes: "NVRM: Xid (PCI:0000:01:00): 79, pid=..., GPU has fallen off the bus." (the domain
# has 4 hex digits or more; older drivers leave out "PCI:"; MIG adds " GPU-I:.." before the parenthesis closes).
XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]{4,}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?[^)]*\): (\d+)")
DRIFT_KINDS = ("unit_file", "environment_file", "arguments_file", "command_line", "environment")


def log(message):
    print(message, flush=True)


# ---------------------------------------------------------------------------------------------------- files


def read_json(path, default):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return default


def write_atomic(path, text, mode=0o644):
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    temporary = "%s.%d.tmp" % (path, os.getpid())
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(temporary, mode)
    os.replace(temporary, path)


def read_bytes(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


ENV_ESCAPE = re.compile(r'\\([\\"$`])')


def env_file(text):
    """{name: value} of a systemd environment file (the vllm role writes NAME=value, quoted where needed)."""
    found = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = ENV_ESCAPE.sub(r"\1", value[1:-1])  # systemd reads \\, \", \$ and \` inside double quotes
        elif len(value) >= 2 and value[0] == value[-1] == "'":
            value = value[1:-1]  # nothing is escaped inside single quotes
        found[name.strip()] = value
    return found


# ---------------------------------------------------------------------------------------------------- probes


def completion(instance, api_key, timeout):
    """(verdict, why) of one bounded one-token completion on the instance's local address. The verdict is "ok" (a
    token), "refused" (the server answered 4xx: it runs, and refused the probe itself, as a wrong key or model name
    would have it refused; a restart cannot mend that) or "failed" (no answer in time, 5xx, or no token)."""
    import urllib.error
    import urllib.request

    body = json.dumps({"model": instance["model"], "prompt": "ping", "max_tokens": 1, "temperature": 0}).encode()
    request = urllib.request.Request(instance["url"] + "/v1/completions", data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    if api_key:
        request.add_header("Authorization", "Bearer " + api_key)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            payload = json.loads(answer.read().decode("utf-8", "replace"))
    except urllib.error.HTTPError as exc:
        return ("refused" if 400 <= exc.code < 500 and exc.code not in (408, 429) else "failed"), "HTTP %d" % exc.code
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return "failed", "no answer within %s s (%s)" % (timeout, str(reason)[:80] or type(exc).__name__)
    tokens = ((payload.get("usage") or {}).get("completion_tokens")) or 0
    if tokens < 1:
        return "failed", "an answer without a token"
    return "ok", "a token"


def health(url, timeout):
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout) as answer:
            return answer.status, answer.headers.get("Date"), ""
    except urllib.error.HTTPError as exc:
        return exc.code, None, "HTTP %d" % exc.code
    except OSError as exc:
        return None, None, str(getattr(exc, "reason", exc))[:80]


def progress(url, timeout=5):
    """Tokens the instance has taken in and put out so far (vLLM's prompt and generation token counters, read with
    prometheus_client's parser from the release's own virtualenv), or None when /metrics does not answer."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url + "/metrics", timeout=timeout) as answer:
            text = answer.read().decode("utf-8", "replace")
        wanted = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name in wanted
        )
    except (OSError, ValueError):
        return None


def systemctl(*args, timeout=60):
    return subprocess.run(
        ["systemctl", *args], capture_output=True, text=True, timeout=timeout, check=False, env={"LC_ALL": "C"}
    )


def unit_show(unit):
    out = systemctl("show", "--property=ActiveState,SubState,MainPID,InvocationID", unit).stdout
    return dict(line.partition("=")[::2] for line in out.splitlines() if "=" in line)


def process_arguments(pid):
    """The arguments after `serve` of the process's command line, or None."""
    raw = read_bytes("/proc/%s/cmdline" % pid)
    if not raw:
        return None
    argv = raw.decode("utf-8", "replace").rstrip("\0").split("\0")
    return argv[argv.index("serve") + 1 :] if "serve" in argv else None


def process_environment(pid):
    """The process's environment, read as its own user (root in a container lacks CAP_SYS_PTRACE)."""
    try:
        status = os.stat("/proc/%s" % pid)
        out = subprocess.run(
            [
                "setpriv",
                "--reuid=%d" % status.st_uid,
                "--regid=%d" % status.st_gid,
                "--clear-groups",
                "cat",
                "/proc/%s/environ" % pid,
            ],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    pairs = (entry.partition("=") for entry in out.stdout.decode("utf-8", "replace").split("\0"))
    return {name: value for name, sep, value in pairs if sep}


# ---------------------------------------------------------------------------------------------------- drift


def flags(args):
    """{--flag: [values]} and the positional arguments of a `vllm serve` argument list (--a=b is --a b)."""
    found, positional, current = {}, [], None
    for token in args:
        if token.startswith("--"):
            flag, has, value = token.partition("=")
            current = [value] if has else []
            found.setdefault(flag, []).append(current)
        elif current is None:
            positional.append(token)
        else:
            current.append(token)
    return positional, found


def argument_drift(expected, running):
    """The flags (names only: values may be secrets) that differ between two argument lists."""
    want_pos, want = flags(expected)
    have_pos, have = flags(running)
    out = ["the model argument"] if want_pos != have_pos else []
    for flag in sorted(set(want) | set(have)):
        if flag not in have:
            out.append("%s missing" % flag)
        elif flag not in want:
            out.append("%s added" % flag)
        elif want[flag] != have[flag]:
            out.append("%s changed" % flag)
    return out


def drift(instance, pid):
    """{kind: what differs} for the instance against its recorded verified release; {} when none differs."""
    releases = instance["releases_dir"]
    current = (read_bytes(os.path.join(releases, "current")) or b"").decode().strip()
    if not current:
        return {}  # nothing verified yet: nothing to compare with
    recorded = os.path.join(releases, current)
    found = {}
    for kind, path in (
        ("unit_file", instance["unit_path"]),
        ("environment_file", instance["env_path"]),
        ("arguments_file", instance["args_path"]),
    ):
        if read_bytes(path) != read_bytes(os.path.join(recorded, os.path.basename(path))):
            found[kind] = "%s differs from the verified release %s" % (path, current)
    if not pid or pid == "0":
        return found
    expected = read_json(os.path.join(recorded, os.path.basename(instance["args_path"])), None)
    running = process_arguments(pid)
    if isinstance(expected, list) and running is not None:
        differs = argument_drift([str(a) for a in expected], running)
        if differs:
            found["command_line"] = "the running process: " + ", ".join(differs)
    wanted = env_file((read_bytes(os.path.join(recorded, os.path.basename(instance["env_path"]))) or b"").decode())
    environment = process_environment(pid)
    if wanted and environment is not None:
        names = sorted(n for n, v in wanted.items() if environment.get(n) != v)
        if names:
            found["environment"] = "the running process differs in " + ", ".join(names)
    return found


# ---------------------------------------------------------------------------------------------------- Xid


def bus_key(bus):
    """A PCI address as the kernel and nvidia-smi write it (0000:01:00, 00000000:01:00.0) reduced to one form."""
    domain, bus_no, device = bus.split(".")[0].split(":")[-3:]
    return "%04x:%s:%s" % (int(domain, 16), bus_no.lower(), device.lower())


def gpu_buses(command, timeout=10):
    """{GPU index: bus key} from nvidia-smi; {} where there is none (a CPU host) or it does not answer."""
    try:
        out = subprocess.run(
            [command, "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    found = {}
    for line in out.stdout.splitlines():
        index, _, bus = line.partition(",")
        try:
            found[int(index)] = bus_key(bus.strip())
        except ValueError:
            continue
    return found


def xid_events(config, state):
    """[(bus key, code)] of the Xid lines the journal got since the last round: after the cursor of the last entry
    read, or, before any entry matched, since the sentinel's first round."""
    match = config["xid"]["journal_match"]
    cursor = state.get("cursor")
    since = state.setdefault("journal_since", int(time.time()))
    argv = ["journalctl", "--no-pager", "--output=json", "--show-cursor", *match]
    argv += ["--after-cursor=" + cursor] if cursor else ["--since=@%d" % since]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    events = []
    for line in out.splitlines():
        if line.startswith("-- cursor: "):
            state["cursor"] = line[len("-- cursor: ") :].strip()
            continue
        try:
            message = json.loads(line).get("MESSAGE")
        except ValueError:
            continue
        if isinstance(message, list):  # journald gives non-UTF-8 messages as bytes
            message = bytes(message).decode("utf-8", "replace")
        hit = XID.search(message or "")
        if hit:
            events.append((bus_key(hit.group(1)), int(hit.group(2))))
    return events


def xid_action(code, xid):
    if code in xid["reboot"]:
        return "reboot"
    if code in xid["reset"]:
        return "reset"
    if code in xid["ignore"]:
        return "ignore"
    return "restart"


def instances_of_bus(instances, buses, bus):
    """The instances on the card at ``bus``; every instance of the host when no card of theirs is known there."""
    hit = [i["name"] for i in instances if any(buses.get(g) == bus for g in i.get("gpus") or [])]
    return hit or [i["name"] for i in instances]


# ---------------------------------------------------------------------------------------------------- agent


def agent_state_path(config, name):
    return os.path.join(config["run_dir"], "agent", name)


def set_agent(config, name, word):
    write_atomic(agent_state_path(config, name), word + "\n")


def agent_polls(config, name, since, word):
    """How many gateways asked the agent for ``name`` since ``since`` and were told ``word``."""
    folder = os.path.join(config["run_dir"], "polls")
    count = 0
    for entry in os.listdir(folder) if os.path.isdir(folder) else []:
        if entry.partition("@")[0] != name:
            continue
        parts = [*(read_bytes(os.path.join(folder, entry)) or b"").decode().split(), "0", ""][:2]
        try:
            asked = float(parts[0])
        except ValueError:
            continue
        if asked >= since and parts[1] == word:
            count += 1
    return count


def wait_for_gateways(config, name, word):
    """Wait until every gateway has been told ``word`` for the instance (bounded); the seconds waited."""
    start = time.time()
    wanted = int(config["gateways"])
    deadline = start + float(config["agent_wait_s"])
    while agent_polls(config, name, start, word) < wanted and time.time() < deadline:
        time.sleep(0.2)
    told = agent_polls(config, name, start, word)
    if told < wanted:
        log(
            "%s: %d of %d gateway(s) asked its agent within %s s (answered %s)"
            % (name, told, wanted, config["agent_wait_s"], word)
        )
    return time.time() - start


def agent(config, rfile, wfile, peer):
    """One agent check: HAProxy sends the instance's name and a newline, and reads `up` or `down`."""
    line = rfile.readline(128).decode("ascii", "replace").strip()
    word = "up"
    if NAME.match(line):
        word = ((read_bytes(agent_state_path(config, line)) or b"up").decode().split() or ["up"])[0]
        peer = re.sub(r"[^0-9A-Fa-f.:]", "_", peer.removeprefix("::ffff:"))[:64]
        with contextlib.suppress(OSError):  # the answer matters more than its record
            write_atomic(
                os.path.join(config["run_dir"], "polls", "%s@%s" % (line, peer)), "%f %s\n" % (time.time(), word)
            )
    wfile.write((word + "\n").encode())
    wfile.flush()
    return 0


def metrics(config, rfile, wfile, peer):
    """One scrape: a minimal HTTP/1.0 answer with the metrics file of the last round and the pause as it is now."""
    request = rfile.readline(1024).decode("ascii", "replace").split()
    while rfile.readline(8192) not in (b"\r\n", b"\n", b""):
        pass
    if len(request) >= 2 and request[0] == "GET" and request[1].split("?")[0] == "/metrics":
        last = (read_bytes(os.path.join(config["run_dir"], "metrics.prom")) or b"").decode("utf-8", "replace")
        # A file an earlier release of this program wrote held the pause too: one family once.
        kept = [line for line in last.splitlines(True) if PAUSED_FAMILY not in line.split("{")[0].split()[:3]]
        body = ("".join(kept) + render_paused(config, time.time())).encode()
        head = "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
    else:
        body = b"not found\n"
        head = "HTTP/1.0 404 Not Found\r\nContent-Type: text/plain\r\n"
    wfile.write(("%sContent-Length: %d\r\n\r\n" % (head, len(body))).encode() + body)
    wfile.flush()
    return 0


# Connections answered at once; one more waits in the socket's backlog until a thread is free.
ANSWERING = 32
# What one connection may take, reading the question and writing the answer.
CONNECTION_TIMEOUT_S = 5


def listening_socket():
    """The socket systemd passes (Accept=no: LISTEN_FDS, the first at file descriptor 3), or None."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()) or int(os.environ.get("LISTEN_FDS") or 0) < 1:
        return None
    import socket

    return socket.socket(fileno=3)


def serve(config_path, answer, listener):
    """Answer every connection of ``listener``, each in a thread, until the process is stopped. The configuration is
    read again for each (the role rewrites it; the process goes on). A process per connection cost the host about
    60 ms of CPU each, several times a second (docs/sentinel.md)."""
    import threading

    free = threading.BoundedSemaphore(ANSWERING)

    def one(connection, peer):
        try:
            connection.settimeout(CONNECTION_TIMEOUT_S)
            with connection, connection.makefile("rb") as rfile, connection.makefile("wb") as wfile:
                config = read_json(config_path, None)
                if isinstance(config, dict):
                    answer(config, rfile, wfile, peer)
        except OSError:
            pass  # a client gone or too slow: the next one is answered
        finally:
            free.release()

    while True:
        connection, address = listener.accept()
        free.acquire()
        threading.Thread(target=one, args=(connection, str(address[0])), daemon=True).start()


# ---------------------------------------------------------------------------------------------------- heal


def verify(config, instance, api_key):
    """The checks of the rollout a restarted instance must pass before it is put back: healthy (the rollout's
    wait), a completion, and its command line and environment read back against the verified release."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # run with -I by the socket units: not on the path
    import vllm_unit

    unit = instance["unit"]
    waited = vllm_unit.wait_healthy(
        lambda: health(instance["url"], 10),
        lambda: systemctl(*vllm_unit.show_argv(unit)[1:]).stdout,
        instance["url"] + "/health",
        float(config["health_timeout_s"]),
        delay=1.0,
        unit=unit,
    )
    if not waited["ok"]:
        return False, waited["error"]
    verdict, why = completion(instance, api_key, float(config["verify_timeout_s"]))
    if verdict != "ok":
        return False, "the completion after the restart: " + why
    found = drift(instance, unit_show(unit).get("MainPID"))
    if found:
        return False, "; ".join(found.values())
    return True, "healthy in %.1f s, a token, command line and environment as verified" % waited["waited_s"]


def heal(config, state, instance, why):
    name, unit = instance["name"], instance["unit"]
    entry = state["instances"][name]
    started = time.time()
    log("%s: %s; taking it out of every gateway" % (name, why))
    set_agent(config, name, "down")
    entry["out"] = True
    write_metrics(config, state)
    out_s = wait_for_gateways(config, name, "down")
    log("%s: out of the gateways after %.1f s; restarting %s" % (name, out_s, unit))
    # A hung engine ignores SIGTERM; what it ran is lost either way.
    systemctl("kill", "--signal=SIGKILL", unit)
    systemctl("reset-failed", unit)
    systemctl("restart", unit, timeout=120)
    ok, detail = verify(config, instance, api_key_of(instance))
    entry["failures"] = 0
    if not ok:
        entry["heals"]["failed"] += 1
        entry["heal_failed"] = True
        entry["last_error"] = detail
        log("%s: not verified after its restart (%s); it stays out of the gateways" % (name, detail))
        return
    serving_s = time.time() - started
    set_agent(config, name, "up")
    back_s = wait_for_gateways(config, name, "up")
    entry["out"] = entry["heal_failed"] = False
    entry["heals"]["healed"] += 1
    entry["last_error"] = ""
    entry["last_heal"] = {
        "at": started,
        "out_s": round(out_s, 1),
        "serving_s": round(serving_s, 1),
        "back_s": round(time.time() - started, 1),
    }
    log(
        "%s: healed: %s; back in the gateways %.1f s after it was taken out (%.1f s to be told)"
        % (name, detail, time.time() - started, back_s)
    )


def api_key_of(instance):
    return env_file((read_bytes(instance["env_path"]) or b"").decode()).get("VLLM_API_KEY", "")


# ---------------------------------------------------------------------------------------------------- metrics


def label(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def families(lines):
    """A function that appends one metric family (its HELP, TYPE and samples) to `lines`."""

    def family(name, kind, about, samples):
        lines.append("# HELP %s %s" % (name, about))
        lines.append("# TYPE %s %s" % (name, kind))
        for labels, value in samples:
            text = ",".join('%s="%s"' % (k, label(v)) for k, v in labels.items())
            lines.append("%s{%s} %s" % (name, text, value) if text else "%s %s" % (name, value))

    return family


PAUSED_FAMILY = "vllm_sentinel_paused"


def render_paused(config, now):
    """The pause as it is now (read at each scrape, not at the last round: a pause the rollout lifted is over at once,
    though the next round may be an interval away)."""
    lines = []
    families(lines)(
        PAUSED_FAMILY,
        "gauge",
        "1 while a rollout works on the host.",
        [({}, int(bool(paused_until(config, now))))],
    )
    return "\n".join(lines) + "\n"


def render_metrics(config, state):
    """Everything the last round saw (the pause is added at each scrape: render_paused)."""
    lines = []
    family = families(lines)

    host = config.get("host", "")
    items = sorted(("%s/%s" % (host, n) if host else n, e) for n, e in state["instances"].items())
    family(
        "vllm_sentinel_last_round_timestamp_seconds",
        "gauge",
        "When the sentinel last looked.",
        [({}, "%.3f" % state.get("last_round", 0))],
    )
    family("vllm_sentinel_interval_seconds", "gauge", "How often it looks.", [({}, config["interval_s"])])
    family(
        "vllm_sentinel_acting", "gauge", "1 when it heals, 0 when it only watches.", [({}, int(bool(config["act"])))]
    )
    family(
        "vllm_sentinel_gave_up",
        "gauge",
        "1 when the heal budget is spent: it no longer acts.",
        [({}, int(bool(state.get("gave_up"))))],
    )
    family(
        "vllm_sentinel_probe_failures",
        "gauge",
        "Failed probes in a row.",
        [({"instance": n}, e["failures"]) for n, e in items],
    )
    family(
        "vllm_sentinel_probe_refused",
        "gauge",
        "1 when its last probe was refused (HTTP 4xx): the sentinel cannot tell a hang there; see the key it reads.",
        [({"instance": n}, int(bool(e.get("refused")))) for n, e in items],
    )
    family(
        "vllm_sentinel_out_of_rotation",
        "gauge",
        "1 while its agent tells the gateways to send nothing.",
        [({"instance": n}, int(e["out"])) for n, e in items],
    )
    family(
        "vllm_sentinel_heal_failed",
        "gauge",
        "1 while it is out because its restart did not verify.",
        [({"instance": n}, int(e["out"] and e["heal_failed"])) for n, e in items],
    )
    family(
        "vllm_sentinel_heals_total",
        "counter",
        "Heals, by result.",
        [({"instance": n, "result": r}, e["heals"][r]) for n, e in items for r in ("healed", "failed")],
    )
    family(
        "vllm_sentinel_last_heal_seconds",
        "gauge",
        "The last heal: to out of rotation, to serving again.",
        [
            ({"instance": n, "phase": p}, e["last_heal"][p + "_s"])
            for n, e in items
            if e.get("last_heal")
            for p in ("out", "serving")
        ],
    )
    family(
        "vllm_sentinel_drift",
        "gauge",
        "1 where the instance differs from its verified release.",
        [({"instance": n, "what": k}, int(k in e["drift"])) for n, e in items for k in DRIFT_KINDS],
    )

    def by_code(key, shown):
        """One sample per instance and Xid code (labelled with what the code needs) of entry[key]."""
        return [
            ({"instance": n, "code": c, "action": xid_action(int(c), config["xid"])}, shown(v))
            for n, e in items
            for c, v in sorted(e[key].items())
        ]

    family(
        "vllm_sentinel_xid_total",
        "counter",
        "NVIDIA Xid lines of the instance's card, by code and action.",
        by_code("xid", int),
    )
    family(
        "vllm_sentinel_xid_last_timestamp_seconds",
        "gauge",
        "When the card last logged the Xid code.",
        by_code("xid_at", lambda v: "%.3f" % v),
    )
    family(
        "vllm_sentinel_xid_needs_operator",
        "gauge",
        "The last Xid code that needs a GPU reset or a reboot since the unit started (0: none).",
        [({"instance": n}, e.get("needs_operator") or 0) for n, e in items],
    )
    return "\n".join(lines) + "\n"


def write_metrics(config, state):
    write_atomic(os.path.join(config["run_dir"], "metrics.prom"), render_metrics(config, state))


# ---------------------------------------------------------------------------------------------------- round


def fresh_entry():
    return {
        "failures": 0,
        "out": False,
        "heals": {"healed": 0, "failed": 0},
        "xid": {},
        "xid_at": {},
        "needs_operator": 0,
        "needs_operator_at": 0,
        "drift": {},
        "last_error": "",
        "invocation": "",
        "served": False,
        "heal_failed": False,
        "refused": "",
    }


def paused_until(config, now):
    try:
        until = float((read_bytes(config["pause_file"]) or b"0").decode().split()[0])
    except (ValueError, IndexError):
        return 0.0
    return until if until > now else 0.0


def check(config):
    state_path = os.path.join(config["state_dir"], "state.json")
    state = read_json(state_path, {})
    state.setdefault("instances", {})
    state.setdefault("heal_times", [])
    instances = config["instances"]
    for instance in instances:
        entry = state["instances"].setdefault(instance["name"], fresh_entry())
        for key, value in fresh_entry().items():
            entry.setdefault(key, value)
    for instance in instances:  # the agent's answer is the truth: the rollout clears a mark it verified away
        word = (read_bytes(agent_state_path(config, instance["name"])) or b"up").decode().split() or ["up"]
        state["instances"][instance["name"]]["out"] = word[0] == "down"
        state["instances"][instance["name"]]["heal_failed"] &= word[0] == "down"
    for gone in set(state["instances"]) - {i["name"] for i in instances}:
        del state["instances"][gone]
    now = time.time()
    state["last_round"] = now
    if paused_until(config, now):
        write_metrics(config, state)
        write_atomic(state_path, json.dumps(state, indent=1, sort_keys=True) + "\n", 0o600)
        return 0

    marked = {}
    events = xid_events(config, state)
    buses = gpu_buses(config["xid"]["nvidia_smi"]) if events else {}
    for bus, code in events:
        action = xid_action(code, config["xid"])
        for name in instances_of_bus(instances, buses, bus):
            entry = state["instances"][name]
            entry["xid"][str(code)] = entry["xid"].get(str(code), 0) + 1
            entry["xid_at"][str(code)] = now
            log("%s: NVIDIA Xid %d on %s (%s)" % (name, code, bus, action))
            if action in ("reset", "reboot"):
                entry["needs_operator"], entry["needs_operator_at"] = code, now
            elif action == "restart":
                marked[name] = "NVIDIA Xid %d on its card %s" % (code, bus)

    for instance in instances:
        name = instance["name"]
        entry = state["instances"][name]
        unit = unit_show(instance["unit"])
        if entry["needs_operator"] and unit.get("ActiveState") == "active" and started_after(instance, entry):
            entry["needs_operator"] = 0  # its unit started again since (the operator reset the card or rebooted)
        entry["drift"] = drift(instance, unit.get("MainPID"))
        for kind, what in sorted(entry["drift"].items()):
            log("%s: drift (%s): %s" % (name, kind, what))
        if unit.get("ActiveState") != "active" or unit.get("SubState") != "running":
            entry["failures"] = 0  # starting, restarting or stopped: systemd's and the rollout's business
            continue
        if name in marked:
            entry["failures"] = max(entry["failures"] + 1, int(config["failures"]))
            entry["last_error"] = marked[name]
            continue
        if unit.get("InvocationID") != entry.get("invocation"):  # started (again) since the last round
            entry.update(invocation=unit.get("InvocationID"), served=False, failures=0)
        if not entry["served"]:  # still loading: the rollout's health wait and systemd watch a start, not the sentinel
            entry["served"] = health(instance["url"], 5)[0] == 200
            if not entry["served"]:
                continue
        verdict, why = completion(instance, api_key_of(instance), float(config["probe_timeout_s"]))
        entry["refused"] = why if verdict == "refused" else ""
        if verdict == "refused":
            entry["failures"] = 0
            log("%s: the probe was refused (%s): the instance answers, so nothing is healed; see its key" % (name, why))
            continue
        if verdict == "ok":
            entry["failures"] = 0  # one left out by a heal that failed stays out: the rollout puts it back
            continue
        before = progress(instance["url"])
        time.sleep(2)
        after = progress(instance["url"]) if before is not None else None
        if after is not None and after > before:
            log(
                "%s: probe got no token (%s), but the engine moved %d tokens since: busy, not hung"
                % (name, why, after - before)
            )
            continue
        entry["failures"] += 1
        entry["last_error"] = why
        log("%s: probe failed (%d in a row): %s" % (name, entry["failures"], why))

    state["heal_times"] = [t for t in state["heal_times"] if now - t < 3600]
    due = [
        i
        for i in instances
        if state["instances"][i["name"]]["failures"] >= int(config["failures"])
        and not state["instances"][i["name"]]["out"]
    ]
    if due and config["act"]:
        if len(state["heal_times"]) >= int(config["heals_per_hour"]):
            if not state.get("gave_up"):
                log(
                    "heal budget spent: %d heal(s) in the last hour (vllm_sentinel_heals_per_hour=%s); it only "
                    "watches now" % (len(state["heal_times"]), config["heals_per_hour"])
                )
            state["gave_up"] = True
        else:
            state["gave_up"] = False
            state["heal_times"].append(now)
            instance = due[0]  # one instance of the host at a time; the next round takes the next
            heal(config, state, instance, state["instances"][instance["name"]]["last_error"])
    elif not due and not state["heal_times"]:
        state["gave_up"] = False
    write_metrics(config, state)
    write_atomic(state_path, json.dumps(state, indent=1, sort_keys=True) + "\n", 0o600)
    return 0


def started_after(instance, entry):
    out = systemctl("show", "--timestamp=unix", "--property=ActiveEnterTimestamp", instance["unit"]).stdout
    try:
        return float(out.strip().partition("=@")[2] or 0) > float(entry["needs_operator_at"])
    except ValueError:
        return False


def pause(config, seconds, wait_s):
    """The rollout's pause (its first step on the host): no round probes or heals for `seconds` (the rollout lifts it
    sooner), and back once no round, nor a heal in it, still runs; 1 when one still runs after `wait_s`."""
    write_atomic(config["pause_file"], "%d\n" % (time.time() + seconds))
    deadline = time.monotonic() + wait_s
    while True:
        state = systemctl("show", "--property=ActiveState", "--value", ROUND_UNIT).stdout.strip()
        if state != "activating":
            return 0
        if time.monotonic() >= deadline:
            sys.stderr.write(
                "vllm-sentinel: paused, but a round of %s still runs after %d s (a heal that does not end); see its "
                "journal (journalctl -u %s) and stop it (systemctl stop %s) before the rollout goes on\n"
                % (ROUND_UNIT, wait_s, ROUND_UNIT, ROUND_UNIT)
            )
            return 1
        time.sleep(1)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="vllm-sentinel", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("check", "agent", "metrics", "pause"))
    parser.add_argument("--config", default=DEFAULT_CONFIG)
    parser.add_argument("--seconds", type=int, default=3600, help="pause: for how long at most")
    parser.add_argument("--wait", type=int, default=1200, help="pause: how long a round in progress may take to end")
    args = parser.parse_args(argv)
    config = read_json(args.config, None)
    if not isinstance(config, dict):
        sys.stderr.write("vllm-sentinel: cannot read %s; fix: run site.yml for this host\n" % args.config)
        return 2
    if args.command == "pause":
        return pause(config, args.seconds, args.wait)
    if args.command == "check":
        return check(config)
    answer = {"agent": agent, "metrics": metrics}[args.command]
    listener = listening_socket()
    if listener is not None:
        return serve(args.config, answer, listener)
    return answer(config, sys.stdin.buffer, sys.stdout.buffer, os.environ.get("REMOTE_ADDR", "unknown"))


if __name__ == "__main__":
    sys.exit(main())
