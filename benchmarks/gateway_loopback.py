"""The gateway's configuration as the vllm_gateway role renders it for the production example (inventories/production,
a second gateway added as its README shows), run by Debian 12's own HAProxy 2.6 on this machine's loopback, in front of
stand-ins of vLLM: what tests/unit/roles/test_vllm_gateway_config.py checks and benchmarks/gateway_routing.py measures.

The HAProxy binary comes from the package the lab's mirror serves the gateways (.cache/connected/debian/pool, which
scripts/test.sh's bootstrap builds), unpacked with dpkg-deb, never installed. What this machine cannot be is replaced:
- the hosts' addresses: the example's vLLM hosts at loopback addresses (127.0.1.N) where stand-ins of vLLM answer
  /health and echo the requests they get (which host a request reached; that a refused one reached none); the
  gateways at 127.0.2.N, on free ports;
- the gateway's folders (a temporary one) and the example's Vault values (test values made here, a certificate and
  key made with `cryptography`);
- for a running gateway, the global `user`, `group` and `chroot` lines, which drop privileges on a gateway host and
  are left out (``running_config``); nothing else of the file is changed."""

import datetime
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

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
        raise RuntimeError(
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


def render(
    tmp: Path,
    ports: dict[str, int],
    template: Path | None = None,
    extra: dict | None = None,
    host_vars: dict[str, dict] | None = None,
) -> Path:
    """Render each gateway's haproxy.cfg, maps and certificate into tmp/etc/<gateway>/ with the role's own
    template (or `template`, another revision's), vars and defaults over the example's inventory, with `extra` as
    further extra vars and `host_vars` as further variables of the named vLLM hosts (their LoRA adapters, say).
    RuntimeError with Ansible's output when the run fails."""
    etc = tmp / "etc"
    role = ROOT / "roles" / "vllm_gateway"
    defaults = yaml.safe_load((ROOT / "roles" / "vllm_defaults" / "defaults" / "main.yml").read_text())
    defaults.update(yaml.safe_load((role / "defaults" / "main.yml").read_text()))
    hosts = {
        name: {"ansible_host": address, "vllm_bind_address": address, **(host_vars or {}).get(name, {})}
        for name, address in BACKENDS.items()
    }
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
                    # The maps' task notifies the role's reload; here the bench starts HAProxy itself.
                    "handlers": [{"name": "Reload HAProxy", "ansible.builtin.debug": {"msg": "started by the bench"}}],
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
                        # The role's own task file: every map as the gateways get it.
                        {"ansible.builtin.import_tasks": str(role / "tasks" / "maps.yml")},
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
                                "src": str(template or role / "templates" / "haproxy.cfg.j2"),
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
    variables = {
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
        **(extra or {}),
    }
    env = {
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
        "HOME": str(tmp),
        "ANSIBLE_FORCE_COLOR": "0",
    }
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(ROOT / "inventories" / "production"),
            "-i",
            str(tmp / "overlay.yml"),
            "-e",
            json.dumps(variables),
            str(tmp / "render.yml"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            "rendering the gateway's configuration failed:\n" + proc.stdout[-4000:] + proc.stderr[-2000:]
        )
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
            # As uvicorn (vLLM's server) does: headers and body are written apart, which Nagle would hold up.
            disable_nagle_algorithm = True

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


def running_config(config: Path) -> Path:
    """The configuration a gateway runs here: `config` without its global user, group and chroot lines."""
    running = config.with_name("running.cfg")
    running.write_text(
        "".join(
            line
            for line in config.read_text().splitlines(keepends=True)
            if line.split()[:1] not in (["user"], ["group"], ["chroot"])
        )
    )
    return running


def start(command: list[str], config: Path) -> subprocess.Popen:
    """One gateway in the foreground (-db) on `config` in its running form (``running_config``), its output dropped."""
    return subprocess.Popen(
        [*command, "-db", "-f", str(running_config(config))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def rss_kib(pid: int) -> int:
    """A process's resident memory in KiB (/proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")
