"""roles/vllm_gateway/tasks/up.yml, which the drain, the readiness and the probe of every instance run first: a gateway
Ansible reaches is acted on; one it cannot reach whose front door does not answer the controller either is passed
over (down), with a message naming it; one it cannot reach whose front door still answers stops the run, since it may
still send the instance requests; one whose first SSH connection fails and whose second succeeds is acted on. Real
ansible-playbook on the controller: the gateway that is up is this machine
(local connection), the others have SSH on a closed port of loopback, and a front door that answers is a TLS server
of this test's own."""

import datetime
import http.server
import json
import socket
import ssl

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from conftest import ROOT, LocalServer, ansible_env, run_ansible

pytestmark = pytest.mark.integration


def closed_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again when the socket is


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def tls_server(tmp_path, opens_when=None):
    """A front door that answers /health over TLS on loopback (a self-signed certificate made here). With
    `opens_when` (a path), it closes every connection at once, before TLS, until that file exists: a door shut."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gw-open")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .sign(key, hashes.SHA256())
    )
    pem = tmp_path / "door.pem"
    pem.write_bytes(
        cert.public_bytes(serialization.Encoding.PEM)
        + key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    server = LocalServer(Health)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pem)
    if opens_when is None:
        server.server.socket = context.wrap_socket(server.server.socket, server_side=True)
        return server
    accept = server.server.socket.accept

    def get_request():
        conn, address = accept()
        if not opens_when.exists():
            conn.close()
            raise OSError("the door is shut")  # socketserver drops this connection and serves on
        return context.wrap_socket(conn, server_side=True), address

    server.server.get_request = get_request
    return server


def run_up(tmp_path, gateways, passes=1, between=None):
    """up.yml on the host node for `gateways` ({name: its vars}), `passes` times in one run (as the drain, the
    readiness and the probe of each instance do), running the command `between` after the first; (rc, output, the
    gateways the last pass kept as up)."""
    inventory = {
        "all": {
            "children": {
                "vllm_nodes": {"hosts": {"node": {"ansible_connection": "local"}}},
                "vllm_gateways": {"hosts": gateways},
            }
        }
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    out = tmp_path / "up.json"
    (tmp_path / "up.yml").write_text(
        yaml.safe_dump(
            [
                {
                    "hosts": "node",
                    "gather_facts": False,
                    "vars": {
                        "vllm_gateway_hosts": list(gateways),
                        "vllm_gateway_port": 443,
                        "vllm_gateway_instance": "cpu0",
                        "_vllm_gateway_server": "node_cpu0",
                    },
                    "tasks": [
                        {"ansible.builtin.include_tasks": str(ROOT / "roles" / "vllm_gateway" / "tasks" / "up.yml")},
                        *(
                            [
                                {
                                    "ansible.builtin.command": {"argv": between},
                                    "delegate_to": "localhost",
                                    "changed_when": False,
                                }
                            ]
                            if between
                            else []
                        ),
                        *(
                            {"ansible.builtin.include_tasks": str(ROOT / "roles" / "vllm_gateway" / "tasks" / "up.yml")}
                            for _ in range(passes - 1)
                        ),
                        {
                            "ansible.builtin.copy": {
                                "content": "{{ __vllm_gateway_up | to_json }}",
                                "dest": str(out),
                                "mode": "0600",
                            },
                            "delegate_to": "localhost",
                        },
                    ],
                }
            ]
        )
    )
    env = ansible_env(tmp_path, ANSIBLE_HOST_KEY_CHECKING="false")
    proc = run_ansible("ansible-playbook", "-i", "hosts.yml", "up.yml", cwd=tmp_path, env=env)
    kept = json.loads(out.read_text()) if out.exists() else None
    return proc.returncode, proc.stdout + proc.stderr, kept


def unreachable(door_port):
    """A gateway whose SSH refuses (a closed port of loopback) and whose front door is at door_port."""
    return {
        "ansible_connection": "ssh",
        "ansible_host": "127.0.0.1",
        "ansible_port": closed_port(),
        "vllm_gateway_port": door_port,
    }


def test_a_gateway_with_no_ssh_and_no_front_door_is_passed_over_by_name(tmp_path):
    gateways = {"gw-up": {"ansible_connection": "local"}, "gw-down": unreachable(closed_port())}
    rc, output, kept = run_up(tmp_path, gateways)
    assert rc == 0, output[-3000:]
    assert kept == ["gw-up"]
    assert "the gateway(s) gw-down are down (no SSH, twice; no front door): passed over, their peers serve" in output


def test_a_gateway_ansible_cannot_reach_whose_front_door_answers_stops_the_run(tmp_path):
    with tls_server(tmp_path) as door:
        gateways = {
            "gw-up": {"ansible_connection": "local"},
            "gw-down": unreachable(closed_port()),
            "gw-open": unreachable(door.port),
        }
        rc, output, kept = run_up(tmp_path, gateways)
    assert rc == 2 and kept is None, output[-3000:]
    assert "Ansible cannot reach the gateway(s) gw-open (SSH, twice: " in output
    assert "Connection refused" in output and "but their front door answers" in output
    assert "Nothing was restarted" in output


def test_every_gateway_that_answers_is_kept(tmp_path):
    rc, output, kept = run_up(
        tmp_path, {"gw-a": {"ansible_connection": "local"}, "gw-b": {"ansible_connection": "local"}}
    )
    assert rc == 0, output[-3000:]
    assert kept == ["gw-a", "gw-b"] and "are down (no SSH" not in output


def test_a_gateway_whose_first_ssh_connection_fails_is_reached_again_and_kept(tmp_path):
    """Its "ssh" is this test's own: the first call fails as an SSH connection does (exit 255), the next ones run
    the module's command on this machine, as a working SSH connection would on the gateway."""
    first = tmp_path / "first-done"
    ssh = tmp_path / "flaky-ssh"
    ssh.write_text(
        "#!/bin/sh\n"
        f"if [ ! -e {first} ]; then touch {first}\n"
        'echo "mux_client_read_packet: read header failed" >&2; exit 255; fi\n'
        'for last; do :; done\nexec /bin/sh -c "$last"\n'
    )
    ssh.chmod(0o755)
    flaky = {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_ssh_executable": str(ssh)}
    rc, output, kept = run_up(tmp_path, {"gw-up": {"ansible_connection": "local"}, "gw-flaky": flaky})
    assert first.exists(), "the first SSH connection was never tried"
    assert rc == 0, output[-3000:]
    assert kept == ["gw-up", "gw-flaky"] and "are down (no SSH" not in output


def test_a_gateway_found_down_is_asked_only_at_its_front_door_for_the_rest_of_the_run(tmp_path):
    """Three passes in one run: the first tries SSH twice and the front door; the next two ask only its front door,
    still silent, and pass it over again by name, without an SSH try."""
    gateways = {"gw-up": {"ansible_connection": "local"}, "gw-down": unreachable(closed_port())}
    rc, output, kept = run_up(tmp_path, gateways, passes=3)
    assert rc == 0, output[-3000:]
    assert kept == ["gw-up"]
    assert output.count("the gateway(s) gw-down are down") == 3, output[-3000:]
    # Each SSH try that fails shows as a failed item of the gateway: only the first pass's two.
    assert output.count("failed: [node -> gw-down] (item=gw-down)") == 2, output[-3000:]


def test_a_gateway_found_down_whose_front_door_answers_again_is_tried_over_ssh_and_stops_the_run(tmp_path):
    """Down at the first pass; by the second its front door answers (a host come back, its SSH not yet): it goes
    through the two SSH tries again, and the run stops there, before anything restarts."""
    opened = tmp_path / "door-open"
    with tls_server(tmp_path, opens_when=opened) as door:
        gateways = {"gw-up": {"ansible_connection": "local"}, "gw-back": unreachable(door.port)}
        rc, output, kept = run_up(tmp_path, gateways, passes=2, between=["touch", str(opened)])
    assert rc == 2 and kept is None, output[-3000:]
    assert output.count("the gateway(s) gw-back are down") == 1, output[-3000:]
    assert output.count("failed: [node -> gw-back] (item=gw-back)") == 4, output[-3000:]
    assert "Ansible cannot reach the gateway(s) gw-back (SSH, twice: " in output
    assert "but their front door answers" in output
