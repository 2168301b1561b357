"""Routing by model at the gateway (vllm_fleet.gateway: backend_name, servers, routes, route_errors): one HAProxy
backend per served model, the maps haproxy.cfg looks a request's model and tenant up in, each tenant's
GET /v1/models answer, and the plan-time errors of those settings. The maps' behaviour in a real HAProxy is the
fleet and production scenarios' (molecule/*/tests)."""

import hashlib
import json

import pytest

from vllm_fleet import gateway

SECRET = "k" * 40
ODD = "tiny qwen 100% $HOME \"q\" 'x'"


def instance(name, port, model, weights):
    return {"name": name, "address": "10.0.0.5", "port": port, "served_model_name": model, "weights": weights}


# Two hosts of one model (its weights under one name) and one of another, as the production example's groups.
PLANNED = {
    "l40-1": [instance("gpu0", 8000, "Qwen/Qwen2.5-14B-Instruct", "Qwen/Qwen2.5-14B-Instruct")],
    "l40-2": [instance("gpu0", 8000, "Qwen/Qwen2.5-14B-Instruct", "Qwen/Qwen2.5-14B-Instruct")],
    "4090-1": [instance("main", 8000, ODD, "lab/tiny-qwen2")],
}


def test_a_backend_is_named_by_its_model_and_two_names_never_share_one():
    assert gateway.backend_name("tiny-qwen2") == "model-tiny-qwen2"
    slash, dash = gateway.backend_name("org/m"), gateway.backend_name("org-m")
    assert slash.startswith("model-org-m-") and dash == "model-org-m" and slash != dash
    assert (
        gateway.backend_name(ODD)
        == "model-tiny-qwen-100---HOME--q---x--" + hashlib.sha256(ODD.encode()).hexdigest()[:10]
    )
    assert all(c.isalnum() or c in "-_.:" for c in gateway.backend_name(ODD))


def test_each_server_carries_its_model_and_backend_and_a_retiring_one_its_hosts():
    deployed = {"l40-1": [{"name": "main", "address": "10.0.0.5", "port": 8000}]}
    servers = {s["name"]: s for s in gateway.servers(PLANNED, deployed)}
    assert (
        servers["l40-1_gpu0"]["backend"]
        == servers["l40-2_gpu0"]["backend"]
        == gateway.backend_name("Qwen/Qwen2.5-14B-Instruct")
    )
    assert servers["4090-1_main"]["model"] == ODD and servers["4090-1_main"]["weights"] == "lab/tiny-qwen2"
    # An instance the plan no longer has served its host's model until it is removed.
    assert servers["l40-1_main"]["retiring"] and servers["l40-1_main"]["model"] == "Qwen/Qwen2.5-14B-Instruct"
    # A host whose plan places nothing (its errors stop it) leaves its retiring instance in no backend.
    orphan = gateway.servers({}, {"gone": [{"name": "main", "address": "10.0.0.9", "port": 8000}]})
    assert orphan[0]["backend"] == "" and gateway.routes(orphan, [])["backends"] == []


def test_routes_give_one_backend_per_model_and_each_tenant_its_models():
    servers = gateway.servers(PLANNED)
    keys = [
        {"tenant": "chat", "key": SECRET},
        {"tenant": "batch", "key": SECRET[::-1], "models": ["Qwen/Qwen2.5-14B-Instruct"], "max_concurrent": 4},
    ]
    routes = gateway.routes(servers, keys)
    big = gateway.backend_name("Qwen/Qwen2.5-14B-Instruct")
    assert [(b["name"], b["model"], [s["name"] for s in b["servers"]]) for b in routes["backends"]] == sorted(
        [
            (big, "Qwen/Qwen2.5-14B-Instruct", ["l40-1_gpu0", "l40-2_gpu0"]),
            (gateway.backend_name(ODD), ODD, ["4090-1_main"]),
        ]
    )
    assert routes["allowed"] == sorted(
        ["batch/Qwen/Qwen2.5-14B-Instruct", "chat/Qwen/Qwen2.5-14B-Instruct", f"chat/{ODD}"]
    )
    chat = json.loads(routes["lists"]["chat"])
    assert chat["object"] == "list" and sorted(m["id"] for m in chat["data"]) == sorted(
        [ODD, "Qwen/Qwen2.5-14B-Instruct"]
    )
    assert all(m["object"] == "model" for m in chat["data"])
    assert [m["id"] for m in json.loads(routes["lists"]["batch"])["data"]] == ["Qwen/Qwen2.5-14B-Instruct"]
    # The maps: keyed by the SHA-256 of the name (haproxy.cfg: digest(sha256),hex), a name may hold spaces; one
    # line per map entry, each after a comment naming it; the list on one line.
    models = routes["maps"]["models"]
    assert f"{hashlib.sha256(ODD.encode()).hexdigest()} {gateway.backend_name(ODD)}" in models and f"# {ODD}" in models
    key = "batch/Qwen/Qwen2.5-14B-Instruct"
    assert f"{hashlib.sha256(key.encode()).hexdigest()} 1" in routes["maps"]["allowed"]
    assert all("\n" not in line for lines in routes["maps"].values() for line in lines)
    assert routes["maps"]["concurrency"] == ["chat 0", "batch 4"]
    assert SECRET not in json.dumps(routes) and SECRET[::-1] not in json.dumps(routes)


