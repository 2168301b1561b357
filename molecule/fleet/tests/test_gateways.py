"""The two gateways behind their shared address (keepalived's VRRP; the failover under load, with the good change
rolled out while one was down, is test_fleet.py's good_rollout), and the lab's prefix balance: requests whose bodies
start alike (one system prompt, one conversation) go to one instance, and a drained instance's requests move to
another and come back to it when it is ready again; the tenants' request rates, shared between the gateways, hold a
tenant at its limit after the address moves. Runs after test_fleet.py, on the fleet it leaves serving."""

import contextlib
import hashlib
import json
import os
import socket
import ssl
import struct
import time
import urllib.error
import urllib.request

import yaml

from lab import (
    CA,
    CACHE,
    GATEWAY_ADDRESSES,
    GATEWAY_HOSTS,
    HOSTS,
    INSTANCES,
    INVENTORY,
    KEYS,
    MODELS,
    SHARED,
    VIP,
    kill_gateway,
    on,
    playbook,
    sessions_by_server,
    set_server_state,
    site,
    start_gateway,
    stream_loop,
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


# --- LoRA adapters (molecule/fleet/host_vars/fleet-2.yml: lab-tutor beside fleet-2's model, added and removed at
# runtime there; fleet-1 serves none) ---
ADAPTER, ADDED = "lab-tutor", "lab-poet"
MIRROR = "http://10.89.77.2:8080/adapters/lab"
BOTH = [{"name": ADAPTER, "url": f"{MIRROR}/tutor"}, {"name": ADDED, "url": f"{MIRROR}/poet"}]


def shared_post(key, body, path="/v1/completions"):
    """(HTTP status, JSON answer) of one POST through the shared address."""
    request = urllib.request.Request(
        SHARED + path,
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60, context=ssl.create_default_context(cafile=str(CA))) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read() or b"{}")


def greedy(model, key_name="lab-team-a"):
    """The greedy answer (text and token ids) of one completion by `model`'s name through the shared address."""
    code, answer = shared_post(
        (KEYS / key_name).read_text().strip(),
        {"model": model, "prompt": "The quick brown fox", "max_tokens": 8, "temperature": 0, "return_token_ids": True},
    )
    assert code == 200, (model, answer)
    choice = answer["choices"][0]
    return answer["model"], choice["text"], choice.get("token_ids")


def served_adapters(host, instance="cpu0"):
    """The adapters an instance lists in its own /v1/models (the cards with a parent), from inside its host."""
    port = 8000 if instance == "cpu0" else 8001
    listed = json.loads(on(host, "curl", "-s", "-m", "30", f"http://{HOSTS[host]}:{port}/v1/models"))
    return sorted(m["id"] for m in listed["data"] if m.get("parent"))


def test_an_adapter_answers_by_its_name_through_the_gateway_and_differently_from_its_model():
    """lab-tutor, staged from the mirror beside fleet-2's model on both its instances: a completion by its name through
    the shared address is answered by it (vLLM names it as the model), greedily, and not as its model answers; fleet-1's
    instances load no adapter."""
    model, text, tokens = greedy(ADAPTER)
    base = greedy(MODELS["fleet-2"])
    assert model == ADAPTER
    assert (text, tokens) != base[1:], (text, tokens, base)
    assert [served_adapters("fleet-2", i) for i in INSTANCES] == [[ADAPTER]] * 2
    assert [served_adapters("fleet-1", i) for i in INSTANCES] == [[]] * 2


@contextlib.contextmanager
def with_vars(host, **values):
    """The operator's inventory with `values` among the host's own variables (its host_vars), put back as it was on
    leaving."""
    path = INVENTORY / "host_vars" / f"{host}.yml"
    text = path.read_text()
    path.write_text(yaml.safe_dump({**yaml.safe_load(text), **values}, sort_keys=False))
    try:
        yield
    finally:
        path.write_text(text)


def main_pids(host):
    return {i: on(host, "systemctl", "show", "-p", "MainPID", "--value", f"vllm@{i}").strip() for i in INSTANCES}


def test_an_adapter_altered_on_the_mirror_stops_its_host_before_any_restart():
    """lab-poet added on fleet-2, its weights altered in place on the mirror (its SHA256SUMS and the signed manifest
    as they were): the host fetches it before the rollout restarts anything, the file does not match its SHA256SUMS,
    and the run stops there, no instance drained or restarted. The file is put back, and the inventory."""
    weights = CACHE / "mirror" / "adapters" / "lab" / "poet" / "adapter_model.safetensors"
    data, times = weights.read_bytes(), weights.stat()
    pids = main_pids("fleet-2")
    try:
        weights.write_bytes(data + b"\0")
        with with_vars("fleet-2", vllm_lora_adapters=BOTH):
            rc, output = site("-l", "fleet-2:vllm_gateways", run_id="lora-altered", timeout=900)
    finally:
        weights.write_bytes(data)
        os.utime(weights, ns=(times.st_atime_ns, times.st_mtime_ns))
    assert rc != 0, output[-3000:]
    assert f"Fetch each file adapter {ADDED}" in output and "fatal: [fleet-2]" in output, output[-6000:]
    assert "Drain the instance at every gateway" not in output  # the rollout never began
    assert main_pids("fleet-2") == pids


