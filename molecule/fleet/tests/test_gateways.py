"""The two gateways behind their shared address (keepalived's VRRP; the failover under load, with the good change
rolled out while one was down, is test_fleet.py's good_rollout), and the lab's prefix balance: requests whose bodies
start alike (one system prompt, one conversation) go to one instance, and a drained instance's requests move to
another and come back to it when it is ready again; the tenants' request rates, shared between the gateways, hold a
tenant at its limit after the address moves. Runs after test_fleet.py, on the fleet it leaves serving."""

import hashlib
import json
import socket
import ssl
import struct
import time
import urllib.error
import urllib.request

from lab import (
    CA,
    GATEWAY_ADDRESSES,
    GATEWAY_HOSTS,
    KEYS,
    SHARED,
    VIP,
    kill_gateway,
    on,
    sessions_by_server,
    set_server_state,
    start_gateway,
    vip_holders,
    wait_gateways_settled,
    watch_shared_address,
)
from labtools import streamload
from labtools.failover import outage

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


def test_a_dead_holder_is_replaced_within_3_s_and_a_tenant_at_its_limit_stays_limited():
    """lab-team-b may send 120 requests a minute. At its limit through the shared address (429), the gateway holding
    the address dies at once (podman kill: no clean stop, its network gone, as a power loss). The other misses three
    of its VRRPv3 adverts (0.5 s apart) and takes the address: the address answers again (/health, asked every 50 ms
    from this machine) within 3 s of the kill, and, having shared the tenant's count with the dead one (HAProxy's
    peers), the new holder refuses the tenant's next request too, within the same minute. The dead gateway is started
    again."""
    key = (KEYS / "lab-team-b").read_text().strip()
    (holder,) = vip_holders()
    started = time.monotonic()
    statuses = [shared_status(key) for _ in range(125)]
    assert 429 in statuses, statuses
    with watch_shared_address(seconds=60) as watch:
        watch.wait_answering(since=0, settle=1.0, bound=20)
        killed_at = watch.now()
        kill_gateway(holder)
        try:
            watch.wait_answering(since=killed_at, settle=1.0, bound=30)
            window = outage(watch.answers, killed_at)
            (other,) = vip_holders()
            after = shared_status(key)
            elapsed = time.monotonic() - started
        finally:
            start_gateway(holder)
    print(f"the address answered again {window['back'] - killed_at:.2f} s after the kill ({window})")
    assert other != holder
    assert window["back"] is not None and window["back"] - killed_at <= 3.0, window
    assert elapsed < 50, f"the test took {elapsed:.0f} s: the minute the limit counts would be over"
    assert after == 429, (holder, other, after)


def vrrp_advert(source, destination, router_id, priority, address):
    """A VRRPv3 advertisement for IPv4 (RFC 5798, 5.1): version 3 and type 1, the router id, the priority, one
    address, a 0.5 s interval (in centiseconds), its checksum over the IPv4 pseudo-header and the packet."""
    body = bytearray(struct.pack("!BBBBH", 0x31, router_id, priority, 1, 50) + b"\0\0" + socket.inet_aton(address))
    pseudo = socket.inet_aton(source) + socket.inet_aton(destination) + struct.pack("!BBH", 0, 112, len(body))
    data = pseudo + bytes(body)
    total = sum(int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    body[6:8] = struct.pack("!H", ~total & 0xFFFF)
    return bytes(body)


def vrrp_refused(host):
    """The packets the gateway's VRRP table dropped so far (its named counter `refused`)."""
    listed = json.loads(on(host, "nft", "--json", "list", "counter", "inet", "vllm_vrrp", "refused"))
    return next(item["counter"]["packets"] for item in listed["nftables"] if "counter" in item)


def test_vrrp_from_anyone_but_the_other_gateway_is_dropped_and_counted():
    """VRRPv3 carries no authentication, so each gateway admits VRRP only from the other's own address (its
    nftables table vllm_vrrp). This machine, on the lab network but not a gateway, sends the holder five adverts of
    the gateways' router id with priority 254 (above the holder's 200: heard, they would make it give the address
    up): every one is dropped and counted, and the holder keeps the address. Sent only where this machine has a
    route to the lab network, with TTL 255 as VRRP requires."""
    (holder,) = vip_holders()
    destination = GATEWAY_ADDRESSES[holder]
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.connect((destination, 9))  # no packet: the kernel's route to the gateway, and this machine's address on it
    source = probe.getsockname()[0]
    probe.close()
    assert source.startswith("10.89.77."), f"no route to the lab network from here: {source}"
    rules = on(holder, "nft", "list", "table", "inet", "vllm_vrrp")
    other = next(h for h in GATEWAY_HOSTS if h != holder)
    # nft names protocol 112 "vrrp" where the host's /etc/protocols does.
    admitted = [line.split() for line in rules.splitlines() if line.strip().endswith(" accept")]
    assert len(admitted) == 1 and admitted[0][:3] == ["ip", "saddr", GATEWAY_ADDRESSES[other]], rules
    assert admitted[0][3:] in (["meta", "l4proto", "vrrp", "accept"], ["meta", "l4proto", "112", "accept"]), rules
    before = vrrp_refused(holder)
    sender = socket.socket(socket.AF_INET, socket.SOCK_RAW, 112)
    sender.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 255)
    try:
        for _ in range(5):
            sender.sendto(vrrp_advert(source, destination, 51, 254, VIP), (destination, 0))
            time.sleep(0.25)
    finally:
        sender.close()
    time.sleep(2)  # past three adverts' time: heard, the holder would have given the address up by now
    assert vrrp_refused(holder) - before >= 5, (before, rules)
    assert vip_holders() == [holder]
    assert "version 3" in on(holder, "cat", "/etc/keepalived/keepalived.conf")
