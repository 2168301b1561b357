"""The two gateways behind their shared address (keepalived's VRRP; the failover under load, with the good change
rolled out while one was down, is test_fleet.py's good_rollout), and the lab's prefix balance: requests whose bodies
start alike (one system prompt, one conversation) go to one instance, and a drained instance's requests move to
another and come back to it when it is ready again; the tenants' request rates, shared between the gateways, hold a
tenant at its limit after the address moves. Runs after test_fleet.py, on the fleet it leaves serving."""

import hashlib
import ssl
import time
import urllib.error
import urllib.request

from lab import (
    CA,
    GATEWAY_HOSTS,
    KEYS,
    SHARED,
    on,
    sessions_by_server,
    set_server_state,
    start_gateway,
    stop_gateway,
    vip_holders,
    wait_gateways_settled,
)
from vllm_fleet import streamload

# Six applications, each with its own system prompt, longer than the body's first bytes that the balance hashes
# (vllm_gateway_prefix_bytes, 1024, of which the model's name and the message's start take about 60), and different
# within them: each application's turns share the key.
APPLICATIONS = [
    f"You are the {name} assistant of the lab. Answer briefly, in plain words, and say so when you do not know. " * 12
    for name in ("billing", "travel", "weather", "library", "kitchen", "garden")
]
TURNS = 4


def send(stream, system, question):
    result = stream.send([{"role": "system", "content": system}, {"role": "user", "content": question}])
    assert result["outcome"] == "ok", result
    return result


def where(stream, system, count=TURNS):
    """The instances (backend servers) that served `count` requests with this system prompt, and how many each."""
    before = sessions_by_server()
    for turn in range(count):
        wait_gateways_settled()
        send(stream, system, f"Question {turn}: what is {turn} plus {turn}?")
    after = sessions_by_server()
    return {server: after[server] - before.get(server, 0) for server in after if after[server] != before.get(server, 0)}


def client():
    key = (KEYS / "lab-team-a").read_text().strip()
    return streamload.Stream(
        SHARED, key, "tiny-qwen2", 4, ssl.create_default_context(cafile=str(CA)), timeout=60, connect_retries=4
    )


def test_both_gateways_hold_the_same_configuration_and_one_holds_the_address():
    """The same haproxy.cfg on both (the role renders it from the fleet's plan alone) but for the line that names
    each one among its peers, and one holder of the shared address."""
    configs = {host: on(host, "cat", "/etc/haproxy/haproxy.cfg").splitlines() for host in GATEWAY_HOSTS}
    for host, lines in configs.items():
        assert [line.strip() for line in lines if line.strip().startswith("localpeer ")] == [f"localpeer {host}"]
    digests = {
        host: hashlib.sha256("\n".join(x for x in lines if not x.strip().startswith("localpeer ")).encode()).hexdigest()
        for host, lines in configs.items()
    }
    assert len(set(digests.values())) == 1, digests
    assert len(vip_holders()) == 1, vip_holders()


def test_requests_sharing_a_prefix_go_to_one_instance():
    """Each application's requests all went to one instance; the six applications spread over more than one."""
    stream = client()
    placed = {}
    for system in APPLICATIONS:
        served = where(stream, system)
        assert len(served) == 1 and sum(served.values()) == TURNS, served
        placed[system[:20]] = next(iter(served))
    assert len(set(placed.values())) >= 2, placed


def test_a_drained_instances_requests_move_and_come_back():
    """An application's instance drained at both gateways (as the rollout drains it): its requests all go to one
    other instance; made ready again, they all come back to it."""
    stream = client()
    system = APPLICATIONS[0]
    home = where(stream, system)
    assert len(home) == 1, home
    server = next(iter(home))
    set_server_state(server, "drain")
    try:
        moved = where(stream, system)
    finally:
        set_server_state(server, "ready")
    assert len(moved) == 1 and server not in moved, (server, moved)
    back = where(stream, system)
    assert back == {server: TURNS}, (server, back)


def shared_status(key, path="/v1/models"):
    """The HTTP status of one GET through the shared address, the lab's CA checking the gateway's certificate."""
    request = urllib.request.Request(SHARED + path, headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=10, context=ssl.create_default_context(cafile=str(CA))) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:
        return refused.code


def test_a_tenant_at_its_limit_stays_limited_after_the_shared_address_moves():
    """lab-team-b may send 120 requests a minute. At its limit through the shared address (429), the gateway holding
    the address is stopped; the other takes it over and, having shared the tenant's count with it (HAProxy's peers),
    refuses the tenant's next request too, within the same minute. The stopped gateway is started again."""
    key = (KEYS / "lab-team-b").read_text().strip()
    (holder,) = vip_holders()
    started = time.monotonic()
    statuses = [shared_status(key) for _ in range(125)]
    assert 429 in statuses, statuses
    stop_gateway(holder)
    try:
        deadline = time.monotonic() + 30
        while vip_holders() in ([], [holder]) and time.monotonic() < deadline:
            time.sleep(0.5)
        (other,) = vip_holders()
        assert other != holder
        after = shared_status(key)
        elapsed = time.monotonic() - started
    finally:
        start_gateway(holder)
    assert elapsed < 50, f"the test took {elapsed:.0f} s: the minute the limit counts would be over"
    assert after == 429, (holder, other, after)
