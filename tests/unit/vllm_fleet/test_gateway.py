"""vllm_fleet.gateway (the vllm_gateway role's checks, tenants, servers, drain numbers), the filter plugin over it,
the plan's instances and --shutdown-timeout, and vllm_fleet.streamload against a stand-in of a streaming server.

The `show stat` fixture was captured from HAProxy 2.6.12 (Debian 12's) on the lab's gateway on 2026-12-01, with
4 streams in flight; the /metrics ones are the real vLLM captures of ../shared/fixtures."""
import http.server
import json
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from conftest import FIXTURES, ROOT, LocalServer
from vllm_fleet import gateway, planner, streamload

sys.path.insert(0, str(ROOT / "plugins" / "filter"))
import vllm_gateway as gateway_filters  # noqa: E402
import vllm_plan as plan_filters  # noqa: E402

CERT = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ\n-----END CERTIFICATE-----\n"
KEY = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49\n-----END PRIVATE KEY-----\n"
SECRET = "s3cr3t-0123456789abcdefghijKLMN"


def good():
    return {"vllm_gateway_tls_certificate": CERT, "vllm_gateway_tls_key": KEY,
            "vllm_gateway_api_keys": [{"tenant": "team-a", "key": SECRET, "requests_per_minute": 0},
                                      {"tenant": "team-b", "key": SECRET[::-1], "requests_per_minute": 600}],
            "vllm_gateway_port": 443, "vllm_gateway_bind_address": "0.0.0.0", "vllm_gateway_metrics_allow": ["10.0.0.0/24"],
            "ansible_host": "10.0.10.5"}


def test_good_settings_pass():
    assert gateway.check("gw1", good()) == []


@pytest.mark.parametrize("change, needle", [
    ({"vllm_gateway_tls_certificate": ""}, "gw1: vllm_gateway_tls_certificate is empty; fix:"),
    ({"vllm_gateway_tls_certificate": KEY}, "vllm_gateway_tls_certificate is not a PEM CERTIFICATE"),
    ({"vllm_gateway_tls_key": CERT}, "vllm_gateway_tls_key is not a PEM PRIVATE KEY"),
    ({"vllm_gateway_api_keys": []}, "vllm_gateway_api_keys is empty: the gateway would refuse every request"),
    ({"vllm_gateway_api_keys": [{"tenant": "a b", "key": SECRET}]}, "vllm_gateway_api_keys[0].tenant='a b' must be"),
    ({"vllm_gateway_api_keys": [{"tenant": "a", "key": SECRET}, {"tenant": "a", "key": SECRET[::-1]}]},
     "vllm_gateway_api_keys[1].tenant='a' is given twice"),
    ({"vllm_gateway_api_keys": [{"tenant": "a", "key": "short"}]}, "vllm_gateway_api_keys[0].key (value not shown)"),
    ({"vllm_gateway_api_keys": [{"tenant": "a", "key": SECRET}, {"tenant": "b", "key": SECRET}]},
     "vllm_gateway_api_keys[1].key (value not shown) is also another tenant's key"),
    ({"vllm_gateway_api_keys": [{"tenant": "a", "key": SECRET, "requests_per_minute": -1}]},
     "requests_per_minute=-1 must be a whole number"),
    ({"vllm_gateway_api_keys": [{"tenant": "a", "key": SECRET, "rate": 5}]}, "has unknown keys ['rate']"),
    ({"vllm_gateway_port": 70000}, "vllm_gateway_port=70000 must be a port number"),
    ({"vllm_gateway_bind_address": "gateway.example"}, "vllm_gateway_bind_address='gateway.example' is not an IP"),
    ({"vllm_gateway_metrics_allow": ["monitoring"]}, "vllm_gateway_metrics_allow has 'monitoring'"),
    ({"vllm_gateway_drain_timeout": 0}, "vllm_gateway_drain_timeout=0 must be a positive number"),
    ({"ansible_host": "gw-01.example.internal"},
     "vllm_gateway_source_address='gw-01.example.internal' (by default its ansible_host, else its name) is not an IP"),
])
def test_bad_settings_name_the_host_the_setting_and_the_fix_and_never_a_key(change, needle):
    errors = gateway.check("gw1", dict(good(), **change))
    assert any(needle in e for e in errors), errors
    assert all(e.startswith("gw1: ") and "fix:" in e for e in errors), errors
    text = " ".join(errors)
    assert SECRET not in text and SECRET[::-1] not in text and "short" not in text.replace("short_", "")