def test_an_adapter_added_and_removed_at_runtime_with_streams_running_and_none_failing():
    """Two runs of site.yml limited to fleet-2 and the gateways, as an operator makes them (its host_vars, where
    vllm_lora_runtime_updates is on), with streams to fleet-2's model and to lab-tutor through the shared address all
    along (none fails, none is cut):
    1. lab-poet added: only the adapters change, so nothing restarts (the same main processes): each instance loads it
       through vLLM's runtime endpoint, both list it in their own /v1/models (the verification read them back against
       the plan) and it answers by its name through the gateway;
    2. lab-poet removed: each instance unloads it at runtime, still without a restart; the gateway then says lab-poet
       does not exist and no instance lists it.
    An adapter change with the setting off is an argument change like any other, which the rollout makes instance by
    instance with drains (test_fleet.py's good change)."""
    before = main_pids("fleet-2")
    loop = stream_loop("lora-change", seconds=1200, think=4, url=SHARED, models=[MODELS["fleet-2"], ADAPTER])
    try:
        with with_vars("fleet-2", vllm_lora_adapters=BOTH):
            rc, output = site("-l", "fleet-2:vllm_gateways", run_id="lora-add-runtime", timeout=1200)
            assert rc == 0, output[-4000:]
            added = [served_adapters("fleet-2", i) for i in INSTANCES]
            loaded = output.count(f"(item={ADDED})")
            answered = greedy(ADDED)[0]
            after_adding = main_pids("fleet-2")
        rc, output = site("-l", "fleet-2:vllm_gateways", run_id="lora-remove-runtime", timeout=1200)
        assert rc == 0, output[-4000:]
        unloaded = output.count(f"(item={ADDED})")
    finally:
        result = loop()
        # The runs above planned fleet-2 alone: plan.json, which test_instances.py reads, holds every host again.
        planned, _ = playbook("playbooks/plan.yml", timeout=300)
    assert planned == 0
    print(json.dumps({k: v for k, v in result.items() if k != "log"}, indent=2))
    assert added == [sorted([ADAPTER, ADDED])] * 2 and answered == ADDED
    assert loaded >= 2 and unloaded >= 2, "the load and unload tasks ran for each instance"
    code, gone = shared_post((KEYS / "lab-team-a").read_text().strip(), {"model": ADDED, "prompt": "hi"})
    assert code == 404 and gone["error"]["code"] == "model_not_found", gone
    assert [served_adapters("fleet-2", i) for i in INSTANCES] == [[ADAPTER]] * 2
    assert before == after_adding == main_pids("fleet-2"), "loaded and unloaded at runtime: no restart"
    assert result["requests"] >= 10, result
    assert result["failed"] == 0 and result["cut"] == 0, result["errors"]
    # One user streams fleet-2's own model, the other the adapter (both served on fleet-2 only).
    assert result["models"][ADAPTER]["ok"] >= 3 and result["models"][MODELS["fleet-2"]]["ok"] >= 3, result["models"]


def test_an_adapter_is_refused_to_a_tenant_whose_list_does_not_name_it():
    """lab-team-b may use tiny-qwen2 (its list), not its adapter: 403 from the gateway, OpenAI-shaped, and its
    /v1/models lists no adapter; lab-team-a's lists the adapter with its model as parent."""
    key = (KEYS / "lab-team-b").read_text().strip()
    # test_fleet.py's test_a_tenant_rate_limit_holds... drives lab-team-b to its limit of 120 requests a minute, and
    # the gateway says 429 before it looks at the model. This test runs minutes after it (after the adapters' runs,
    # not before them), when the minute is long over; should it still say 429, ask again every 5 s (bounded).
    deadline = time.monotonic() + 90
    code, refused = shared_post(key, {"model": ADAPTER, "prompt": "hi"})
    while code == 429 and time.monotonic() < deadline:
        time.sleep(5)
        code, refused = shared_post(key, {"model": ADAPTER, "prompt": "hi"})
    assert code == 403 and refused["error"]["code"] == "model_not_allowed", refused
    for tenant, wanted in (("lab-team-b", []), ("lab-team-a", [ADAPTER])):
        request = urllib.request.Request(
            SHARED + "/v1/models", headers={"Authorization": f"Bearer {(KEYS / tenant).read_text().strip()}"}
        )
        with urllib.request.urlopen(request, timeout=10, context=ssl.create_default_context(cafile=str(CA))) as answer:
            cards = json.loads(answer.read())["data"]
        assert [m["id"] for m in cards if m.get("parent")] == wanted, cards


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
