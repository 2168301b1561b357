"""The gateway's configuration as the vllm_gateway role renders it for the production example (inventories/production,
a second gateway added as its README shows), checked and run by Debian 12's own HAProxy 2.6 on this machine.

The HAProxy binary comes from the package the lab's mirror serves the gateways (.cache/connected/debian/pool, which
scripts/test.sh's bootstrap builds), unpacked with dpkg-deb, never installed. What this machine cannot be, replaced and
said so:
- the hosts' addresses: the example's vLLM hosts at loopback addresses (127.0.1.N) where stand-ins of vLLM answer
  /health and echo the requests they get (so that a test sees which host a request reached, and that a refused one
  reached none); the two gateways at 127.0.2.1 and 127.0.2.2, on free ports;
- the gateway's folders (its configuration, runtime and state folders: a temporary one) and its Vault values (test
  values made here, a certificate and key made with `cryptography`);
- for the checker (`haproxy -c`), the haproxy user: the configuration is checked as rendered in a mount namespace of
  its own whose /etc/passwd and /etc/group have that user (the controller has none; root is needed to make it);
- for the running gateways, the global `user`, `group` and `chroot` lines, which drop privileges on a gateway host and
  are dropped here (nothing else of the file is changed).
The tests then ask the running gateways what a tenant would: routing by the model the body names, each tenant's
models, OpenAI-shaped refusals from the gateway itself, the body limit, the cap on requests in flight and a request
rate shared between the two gateways."""

import datetime
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, run_ansible

pytestmark = pytest.mark.integration
POOL = Path(os.environ.get("STAGING_DIR", ROOT / ".cache" / "connected")) / "debian" / "pool"
# The package and the libraries it links that a controller without HAProxy lacks.
PACKAGES = ("haproxy_", "liblua5.3-0_", "libopentracing-c-wrapper0_", "libopentracing1_")
GATEWAYS = {"gw-01.example.internal": "127.0.2.1", "gw-02.example.internal": "127.0.2.2"}
# The example's vLLM hosts, each at a loopback address of its own (one instance each, on port 8000).
BACKENDS = {
    "gpu-4090-01.example.internal": "127.0.1.1",
    "gpu-4090-02.example.internal": "127.0.1.2",
    "gpu-l40-01.example.internal": "127.0.1.3",
    "gpu-l40-02.example.internal": "127.0.1.4",
    "gpu-l40-03.example.internal": "127.0.1.5",
}
SMALL, LARGE = "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-14B-Instruct"
KEYS = {"chat-frontend": "c" * 40, "batch-jobs": "b" * 40}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def haproxy(tmp: Path) -> list[str]:
    """The command of Debian 12's HAProxy, unpacked from the lab mirror's packages into tmp."""
    debs = [next(iter(sorted(POOL.glob(f"{prefix}*.deb"))), None) for prefix in PACKAGES]
    if None in debs:
        missing = [p for p, d in zip(PACKAGES, debs, strict=True) if d is None]
        pytest.fail(
            f"{POOL} lacks {missing}: the lab's mirror is built by scripts/test.sh's bootstrap "
            "(lab/scripts/apt-mirror.py); run `scripts/test.sh bootstrap` first"
        )
    root = tmp / "haproxy-deb"
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True, capture_output=True)
    libraries = f"{root}/usr/lib/x86_64-linux-gnu:{root}/usr/lib"
    return ["env", f"LD_LIBRARY_PATH={libraries}", str(root / "usr" / "sbin" / "haproxy")]