def test_a_gateway_named_by_dns_passes_with_its_source_address():
    values = dict(good(), ansible_host="gw-01.example.internal", vllm_gateway_source_address="10.0.10.5")
    assert gateway.check("gw1", values) == []


def test_clients_are_the_gateways_by_source_address_and_the_allowed_networks_by_family():
    gateways = {"gw-b": {"ansible_host": "gw-b.example", "vllm_gateway_source_address": "10.0.10.6"},
                "gw-a": {"ansible_host": "10.0.10.5"}, "10.0.10.7": {}}
    got = gateway.clients(gateways, ["10.0.20.0/24", "10.0.20.9", "fd00::5", "10.0.10.5"], "gpu-1")
    assert got == {"ipv4": ["10.0.10.5/32", "10.0.10.6/32", "10.0.10.7/32", "10.0.20.0/24", "10.0.20.9/32"],
                   "ipv6": ["fd00::5/128"]}
    assert gateway.clients({}, [], "gpu-1") == {"ipv4": [], "ipv6": []}


def test_clients_include_the_monitoring_hosts_by_their_ansible_host():
    got = gateway.clients({"gw-a": {"ansible_host": "10.0.10.5"}}, [], "gpu-1",
                          {"mon-1": {"ansible_host": "10.0.10.9"}, "10.0.10.8": {}})
    assert got == {"ipv4": ["10.0.10.5/32", "10.0.10.8/32", "10.0.10.9/32"], "ipv6": []}
    with pytest.raises(ValueError, match="gpu-1: the monitoring host mon-1's ansible_host has 'mon.example'"):
        gateway.clients({}, [], "gpu-1", {"mon-1": {"ansible_host": "mon.example"}})


@pytest.mark.parametrize("gateways, allowed, needle", [
    ({"gw-1": {"ansible_host": "gw-1.example"}}, [],
     "gpu-1: the gateway gw-1's vllm_gateway_source_address has 'gw-1.example', not an IP address"),
    ({}, ["monitoring.example"], "gpu-1: vllm_allowed_clients has 'monitoring.example', not an IP address"),
    ({}, "10.0.0.5", "gpu-1: vllm_allowed_clients='10.0.0.5' must be a list"),
])
def test_clients_that_are_not_addresses_are_refused_naming_the_host_setting_and_value(gateways, allowed, needle):
    with pytest.raises(ValueError, match="fix:") as raised:
        gateway.clients(gateways, allowed, "gpu-1")
    assert needle in str(raised.value)


def test_the_clients_filter_reads_the_gateways_from_hostvars():
    hostvars = {"gw-1": {"ansible_host": "10.0.10.5"}, "gpu-1": {"ansible_host": "10.0.30.1"}}
    got = gateway_filters.vllm_gateway_clients(hostvars, ["gw-1"], ["10.0.20.5"], "gpu-1")
    assert got == {"ipv4": ["10.0.10.5/32", "10.0.20.5/32"], "ipv6": []}
    got = gateway_filters.vllm_gateway_clients(dict(hostvars, **{"mon-1": {"ansible_host": "10.0.10.9"}}), ["gw-1"],
                                               [], "gpu-1", ["mon-1"])
    assert got == {"ipv4": ["10.0.10.5/32", "10.0.10.9/32"], "ipv6": []}
    with pytest.raises(gateway_filters.AnsibleFilterError, match="gpu-1: vllm_allowed_clients has 'x'"):
        gateway_filters.vllm_gateway_clients(hostvars, ["gw-1"], ["x"], "gpu-1")


def test_tenants_keep_only_the_keys_digests():
    tenants = gateway.tenants(good()["vllm_gateway_api_keys"])
    assert [t["tenant"] for t in tenants] == ["team-a", "team-b"]
    import hashlib
    assert tenants[0]["key_sha256"] == hashlib.sha256(SECRET.encode()).hexdigest()
    assert [t["requests_per_minute"] for t in tenants] == [0, 600]
    assert SECRET not in json.dumps(tenants)


def test_the_filter_refuses_malformed_keys_without_showing_them():
    with pytest.raises(AnsibleFilterError) as raised:
        gateway_filters.vllm_gateway_tenants([{"tenant": "a"}])
    assert "values not shown" in str(raised.value)


# What a lab host plans with (the lab's group_vars): the gateway's servers are its plan's instances.
PLANNED = {"vllm_profile_name": "cpu-lab-tiny", "vllm_version": "0.32.0",
           "vllm_gpu": {"name": "cpu", "memory_mib": 1024, "bandwidth_gb_s": 20, "count": 0},
           "vllm_environment": {"VLLM_CPU_KVCACHE_SPACE": "1"}}


