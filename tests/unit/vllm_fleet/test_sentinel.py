"""The sentinel's settings checked at plan time (vllm_fleet.sentinel.errors) and its instances from a plan entry."""

import pytest
import yaml

from conftest import ROOT
from vllm_fleet import sentinel

DEFAULTS = yaml.safe_load((ROOT / "roles" / "vllm_defaults" / "defaults" / "main.yml").read_text())
SETTINGS = {k: v for k, v in DEFAULTS.items() if k.startswith("vllm_sentinel")}


def test_the_shipped_defaults_hold():
    assert set(SETTINGS) == {
        *sentinel.BOOLEANS,
        *sentinel.WHOLE_NUMBERS,
        *sentinel.PORTS,
        *sentinel.XID_LISTS,
        "vllm_sentinel_xid_journal_match",
    }
    assert sentinel.errors("gpu-1", SETTINGS, [8000, 8001]) == []


BAD = [
    ({"vllm_sentinel_interval_s": 0}, "vllm_sentinel_interval_s=0 is not a whole number of seconds between two rounds"),
    ({"vllm_sentinel_failures": "two"}, "vllm_sentinel_failures='two' is not a whole number"),
    ({"vllm_sentinel_heals_per_hour": 0}, "vllm_sentinel_heals_per_hour=0 is not a whole number of heals an hour"),
    ({"vllm_sentinel_act": "sometimes"}, "vllm_sentinel_act='sometimes' is not true or false"),
    ({"vllm_sentinel_agent_port": 8001}, "vllm_sentinel_agent_port=8001 is also the port of one of the host's vLLM"),
    ({"vllm_sentinel_metrics_port": 9171}, "vllm_sentinel_metrics_port=9171 is also vllm_sentinel_agent_port"),
    ({"vllm_sentinel_agent_port": 70000}, "vllm_sentinel_agent_port=70000 is not a port (1-65535)"),
    ({"vllm_sentinel_xid_ignore": [79]}, "vllm_sentinel_xid_ignore=[79] lists Xid 79, which vllm_sentinel_xid_reboot"),
    ({"vllm_sentinel_xid_reset": "48"}, "vllm_sentinel_xid_reset='48' is not a list of Xid codes"),
    ({"vllm_sentinel_xid_journal_match": ["kernel"]}, "vllm_sentinel_xid_journal_match=['kernel'] is not a list of"),
]


@pytest.mark.parametrize("change,says", BAD, ids=[next(iter(c)) + "-" + str(i) for i, (c, _) in enumerate(BAD)])
def test_each_bad_setting_is_one_message_naming_host_setting_value_and_fix(change, says):
    (message,) = sentinel.errors("gpu-1", {**SETTINGS, **change}, [8000, 8001])
    assert message.startswith("gpu-1: " + says), message
    assert ". Fix: " in message


def test_the_instances_come_from_the_plan_entry():
    planned = [{"name": "gpu0", "unit": "vllm@gpu0.service", "local_url": "http://127.0.0.1:8000", "gpus": [0, 1]}]
    (item,) = sentinel.instances(planned, "qwen", "vllm@{name}.service", "/etc/vllm")
    assert item == {
        "name": "gpu0",
        "unit": "vllm@gpu0.service",
        "url": "http://127.0.0.1:8000",
        "model": "qwen",
        "gpus": [0, 1],
        "unit_path": "/etc/systemd/system/vllm@gpu0.service",
        "env_path": "/etc/vllm/gpu0.env",
        "args_path": "/etc/vllm/gpu0.args.json",
        "releases_dir": "/etc/vllm/releases/gpu0",
    }
