"""The gateway's configuration as the vllm_gateway role renders it for the production example (inventories/production,
a second gateway added as its README shows), checked and run by Debian 12's own HAProxy 2.6 on this machine
(benchmarks/gateway_loopback.py: the package from the lab's mirror, unpacked, never installed; the example's vLLM
hosts as stand-ins at loopback addresses; what else is replaced, and why, is said there).

`haproxy -c` checks the configuration as rendered, in a mount namespace of its own whose /etc/passwd and /etc/group
have the haproxy user (the controller has none; root is needed to make it). The running gateways leave out the global
user, group and chroot lines. The tests then ask them what a tenant would: routing by the model the body names, each
tenant's models, OpenAI-shaped refusals from the gateway itself, the body limit, the cap on requests in flight and a
request rate shared between the two gateways."""

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.integration
sys.path.insert(0, str(ROOT / "benchmarks"))
from gateway_loopback import (  # noqa: E402
    BACKENDS,
    GATEWAYS,
    KEYS,
    LARGE,
    SMALL,
    Backend,
    free_port,
    haproxy,
    render,
    start,
)

# A LoRA adapter of the 14B on two of its three hosts (the plan reads no adapter_config.json here: the gateway's own
# read of the hosts, as a gateway play makes it).
LEGAL = {"name": "legal-summaries", "url": "http://mirror.example.internal/adapters/legal-summaries"}
ADAPTED = ("gpu-l40-01.example.internal", "gpu-l40-02.example.internal")


@pytest.fixture(scope="module")
def gateways(tmp_path_factory):
    """The two gateways running the rendered configuration, in front of the stand-ins: {name: (front door URL,
    its configuration)}, the stand-ins and the HAProxy command."""
    tmp = tmp_path_factory.mktemp("gateway")
    try:
        command = haproxy(tmp)
        ports = {"front": free_port(), "metrics": free_port(), "peers": free_port()}
        etc = render(tmp, ports, host_vars={name: {"vllm_lora_adapters": [LEGAL]} for name in ADAPTED})
    except RuntimeError as exc:
        pytest.fail(str(exc))
    backends = {name: Backend(address) for name, address in BACKENDS.items()}
    procs, doors = [], {}
    try:
        for name, address in GATEWAYS.items():
            config = etc / name / "haproxy.cfg"
            procs.append(start(command, config))
            doors[name] = (f"https://{address}:{ports['front']}", config)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if all(status(door, KEYS["chat-frontend"], "/v1/models")[0] == 200 for door, _ in doors.values()):
                    break
            except OSError:
                pass
            time.sleep(0.2)
        time.sleep(1.5)  # the health checks (every 0.5 s, two to rise) take the stand-ins in
        yield {"doors": doors, "backends": backends, "command": command, "tmp": tmp}
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
        for backend in backends.values():
            backend.close()


CONTEXT = ssl.create_default_context()
CONTEXT.check_hostname = False
CONTEXT.verify_mode = ssl.CERT_NONE  # the test's own self-signed certificate: TLS is the gateway's, not checked here