def test_servers_are_the_plans_instances_one_per_instance():
    instances = plan_filters.vllm_plan_instances({
        "gpu-2.example": dict(PLANNED, vllm_bind_address="10.0.0.12", vllm_port=8001),
        "gpu-1.example": dict(PLANNED, ansible_host="10.0.0.11"),
        "gpu-3": dict(PLANNED, vllm_bind_address="fd00::3", vllm_instance="solo"),
        # Two CPU slots: two instances, on consecutive ports.
        "cpu-4": dict(PLANNED, ansible_host="10.0.0.14", vllm_gpu=dict(PLANNED["vllm_gpu"], count=2)),
    }, ["gpu-2.example", "gpu-1.example", "gpu-3", "cpu-4"])
    servers = gateway_filters.vllm_gateway_servers(instances)
    assert [(s["name"], s["address"], s["port"]) for s in servers] == [
        ("cpu-4_cpu0", "10.0.0.14", 8000), ("cpu-4_cpu1", "10.0.0.14", 8001),
        ("gpu-1.example_main", "10.0.0.11", 8000),  # binds every interface: reached at its inventory address
        ("gpu-2.example_main", "10.0.0.12", 8001),
        ("gpu-3_solo", "fd00::3", 8000)]
    assert instances["gpu-1.example"][0]["local_url"] == "http://127.0.0.1:8000"
    assert instances["gpu-3"][0]["local_url"] == "http://[fd00::3]:8000"
    assert instances["gpu-2.example"][0]["unit"] == "vllm@main.service"
    assert instances["cpu-4"][1]["unit"] == "vllm@cpu1.service"


def test_an_instance_the_plan_no_longer_has_stays_a_server_until_it_is_removed():
    """A host that runs `main` while its new plan places cpu0 and cpu1 (site.yml read what it runs): the gateway keeps
    `main` (retiring) beside the new ones, so that clients are served until the rollout drains and removes it."""
    planned = plan_filters.vllm_plan_instances({"h": dict(PLANNED, ansible_host="10.0.0.5",
                                                          vllm_gpu=dict(PLANNED["vllm_gpu"], count=2))}, ["h"])
    deployed = gateway_filters.vllm_gateway_deployed({
        "h": {"vllm_deployed_instances": [{"name": "main", "address": "10.0.0.5", "port": 8000},
                                          {"name": "cpu0", "address": "10.0.0.5", "port": 8000}]},
        "g": {},  # no vllm_deployed_instances read (not in this run): its plan's instances only
    }, ["h", "g", "absent"])
    assert deployed == {"h": [{"name": "main", "address": "10.0.0.5", "port": 8000},
                              {"name": "cpu0", "address": "10.0.0.5", "port": 8000}]}
    servers = gateway_filters.vllm_gateway_servers(planned, deployed)
    assert [(s["name"], s["port"], s["retiring"]) for s in servers] == [
        ("h_cpu0", 8000, False), ("h_cpu1", 8001, False), ("h_main", 8000, True)]
    with pytest.raises(AnsibleFilterError, match="vllm_gateway_deployed's"):
        gateway_filters.vllm_gateway_servers(planned, ["not", "a", "mapping"])


def test_server_names_are_safe_for_haproxy():
    assert gateway.server_name("gpu 1/x", "main") == "gpu-1-x_main"


def test_sessions_are_read_from_a_real_show_stat():
    stat = (FIXTURES / "haproxy" / "2.6.12-show-stat.csv").read_text()
    assert gateway.server_sessions(stat, "vllm", "lab-1_main") == 2
    assert gateway.server_sessions(stat, "vllm", "lab-2_main") == 2
    assert gateway.server_sessions(stat, "vllm", "lab-9_main") is None
    assert gateway_filters.vllm_gateway_sessions(stat, "vllm", "BACKEND") == 4


@pytest.mark.parametrize("fixture, running", [("0.32.0-cpu/metrics_idle.txt", 0.0),
                                              ("0.26.0-cuda-h200/metrics_after_bench.txt", 0.0)])
def test_running_requests_are_read_with_the_prometheus_parser(fixture, running):
    text = (FIXTURES / "vllm" / fixture).read_text()
    assert "vllm:num_requests_running{" in text
    assert gateway.requests_running(text) == running


def test_running_requests_count_what_vllm_reports():
    text = ("# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
            'vllm:num_requests_running{engine="1",model_name="m"} 2.0\n')
    assert gateway.requests_running(text) == 5.0
    with pytest.raises(AnsibleFilterError):
        gateway_filters.vllm_gateway_requests_running("<html>502 Bad Gateway</html>\n{")