def certificate() -> tuple[str, str]:
    """A self-signed certificate for the gateways and its key (test values), in PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gateway.example.internal")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .sign(key, hashes.SHA256())
    )
    return (
        cert.public_bytes(serialization.Encoding.PEM).decode(),
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode(),
    )


def render(tmp: Path, ports: dict[str, int]) -> Path:
    """Render each gateway's haproxy.cfg, maps and certificate into tmp/etc/<gateway>/ with the role's own
    template, vars and defaults over the example's inventory."""
    etc = tmp / "etc"
    role = ROOT / "roles" / "vllm_gateway"
    defaults = yaml.safe_load((ROOT / "roles" / "vllm_defaults" / "defaults" / "main.yml").read_text())
    defaults.update(yaml.safe_load((role / "defaults" / "main.yml").read_text()))
    hosts = {name: {"ansible_host": address, "vllm_bind_address": address} for name, address in BACKENDS.items()}
    gateways = {
        name: {"ansible_connection": "local", "vllm_gateway_source_address": address, "vllm_gateway_vrrp_priority": p}
        for (name, address), p in zip(GATEWAYS.items(), (200, 100), strict=True)
    }
    (tmp / "overlay.yml").write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": defaults,
                    "children": {
                        "vllm_nodes": {"hosts": hosts},
                        "vllm_gateways": {"hosts": gateways},
                    },
                }
            }
        )
    )
    (tmp / "render.yml").write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Render the gateways' configuration",
                    "hosts": "vllm_gateways",
                    "gather_facts": False,
                    "vars_files": [str(role / "vars" / "main.yml")],
                    "vars": {"role_path": str(role)},
                    "tasks": [
                        {
                            "name": "Folders",
                            "ansible.builtin.file": {"path": "{{ _vllm_gateway_pem | dirname }}", "state": "directory"},
                        },
                        {
                            "name": "Certificate",
                            "ansible.builtin.copy": {
                                "content": "{{ vllm_gateway_tls_certificate }}{{ vllm_gateway_tls_key }}",
                                "dest": "{{ _vllm_gateway_pem }}",
                                "mode": "0600",
                            },
                        },
                        {
                            "name": "Keys and limits",
                            "ansible.builtin.copy": {
                                "content": (
                                    "{% for t in vllm_gateway_api_keys | vllm_gateway_tenants %}"
                                    "{{ t.key_sha256 if item == 'keys' else t.tenant }} "
                                    "{{ t.tenant if item == 'keys' else t.requests_per_minute }}\n{% endfor %}"
                                ),
                                "dest": "{{ _vllm_gateway_keys_map if item == 'keys' else _vllm_gateway_limits_map }}",
                                "mode": "0600",
                            },
                            "loop": ["keys", "limits"],
                        },
                        {
                            "name": "The routes' maps",
                            "ansible.builtin.copy": {
                                "content": "{% for line in item.value %}{{ line }}\n{% endfor %}",
                                "dest": "{{ _vllm_gateway_dir }}/{{ item.key }}.map",
                                "mode": "0600",
                            },
                            "loop": "{{ _vllm_gateway_routes.maps | dict2items }}",
                        },
                        {
                            "name": "Backend key",
                            "ansible.builtin.copy": {
                                "content": "backend Bearer {{ _vllm_gateway_backend_key }}\n",
                                "dest": "{{ _vllm_gateway_backend_key_map }}",
                                "mode": "0600",
                            },
                        },
                        {
                            "name": "haproxy.cfg",
                            "ansible.builtin.template": {
                                "src": str(role / "templates" / "haproxy.cfg.j2"),
                                "dest": "{{ _vllm_gateway_config }}",
                                "mode": "0600",
                            },
                            "vars": {"_vllm_gateway_sends_key": True},
                        },
                    ],
                }
            ]
        )
    )
    cert, key = certificate()
    folder = f"{etc}/{{{{ inventory_hostname }}}}"
    extra = {
        # The folders: one per gateway under tmp; the maps' names as the role's vars give them, under it.
        "_vllm_gateway_dir": folder,
        "_vllm_gateway_models_map": folder + "/models.map",
        "_vllm_gateway_allowed_map": folder + "/allowed.map",
        "_vllm_gateway_lists_map": folder + "/lists.map",
        "_vllm_gateway_concurrency_map": folder + "/concurrency.map",
        "_vllm_gateway_runtime_dir": folder,
        "_vllm_gateway_state_file": folder + "/server-state",
        "vllm_gateway_bind_address": "{{ vllm_gateway_source_address }}",
        "vllm_gateway_metrics_address": "{{ vllm_gateway_source_address }}",
        "vllm_gateway_port": ports["front"],
        "vllm_gateway_metrics_port": ports["metrics"],
        "vllm_gateway_peers_port": ports["peers"],
        # The example's Vault values, test values.
        "vllm_gateway_tls_certificate": cert,
        "vault_vllm_gateway_tls_key": key,
        "vault_vllm_gateway_keys": KEYS,
        "vault_vllm_api_key": "v" * 40,
        "vllm_gateway_health_interval_ms": 500,
    }
    env = {
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
        "HOME": str(tmp),
        "ANSIBLE_FORCE_COLOR": "0",
    }
    proc = run_ansible(
        "ansible-playbook",
        "-i",
        str(ROOT / "inventories" / "production"),
        "-i",
        str(tmp / "overlay.yml"),
        "-e",
        json.dumps(extra),
        str(tmp / "render.yml"),
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return etc


class Server(ThreadingHTTPServer):
    """The stand-ins' server: a deep accept queue (32 requests held at once), and quiet about HAProxy's health checks,
    which close their connections before the answer is read."""

    request_queue_size = 128
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass


class Backend:
    """A stand-in of one vLLM instance: 200 on GET /health; a POST is answered with its own address and the model the
    body named, after `hold` seconds when the body asks for them; every POST counted."""

    def __init__(self, address):
        self.posts = 0
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                self.answer(200, {"ok": True})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                backend.posts += 1
                time.sleep(float(body.get("hold") or 0))
                self.answer(200, {"address": address, "model": body.get("model"), "key": self.headers["Authorization"]})

            def answer(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = Server((address, 8000), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def gateways(tmp_path_factory):
    """The two gateways running the rendered configuration, in front of the stand-ins: {name: (front door URL,
    its configuration)}, the stand-ins and the HAProxy command."""
    tmp = tmp_path_factory.mktemp("gateway")
    command = haproxy(tmp)
    ports = {"front": free_port(), "metrics": free_port(), "peers": free_port()}
    etc = render(tmp, ports)
    backends = {name: Backend(address) for name, address in BACKENDS.items()}
    procs, doors = [], {}
    try:
        for name, address in GATEWAYS.items():
            config = etc / name / "haproxy.cfg"
            running = config.with_name("running.cfg")
            running.write_text(
                "".join(
                    line
                    for line in config.read_text().splitlines(keepends=True)
                    if line.split()[:1] not in (["user"], ["group"], ["chroot"])
                )
            )
            procs.append(subprocess.Popen([*command, "-db", "-f", str(running)], stderr=subprocess.PIPE, text=True))
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


def test_each_tenant_lists_and_uses_only_its_models_and_refusals_reach_no_instance(gateways):
    """chat-frontend lists both models and the alias; batch-jobs (the example limits it to the 14B) lists that one and
    its alias, and gets 403 for the other; an unknown model gets 404, a body without a model 400, a GET other than
    /v1/models 404: OpenAI-shaped, from the gateway, and no stand-in got a request."""
    door, _ = gateways["doors"]["gw-01.example.internal"]
    code, listed = status(door, KEYS["chat-frontend"], "/v1/models")
    assert code == 200 and listed["object"] == "list"
    assert sorted(m["id"] for m in listed["data"]) == sorted([SMALL, LARGE, "chat"])
    code, listed = status(door, KEYS["batch-jobs"], "/v1/models")
    assert code == 200 and [(m["id"], m["root"]) for m in listed["data"]] == [(LARGE, LARGE), ("chat", LARGE)]
    before = {name: b.posts for name, b in gateways["backends"].items()}
    for key, body, path, wanted, error in (
        (KEYS["batch-jobs"], {"model": SMALL, "prompt": "hi"}, "/v1/completions", 403, "model_not_allowed"),
        (KEYS["chat-frontend"], {"model": "no such model", "prompt": "hi"}, "/v1/completions", 404, "model_not_found"),
        (KEYS["chat-frontend"], {"prompt": "hi"}, "/v1/completions", 400, "model_required"),
        (KEYS["chat-frontend"], None, "/v1/models/" + SMALL, 404, "not_found"),
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