def status(door, key, path, body=None, raw=None):
    """(HTTP status, JSON answer) of one request to a gateway: a POST of `body` (or of the bytes `raw`), else a GET."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(
        door + path,
        data=data,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST" if data is not None else "GET",
    )
    try:
        with urllib.request.urlopen(request, timeout=30, context=CONTEXT) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read() or b"{}")


def test_the_rendered_configuration_passes_haproxys_own_check(gateways):
    """`haproxy -c` on each gateway's haproxy.cfg as rendered (user, group and chroot included), in a mount namespace
    whose /etc/passwd and /etc/group have the haproxy user."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("the check needs root and unshare (util-linux) to give HAProxy its user in a namespace of its own")
    tmp = gateways["tmp"]
    passwd, group = tmp / "passwd", tmp / "group"
    passwd.write_text(Path("/etc/passwd").read_text() + "haproxy:x:64999:64999::/var/lib/haproxy:/usr/sbin/nologin\n")
    group.write_text(Path("/etc/group").read_text() + "haproxy:x:64999:\n")
    for name, (_, config) in gateways["doors"].items():
        text = config.read_text()
        assert "\n    user haproxy\n" in text and f"\n    localpeer {name}\n" in text
        check = " ".join(gateways["command"]) + f" -c -q -f {config}"
        proc = subprocess.run(
            [
                "unshare",
                "-m",
                "sh",
                "-c",
                f"mount --bind {passwd} /etc/passwd && mount --bind {group} /etc/group && {check}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, (name, proc.stdout, proc.stderr)


def test_each_request_goes_to_the_instances_of_the_model_it_names(gateways):
    """The example's two models (the 4090 group's 7B, the L40 group's 14B) behind one gateway: a request reaches a
    host of the model it names, or of the model its alias points at (the example's chat, the 14B), with the vLLM
    hosts' key in place of the tenant's; the model may come after the messages (the openai SDK's order)."""
    door, _ = gateways["doors"]["gw-01.example.internal"]
    small = {a for n, a in BACKENDS.items() if n.startswith("gpu-4090")}
    large = {a for n, a in BACKENDS.items() if n.startswith("gpu-l40")}
    for model, hosts in ((SMALL, small), (LARGE, large), ("chat", large)):
        for _ in range(4):
            body = {"messages": [{"role": "user", "content": "hello " * 200}], "model": model}
            code, answer = status(door, KEYS["chat-frontend"], "/v1/chat/completions", body)
            # The stand-in echoes the name asked for; a vLLM instance answers to each alias too (its served names).
            assert code == 200 and answer["model"] == model and answer["address"] in hosts, answer
            assert answer["key"] == "Bearer " + "v" * 40


def test_an_adapter_goes_only_to_the_hosts_that_load_it(gateways):
    """The adapter's name reaches only the two L40 hosts that load it (each tracked from its server in the 14B's
    backend), never the third L40 host nor a 4090 host."""
    door, _ = gateways["doors"]["gw-01.example.internal"]
    loading = {BACKENDS[name] for name in ADAPTED}
    seen = set()
    for turn in range(8):
        body = {"model": LEGAL["name"], "prompt": f"summarise case {turn} " * 50}
        code, answer = status(door, KEYS["chat-frontend"], "/v1/completions", body)
        assert code == 200 and answer["model"] == LEGAL["name"] and answer["address"] in loading, answer
        seen.add(answer["address"])
    assert seen <= loading


def admin(config, command):
    """One command of HAProxy's runtime API on the gateway's admin socket (beside its configuration); its answer."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(config.parent / "admin.sock"))
        sock.sendall(command.encode() + b"\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer.decode()


def test_an_instance_drained_in_its_models_backend_is_drained_for_its_adapter_too(gateways):
    """The rollout drains an instance once, in its model's backend (drain.yml): its server in the adapter's backend
    tracks that one, so HAProxy drains it there too, and the adapter's requests all go to the other host that loads it
    until the first is ready again; the drain's wait counts the sessions of both (gateway.server_sessions)."""
    from vllm_fleet import gateway

    door, config = gateways["doors"]["gw-01.example.internal"]
    first, second = (BACKENDS[name] for name in ADAPTED)
    server = gateway.server_name(ADAPTED[0], "main")
    model_backend = gateway.backend_name(LARGE)
    assert admin(config, f"set server {model_backend}/{server} state drain").strip() == ""
    try:
        stat = admin(config, "show stat")
        rows = [line.split(",") for line in stat.splitlines() if f",{server}," in line]
        # "DRAIN (agent)": the stand-in hosts run no sentinel, whose agent the servers also ask.
        assert {(row[0], row[17].split()[0]) for row in rows} == {
            (model_backend, "DRAIN"),
            ("model-legal-summaries", "DRAIN"),
        }
        assert gateway.server_sessions(stat, model_backend, server) == 0
        for turn in range(6):
            body = {"model": LEGAL["name"], "prompt": f"summarise case {turn} " * 50}
            code, answer = status(door, KEYS["chat-frontend"], "/v1/completions", body)
            assert code == 200 and answer["address"] == second, answer
    finally:
        admin(config, f"set server {model_backend}/{server} state ready")
    assert first != second


def test_each_tenant_lists_and_uses_only_its_models_and_refusals_reach_no_instance(gateways):
    """chat-frontend lists both models and the alias; batch-jobs (the example limits it to the 14B) lists that one and
    its alias, and gets 403 for the other; an unknown model gets 404, a body without a model 400, a GET other than
    /v1/models 404: OpenAI-shaped, from the gateway, and no stand-in got a request."""
    door, _ = gateways["doors"]["gw-01.example.internal"]
    code, listed = status(door, KEYS["chat-frontend"], "/v1/models")
    assert code == 200 and listed["object"] == "list"
    assert sorted(m["id"] for m in listed["data"]) == sorted([SMALL, LARGE, "chat", LEGAL["name"]])
    assert [m["parent"] for m in listed["data"] if m["id"] == LEGAL["name"]] == [LARGE]
    code, listed = status(door, KEYS["batch-jobs"], "/v1/models")
    assert code == 200 and [(m["id"], m["root"]) for m in listed["data"]] == [(LARGE, LARGE), ("chat", LARGE)]
    before = {name: b.posts for name, b in gateways["backends"].items()}
    for key, body, path, wanted, error in (
        (KEYS["batch-jobs"], {"model": SMALL, "prompt": "hi"}, "/v1/completions", 403, "model_not_allowed"),
        # Allowed the 14B, not its adapter: an adapter is allowed only where a tenant's list names it.
        (KEYS["batch-jobs"], {"model": LEGAL["name"], "prompt": "hi"}, "/v1/completions", 403, "model_not_allowed"),
        (KEYS["chat-frontend"], {"model": "no such model", "prompt": "hi"}, "/v1/completions", 404, "model_not_found"),
        (KEYS["chat-frontend"], {"prompt": "hi"}, "/v1/completions", 400, "model_required"),
        (KEYS["chat-frontend"], None, "/v1/models/" + SMALL, 404, "not_found"),
        # vLLM's runtime LoRA endpoints are never forwarded, whatever model the body names.
        (
            KEYS["chat-frontend"],
            {"model": LARGE, "lora_name": "x", "lora_path": "/"},
            "/v1/load_lora_adapter",
            404,
            "not_found",
        ),
        (KEYS["chat-frontend"], {"model": LARGE, "lora_name": "x"}, "/v1/unload_lora_adapter", 404, "not_found"),
        ("x" * 40, {"model": SMALL}, "/v1/completions", 401, "invalid_api_key"),
    ):
        code, refused = status(door, key, path, body)
        assert code == wanted and set(refused["error"]) == {"message", "type", "code"}, (wanted, refused)
        assert refused["error"]["code"] == error, refused
    code, refused = status(door, KEYS["batch-jobs"], "/v1/completions", {"model": SMALL, "prompt": "hi"})
    assert SMALL in refused["error"]["message"]
    assert {name: b.posts for name, b in gateways["backends"].items()} == before


def test_a_body_over_the_limit_is_refused_and_one_under_it_is_routed_by_its_model(gateways):
    """vllm_gateway_max_body_bytes (1 MiB): a body over it gets 413 naming the limit, whether its length is announced
    or not, and reaches no instance; one just under it, its model after 1,000,000 bytes of messages, is routed."""
    door, _ = gateways["doors"]["gw-01.example.internal"]
    before = sum(b.posts for b in gateways["backends"].values())
    over = json.dumps({"messages": [{"role": "user", "content": "x" * (1024 * 1024)}], "model": LARGE}).encode()
    code, refused = status(door, KEYS["chat-frontend"], "/v1/chat/completions", raw=over)
    assert code == 413 and "1048576 bytes" in refused["error"]["message"], refused
    chunked = urllib.request.Request(
        door + "/v1/chat/completions",
        data=iter([over[: len(over) // 2], over[len(over) // 2 :]]),
        headers={"Authorization": f"Bearer {KEYS['chat-frontend']}", "Transfer-Encoding": "chunked"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(chunked, timeout=30, context=CONTEXT)
    assert raised.value.code == 413
    assert sum(b.posts for b in gateways["backends"].values()) == before
    under = json.dumps({"messages": [{"role": "user", "content": "x" * 1_000_000}], "model": LARGE}).encode()
    assert 1_000_000 < len(under) < 1024 * 1024
    code, answer = status(door, KEYS["chat-frontend"], "/v1/chat/completions", raw=under)
    assert code == 200 and answer["model"] == LARGE, answer


def test_a_tenant_over_its_requests_in_flight_gets_429(gateways):
    """batch-jobs may have 32 requests in flight (the example's max_concurrent): with 32 held by the instances, a
    33rd is refused at once with 429; once they end, it is served."""
    door, _ = gateways["doors"]["gw-02.example.internal"]
    with ThreadPoolExecutor(32) as pool:
        held = [
            pool.submit(status, door, KEYS["batch-jobs"], "/v1/completions", {"model": LARGE, "hold": 3})
            for _ in range(32)
        ]
        time.sleep(1.5)
        code, refused = status(door, KEYS["batch-jobs"], "/v1/completions", {"model": LARGE})
        assert [f.result()[0] for f in held] == [200] * 32
    assert code == 429 and refused["error"]["code"] == "concurrency_limit_exceeded", refused
    assert status(door, KEYS["batch-jobs"], "/v1/completions", {"model": LARGE})[0] == 200


def test_the_two_gateways_share_each_tenants_request_rate(gateways):
    """batch-jobs may send 600 requests a minute: at its limit through gw-01, it is refused by gw-02 too (HAProxy's
    peers share the count), while chat-frontend, without a limit, is served by both."""
    (first, _), (second, _) = gateways["doors"].values()
    codes = [status(first, KEYS["batch-jobs"], "/v1/models")[0] for _ in range(610)]
    assert 429 in codes and codes.count(200) <= 600, codes.count(200)
    time.sleep(1)  # the peers push their updates at once; a second of margin
    code, refused = status(second, KEYS["batch-jobs"], "/v1/models")
    assert code == 429 and refused["error"]["code"] == "rate_limit_exceeded", refused
    assert status(second, KEYS["chat-frontend"], "/v1/models")[0] == 200