def plan(extra):
    return plan_filters._plan("lab-1", dict(PLANNED, **extra))


def test_the_shutdown_timeout_is_rendered_where_the_release_has_it():
    entry = plan({"vllm_shutdown_timeout": 30})
    assert entry["errors"] == []
    assert entry["instances"][0]["args"][entry["instances"][0]["args"].index("--shutdown-timeout") + 1] == "30"
    assert plan({"vllm_shutdown_timeout": 0})["instances"][0]["args"].count("--shutdown-timeout") == 0


def test_a_release_before_0_18_drops_it_with_its_reason():
    entry = plan({"vllm_version": "0.17.1", "vllm_profile_name": None, "vllm_profile": {
        "model": "Qwen/Qwen2.5-0.5B-Instruct", "max_model_len": 2048, "max_num_seqs": 4,
        "gpu_memory_utilization": 0.9}, "vllm_shutdown_timeout": 30})
    assert "--shutdown-timeout" not in entry["instances"][0]["args"]
    assert any(d["flag"] == "--shutdown-timeout" and "0.18.0" in d["reason"] for d in entry["dropped"]), entry


def test_systemd_must_outlast_vllms_own_drain():
    entry = plan({"vllm_shutdown_timeout": 55, "vllm_timeout_stop_sec": 60})
    assert any("lab-1: vllm_timeout_stop_sec=60 does not outlast vllm_shutdown_timeout=55 by 10 s" in e
               and "fix: vllm_timeout_stop_sec: 85 or more" in e for e in entry["errors"]), entry["errors"]
    assert plan({"vllm_shutdown_timeout": 30, "vllm_timeout_stop_sec": 40})["errors"] == []


def test_the_plan_lists_its_instances():
    entry = plan({"vllm_bind_address": "10.89.77.11"})
    (instance,) = entry["instances"]
    assert {key: value for key, value in instance.items() if key != "args"} == {
        "name": "main", "unit": "vllm@main.service", "port": 8000, "local_url": "http://10.89.77.11:8000",
        "address": "10.89.77.11", "url": "http://10.89.77.11:8000", "gpus": [0], "tensor_parallel_size": 1}
    assert instance["args"][instance["args"].index("--port") + 1] == "8000"
    assert planner.instances("h", dict(PLANNED, vllm_bind_address="0.0.0.0"))[0]["address"] == "h"


class Streaming(http.server.BaseHTTPRequestHandler):
    """Streams chat chunks like vLLM; a prompt of 'cut' ends the stream early, 'refuse' answers 401."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = body["messages"][0]["content"]
        if prompt == "refuse" or self.headers.get("Authorization") != "Bearer k":
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for i in range(3):
            chunk = {"choices": [{"index": 0, "delta": {"content": str(i)}, "finish_reason": None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            if prompt == "cut":
                return
        end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        self.wfile.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())


@pytest.mark.parametrize("prompt, key, outcome", [("go", "k", "ok"), ("cut", "k", "cut"), ("go", "bad", "failed")])
def test_streamload_tells_finished_cut_and_failed_streams(prompt, key, outcome):
    with LocalServer(Streaming) as server:
        stream = streamload.Stream(server.url, key, "m", 3, None, timeout=10)
        result = stream.send(prompt)
    assert result["outcome"] == outcome, result
    if outcome != "failed":
        assert result["ttft"] is not None and result["tokens"] >= 1


def test_streamload_is_bounded_and_counts():
    with LocalServer(Streaming) as server:
        stream = streamload.Stream(server.url, "k", "m", 3, None, timeout=10)
        result = streamload.run(stream, concurrency=2, max_seconds=30, max_requests=7, stop_file=None)
    assert (result["requests"], result["ok"], result["failed"], result["cut"]) == (7, 7, 0, 0)
    assert result["ttft_ms"]["p50"] is not None
    with pytest.raises(ValueError):
        streamload.run(stream, concurrency=0, max_seconds=30, max_requests=7, stop_file=None)


def test_streamload_users_pause_between_answers():
    with LocalServer(Streaming) as server:
        stream = streamload.Stream(server.url, "k", "m", 3, None, timeout=10)
        result = streamload.run(stream, concurrency=1, max_seconds=30, max_requests=3, stop_file=None,
                                think_seconds=0.2)
    starts = [r["start"] for r in result["log"]]
    assert result["ok"] == 3 and all(b - a >= 0.2 for a, b in zip(starts, starts[1:])), starts