def test_tenants_keep_their_limits_and_never_their_keys():
    kept = gateway.tenants([{"tenant": "a", "key": SECRET, "requests_per_minute": 60, "max_concurrent": 8}])
    assert kept == [
        {
            "tenant": "a",
            "key_sha256": hashlib.sha256(SECRET.encode()).hexdigest(),
            "requests_per_minute": 60,
            "max_concurrent": 8,
        }
    ]


def test_routes_pass_the_plan_time_check_as_the_example_writes_them():
    keys = [{"tenant": "batch", "key": SECRET, "models": ["Qwen/Qwen2.5-14B-Instruct"]}]
    assert gateway.route_errors("gw", gateway.servers(PLANNED), keys, 1048576) == []


@pytest.mark.parametrize(
    "planned, keys, max_body, wanted",
    [
        (
            {**PLANNED, "4090-1": [instance("main", 8000, "Qwen/Qwen2.5-14B-Instruct", "lab/tiny-qwen2")]},
            [],
            None,
            "gw: the served name 'Qwen/Qwen2.5-14B-Instruct' is given to 2 different models (Qwen/Qwen2.5-14B-Instruct "
            "on l40-1, l40-2; lab/tiny-qwen2 on 4090-1)",
        ),
        (
            {"h": [instance("main", 8000, "bad\nname", "w")]},
            [],
            None,
            "holds a control or format character",
        ),
        (
            {"h": [instance("main", 8000, "m" * 257, "w")]},
            [],
            None,
            "longer than 256",
        ),
        (
            PLANNED,
            [{"tenant": "t", "key": SECRET, "models": ["chat"]}],
            None,
            "vllm_gateway_api_keys[0].models (tenant 't') names 'chat', which no backend host serves",
        ),
        (
            PLANNED,
            [{"tenant": "t", "key": SECRET, "models": []}],
            None,
            "vllm_gateway_api_keys[0].models (tenant 't') is empty",
        ),
        (PLANNED, [{"tenant": "t", "key": SECRET, "models": "chat"}], None, "is not a list of served model names"),
        (PLANNED, [], 1024, "vllm_gateway_max_body_bytes=1024 must be a whole number of bytes from 65536 to 67108864"),
        (PLANNED, [], "lots", "vllm_gateway_max_body_bytes='lots'"),
    ],
)
def test_route_errors_name_the_host_setting_value_and_fix(planned, keys, max_body, wanted):
    errors = gateway.route_errors("gw", gateway.servers(planned), keys, max_body)
    assert len(errors) == 1 and wanted in errors[0] and "fix:" in errors[0], errors
    assert SECRET not in errors[0]


@pytest.mark.parametrize(
    "entry, wanted",
    [
        ({"max_concurrent": -1}, "max_concurrent=-1 must be a whole number of requests in flight at once"),
        ({"max_concurrent": "8"}, "max_concurrent='8' must be a whole number"),
        ({"rate": 5}, "has unknown keys ['rate']; fix: only tenant, key, requests_per_minute, max_concurrent, models"),
    ],
)
def test_a_tenants_limits_are_checked(entry, wanted):
    errors = gateway.check("gw", {"vllm_gateway_api_keys": [{"tenant": "a", "key": SECRET, **entry}]})
    assert any(wanted in e for e in errors), errors


def test_the_gateways_share_request_rates_as_peers_by_their_own_addresses():
    assert gateway.peers(
        {
            "gw-2": {"ansible_host": "10.0.0.6"},
            "gw 1": {"vllm_gateway_source_address": "10.0.0.5", "ansible_host": "gw1.example"},
            "gw-3.example": {},
        }
    ) == [
        {"name": "gw-1", "address": "10.0.0.5"},
        {"name": "gw-2", "address": "10.0.0.6"},
        {"name": "gw-3.example", "address": "gw-3.example"},
    ]


