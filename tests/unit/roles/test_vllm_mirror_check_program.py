"""The mirror's check (roles/vllm_monitoring/files/vllm-mirror-check.py), here on the controller: a stand-in mirror on
loopback (Python's http.server over a temporary folder) serving a signed manifest's files, the program run as its
service runs it, its result read back with prometheus_client's parser, and its serve mode started as its socket
unit starts it (the listening socket handed over at file descriptor 3). The whole of it on a real monitoring host,
its Prometheus and Alertmanager: molecule/fleet/tests/test_custody.py."""

import functools
import hashlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import ROOT, socket_activated

PROGRAM = ROOT / "roles" / "vllm_monitoring" / "files" / "vllm-mirror-check.py"
FILES = {
    "wheelhouse/vllm-cpu-0.32.0/requirements.lock": b"vllm==0.32.0 --hash=sha256:" + b"0" * 64 + b"\n",
    "wheelhouse/vllm-cpu-0.32.0/vllm-0.32.0-py3-none-any.whl": os.urandom(300_000),
    "models/lab/tiny model/SHA256SUMS": b"digests\n",
}


def sha(data):
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def mirror(tmp_path):
    """(the served folder, its URL, the config file): a mirror serving FILES and their signed manifest."""
    root = tmp_path / "mirror"
    for name, data in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    manifest = "".join(f"{sha(data)}  {name}\n" for name, data in sorted(FILES.items())).encode()
    (root / "BUNDLE.sha256").write_bytes(manifest)
    handler = functools.partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    (tmp_path / "expected.sha256").write_bytes(manifest)
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "manifest_url": f"{url}/BUNDLE.sha256",
                "manifest_sha256": sha(manifest),
                "bundle": 'vllm-fleet bundle lab "commit 0123abc"',
                "expected": str(tmp_path / "expected.sha256"),
                "result": str(tmp_path / "result.prom"),
                "timeout": 10,
                "stale_after": 93600,
            }
        )
    )
    yield root, url, config
    server.shutdown()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


def check(config):
    return subprocess.run(
        [sys.executable, "-I", "-S", str(PROGRAM), "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ["PATH"]},
    )


def metrics(text):
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def result(config):
    return metrics((config.parent / "result.prom").read_text())


def test_a_mirror_that_serves_the_signed_files_passes_and_says_what_it_read(mirror):
    _, _, config = mirror
    proc = check(config)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "checked 3 files" in proc.stdout and "0 altered, 0 missing, 0 unreadable" in proc.stdout
    found = result(config)
    assert found[("vllm_mirror_check_ok", ())] == 1
    assert found[("vllm_mirror_check_manifest_signed", ())] == 1
    assert found[("vllm_mirror_check_files", (("state", "listed"),))] == 3
    assert found[("vllm_mirror_check_files", (("state", "altered"),))] == 0
    assert found[("vllm_mirror_check_bytes", ())] == sum(len(d) for d in FILES.values())
    assert found[("vllm_mirror_check_stale_after_seconds", ())] == 93600
    assert found[("vllm_mirror_check_info", (("bundle", 'vllm-fleet bundle lab "commit 0123abc"'),))] == 1


def test_a_file_altered_in_place_is_named_with_both_digests_and_fails_the_check(mirror):
    root, _, config = mirror
    name = "wheelhouse/vllm-cpu-0.32.0/vllm-0.32.0-py3-none-any.whl"
    altered = bytearray(FILES[name])
    altered[1000] ^= 1
    (root / name).write_bytes(bytes(altered))
    proc = check(config)
    assert proc.returncode == 1, proc.stdout
    assert f"altered: {name}" not in proc.stdout  # named with the mirror's URL, as a host would fetch it
    assert f"/{name}: SHA-256 {sha(bytes(altered))}, the signed manifest gives {sha(FILES[name])}" in proc.stdout
    found = result(config)
    assert found[("vllm_mirror_check_ok", ())] == 0
    assert found[("vllm_mirror_check_files", (("state", "altered"),))] == 1
    assert found[("vllm_mirror_check_manifest_signed", ())] == 1  # the manifest was left as signed


def test_a_missing_file_and_another_manifest_are_each_counted(mirror):
    root, _, config = mirror
    (root / "models/lab/tiny model/SHA256SUMS").unlink()
    (root / "BUNDLE.sha256").write_bytes(b"another manifest\n")
    proc = check(config)
    assert proc.returncode == 1
    assert "missing: " in proc.stdout and "/models/lab/tiny model/SHA256SUMS: HTTP 404" in proc.stdout
    assert "not the manifest the site signed" in proc.stdout and "BUNDLE.sha256 is not the signed one" in proc.stdout
    found = result(config)
    assert found[("vllm_mirror_check_files", (("state", "missing"),))] == 1
    assert found[("vllm_mirror_check_manifest_signed", ())] == 0
    assert found[("vllm_mirror_check_ok", ())] == 0


def test_a_mirror_that_does_not_answer_is_a_failed_check_not_a_passed_one(mirror, tmp_path):
    _, _, config = mirror
    settings = json.loads(config.read_text())
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    settings["manifest_url"] = f"http://127.0.0.1:{port}/BUNDLE.sha256"
    config.write_text(json.dumps(settings))
    proc = check(config)
    assert proc.returncode == 1
    found = result(config)
    assert found[("vllm_mirror_check_files", (("state", "unreadable"),))] == 3
    assert found[("vllm_mirror_check_ok", ())] == 0


def test_a_broken_configuration_is_a_message_not_a_traceback(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"manifest_url": "http://127.0.0.1:1/BUNDLE.sha256"}))
    proc = check(config)
    assert proc.returncode == 2
    assert "manifest_sha256 is not set" in proc.stderr and "Traceback" not in proc.stderr


def test_the_serve_mode_answers_the_last_result_on_the_socket_systemd_hands_it(mirror):
    """Started as vllm-mirror-check-metrics.socket starts it (Accept=no): the listening socket at file descriptor 3,
    LISTEN_FDS=1 and LISTEN_PID its own. Before any check, an empty answer (the metrics are absent); after one, its
    result; another path is a 404."""
    _, _, config = mirror
    process, port = socket_activated([sys.executable, "-I", "-S", str(PROGRAM), "serve", "--config", str(config)])
    try:
        assert ask(port, "/metrics") == (200, b"")
        assert check(config).returncode == 0
        status, body = ask(port, "/metrics")
        assert status == 200 and metrics(body.decode())[("vllm_mirror_check_ok", ())] == 1
        assert ask(port, "/other")[0] == 404
    finally:
        process.kill()
        process.wait(timeout=10)


def ask(port, path):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_serve_mode_outside_systemd_says_what_it_expects(mirror):
    _, _, config = mirror
    proc = subprocess.run(
        [sys.executable, "-I", "-S", str(PROGRAM), "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ["PATH"]},
    )
    assert proc.returncode == 2 and "one listening socket from systemd" in proc.stderr
