"""plugins/filter/vllm_fast_path.py: the instances a host runs now, read from what deployed.yml slurps (the digest
of what it should run, vllm_fingerprint, is tested with vllm_fleet.fingerprint in test_fingerprint.py)."""

import pytest

from conftest import ROOT, load_source

plugin = load_source("vllm_fast_path_filter", ROOT / "plugins" / "filter" / "vllm_fast_path.py")


def test_exports_what_the_vllm_role_uses():
    filters = plugin.FilterModule().filters()
    assert set(filters) == {"vllm_fingerprint", "vllm_deployed_instances"}
    used = " ".join(p.read_text() for p in (ROOT / "roles" / "vllm" / "tasks").glob("*.yml"))
    assert all(name in used for name in filters)


def test_deployed_instances_are_read_from_the_arguments_each_unit_runs():
    """What deployed.yml's slurp of each <instance>.args.json gives: where each instance answers now."""
    import base64
    import json

    filters = plugin.FilterModule().filters()

    def slurped(name, args):
        return {"item": name, "content": base64.b64encode(json.dumps(args).encode()).decode()}

    found = filters["vllm_deployed_instances"](
        {
            "results": [
                slurped("main", ["/m", "--host", "10.0.0.5", "--port", "8000"]),
                slurped("gpu1", ["/m", "--port", "8001"]),  # binds every interface: reached at the inventory's address
                {"item": "broken", "failed": True, "msg": "file not found"},
            ]
        },
        "10.0.0.9",
        "vllm@{name}.service",
    )
    assert [(i["name"], i["address"], i["port"], i["local_url"], i["unit"]) for i in found] == [
        ("main", "10.0.0.5", 8000, "http://10.0.0.5:8000", "vllm@main.service"),
        ("gpu1", "10.0.0.9", 8001, "http://127.0.0.1:8001", "vllm@gpu1.service"),
        ("broken", "10.0.0.9", 8000, "http://127.0.0.1:8000", "vllm@broken.service"),
    ]
    with pytest.raises(Exception, match="expected the slurp results"):
        filters["vllm_deployed_instances"]("not a list", "h", "vllm@{name}.service")