def test_an_alias_goes_to_its_models_backend_for_the_tenants_of_that_model():
    """vllm_model_aliases {chat: the 14B}: a request for chat goes to the 14B's backend; a tenant limited to the 14B may
    use chat too and lists it (its root the 14B); a tenant limited to the other model neither."""
    servers = gateway.servers(PLANNED)
    keys = [
        {"tenant": "all", "key": SECRET},
        {"tenant": "big", "key": SECRET, "models": ["Qwen/Qwen2.5-14B-Instruct"]},
        {"tenant": "small", "key": SECRET, "models": [ODD]},
        {"tenant": "alias", "key": SECRET, "models": ["chat"]},
    ]
    aliases = {"chat": "Qwen/Qwen2.5-14B-Instruct"}
    assert gateway.route_errors("gw", servers, keys, None, aliases) == []
    routes = gateway.routes(servers, keys, aliases)
    assert routes["models"]["chat"] == gateway.backend_name("Qwen/Qwen2.5-14B-Instruct")
    listed = {tenant: json.loads(text)["data"] for tenant, text in routes["lists"].items()}
    assert [(m["id"], m["root"]) for m in listed["big"]] == [
        ("Qwen/Qwen2.5-14B-Instruct", "Qwen/Qwen2.5-14B-Instruct"),
        ("chat", "Qwen/Qwen2.5-14B-Instruct"),
    ]
    assert [m["id"] for m in listed["small"]] == [ODD]
    assert [m["id"] for m in listed["alias"]] == ["chat"]
    assert sorted(m["id"] for m in listed["all"]) == sorted(["Qwen/Qwen2.5-14B-Instruct", ODD, "chat"])
    assert "big/chat" in routes["allowed"] and "small/chat" not in routes["allowed"]
    # Moved to the other model: only the gateway's maps change.
    moved = gateway.routes(servers, keys, {"chat": ODD})
    assert moved["models"]["chat"] == gateway.backend_name(ODD) and "small/chat" in moved["allowed"]


@pytest.mark.parametrize(
    "aliases, wanted",
    [
        (
            {"chat": "Qwen/Qwen2.5-72B-Instruct"},
            "vllm_model_aliases['chat']='Qwen/Qwen2.5-72B-Instruct' points at a model no",
        ),
        ({ODD: "Qwen/Qwen2.5-14B-Instruct"}, "is also a served model's name"),
    ],
)
def test_an_alias_must_point_at_a_served_model_and_be_no_served_name(aliases, wanted):
    errors = gateway.route_errors("gw", gateway.servers(PLANNED), [], None, aliases)
    assert len(errors) == 1 and errors[0].startswith("gw: ") and wanted in errors[0] and "fix:" in errors[0], errors


def adapted(name, port, adapters):
    return dict(instance(name, port, "Qwen/Qwen2.5-14B-Instruct", "Qwen/Qwen2.5-14B-Instruct"), adapters=adapters)


def test_an_adapter_goes_only_to_the_instances_that_load_it_tracking_their_model_servers():
    """vllm_lora_adapters on l40-1 (legal, hr) and l40-2 (legal): a request for legal goes to both, for hr to l40-1
    only; each of those servers tracks its server in the 14B's backend (drained there, drained here)."""
    planned = {
        "l40-1": [adapted("gpu0", 8000, ["legal", "hr"])],
        "l40-2": [adapted("gpu0", 8000, ["legal"])],
        "4090-1": PLANNED["4090-1"],
    }
    deployed = {"l40-2": [{"name": "old", "address": "10.0.0.5", "port": 8001}]}
    servers = gateway.servers(planned, deployed)
    keys = [
        {"tenant": "all", "key": SECRET},
        {"tenant": "legal-dept", "key": SECRET, "models": ["legal"]},
        {"tenant": "base-only", "key": SECRET, "models": ["Qwen/Qwen2.5-14B-Instruct"]},
    ]
    assert gateway.route_errors("gw", servers, keys) == []
    routes = gateway.routes(servers, keys)
    big = gateway.backend_name("Qwen/Qwen2.5-14B-Instruct")
    by_name = {b["name"]: b for b in routes["backends"]}
    assert [(s["name"], s["tracks"]) for s in by_name["model-legal"]["servers"]] == [
        ("l40-1_gpu0", f"{big}/l40-1_gpu0"),
        ("l40-2_gpu0", f"{big}/l40-2_gpu0"),
    ]
    assert [s["name"] for s in by_name["model-hr"]["servers"]] == ["l40-1_gpu0"]
    assert by_name["model-hr"]["parent"] == "Qwen/Qwen2.5-14B-Instruct"
    # The retiring instance serves its model until it is removed, and no adapter.
    assert "l40-2_old" in [s["name"] for s in by_name[big]["servers"]]
    assert routes["models"]["legal"] == "model-legal" and routes["models"]["hr"] == "model-hr"
    lists = {tenant: json.loads(text)["data"] for tenant, text in routes["lists"].items()}
    assert [(m["id"], m.get("parent")) for m in lists["legal-dept"]] == [("legal", "Qwen/Qwen2.5-14B-Instruct")]
    # A tenant allowed the model is not thereby allowed its adapters; one without a list may use all.
    assert [m["id"] for m in lists["base-only"]] == ["Qwen/Qwen2.5-14B-Instruct"]
    assert "base-only/legal" not in routes["allowed"] and "all/hr" in routes["allowed"]
    assert sorted(m["id"] for m in lists["all"]) == sorted(["Qwen/Qwen2.5-14B-Instruct", ODD, "hr", "legal"])
    assert all("parent" not in m for m in lists["all"] if m["id"] not in ("hr", "legal"))


@pytest.mark.parametrize(
    "planned, aliases, wanted",
    [
        (
            {"l40-1": [adapted("gpu0", 8000, [ODD])], "4090-1": PLANNED["4090-1"]},
            None,
            f"the adapter {ODD!r} (vllm_lora_adapters on l40-1) has the name of a served model",
        ),
        (
            {
                "l40-1": [adapted("gpu0", 8000, ["legal"])],
                "4090-1": [dict(PLANNED["4090-1"][0], adapters=["legal"])],
            },
            None,
            "the adapter 'legal' is served beside 2 different models",
        ),
        (
            {"l40-1": [adapted("gpu0", 8000, ["legal"])]},
            {"legal": "Qwen/Qwen2.5-14B-Instruct"},
            "vllm_model_aliases['legal'] is also an adapter's name",
        ),
    ],
)
def test_an_adapter_name_that_clashes_is_refused(planned, aliases, wanted):
    errors = gateway.route_errors("gw", gateway.servers(planned), [{"tenant": "t", "key": SECRET}], None, aliases)
    assert any(wanted in e for e in errors), errors
    assert all(e.startswith("gw: ") and "fix: " in e for e in errors)


def test_one_adapter_beside_the_same_weights_under_two_names_is_one_adapter():
    """The lab's fleet: the tiny model's weights as tiny-qwen2 on one host and tiny-qwen2-b on the other, the same
    adapter beside both: one backend of all four instances."""
    planned = {
        host: [dict(instance("cpu0", 8000, name, "lab/tiny-qwen2"), adapters=["lab-tutor"])]
        for host, name in (("fleet-1", "tiny-qwen2"), ("fleet-2", "tiny-qwen2-b"))
    }
    servers = gateway.servers(planned)
    assert gateway.route_errors("gw", servers, [{"tenant": "t", "key": SECRET}]) == []
    backend = next(b for b in gateway.routes(servers, [])["backends"] if b["model"] == "lab-tutor")
    assert [s["tracks"] for s in backend["servers"]] == [
        "model-tiny-qwen2/fleet-1_cpu0",
        "model-tiny-qwen2-b/fleet-2_cpu0",
    ]


def test_a_tenant_may_list_an_adapter_and_an_unknown_one_is_refused():
    servers = gateway.servers({"l40-1": [adapted("gpu0", 8000, ["legal"])]})
    ok = [{"tenant": "t", "key": SECRET, "models": ["legal"]}]
    assert gateway.route_errors("gw", servers, ok) == []
    bad = [{"tenant": "t", "key": SECRET, "models": ["hr"]}]
    assert "names 'hr', which no backend host serves" in gateway.route_errors("gw", servers, bad)[0]


def test_the_drain_counts_an_instances_sessions_in_its_adapters_backends_too():
    """HAProxy 2.6's show stat (tracked: the tracked proxy/server), as the gateways' runtime API answers it."""
    stat = (
        "# pxname,svname,scur,tracked\n"
        "model-tiny,fleet-1_cpu0,1,\n"
        "model-tiny,fleet-2_cpu0,5,\n"
        "model-tutor,fleet-1_cpu0,2,model-tiny/fleet-1_cpu0\n"
        "model-tutor,BACKEND,2,\n"
    )
    assert gateway.server_sessions(stat, "model-tiny", "fleet-1_cpu0") == 3
    assert gateway.server_sessions(stat, "model-tiny", "fleet-2_cpu0") == 5
    assert gateway.server_sessions(stat, "model-tiny", "gone") is None
