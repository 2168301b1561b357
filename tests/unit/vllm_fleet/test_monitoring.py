"""vllm_fleet.monitoring: Prometheus' targets from the plan, the rules with a site's pending periods, and the day-2
findings of a window (Prometheus' answers are in the shape of its HTTP API, /api/v1/query and /query_range)."""

from __future__ import annotations

import pytest
import yaml

from conftest import L40, ROOT
from vllm_fleet import monitoring, planner

RULES = yaml.safe_load((ROOT / "roles" / "vllm_monitoring" / "files" / "vllm-alerts.yml").read_text())


def test_every_planned_instance_is_a_target_with_its_labels():
    plans = {
        "gpu-1": planner.plan_host(
            "gpu-1",
            {
                "vllm_profile_name": "l40x4-14b-per-gpu",
                "vllm_version": "0.33.0",
                "vllm_gpu": dict(L40, count=2),
                "ansible_host": "10.0.0.11",
            },
        ),
        "gpu-2": planner.plan_host(
            "gpu-2",
            {
                "vllm_profile_name": "l40x4-14b-per-gpu",
                "vllm_version": "0.33.0",
                "vllm_gpu": dict(L40, count=1),
                "vllm_bind_address": "fd00::2",
            },
        ),
    }
    targets = monitoring.targets(plans)
    assert [t["targets"] for t in targets] == [["10.0.0.11:8000"], ["10.0.0.11:8001"], ["[fd00::2]:8000"]]
    assert targets[1]["labels"] == {
        "instance": "gpu-1/gpu1",
        "host": "gpu-1",
        "vllm_instance": "gpu1",
        "profile": "l40x4-14b-per-gpu",
        "card": "NVIDIA L40",
        "vllm_release": "0.33.0",
    }
    assert targets[2]["labels"]["instance"] == "gpu-2/main"
    assert monitoring.targets({"broken": {"errors": ["x"], "instances": []}}) == []


def test_a_site_shortens_an_alerts_pending_period_and_nothing_else():
    shipped = monitoring.alert_names(RULES)
    assert shipped == [
        "VllmGpuNeedsOperator",
        "VllmGpuXid",
        "VllmInstanceDown",
        "VllmInstanceDrift",
        "VllmKvCacheNearFull",
        "VllmMirrorCheckStale",
        "VllmMirrorDiffers",
        "VllmPreemptionsGrowing",
        "VllmPrefixCacheHitRateLow",
        "VllmSentinelGaveUp",
        "VllmSentinelHealFailed",
        "VllmSentinelHealed",
        "VllmSentinelNotRunning",
        "VllmSentinelProbeRefused",
        "VllmSpeculativeAcceptanceLow",
    ]
    changed = monitoring.rules(RULES, {"VllmInstanceDown": "20s"})
    rules = {r["alert"]: r for g in changed["groups"] for r in g["rules"]}
    assert rules["VllmInstanceDown"]["for"] == "20s" and rules["VllmKvCacheNearFull"]["for"] == "5m"
    original = {r["alert"]: r for g in RULES["groups"] for r in g["rules"]}
    assert rules["VllmInstanceDown"]["expr"] == original["VllmInstanceDown"]["expr"]
    assert original["VllmInstanceDown"]["for"] == "2m"  # the shipped rules are not modified
    with pytest.raises(ValueError, match="no shipped alert is named VllmTypo"):
        monitoring.rules(RULES, {"VllmTypo": "1m"})


def _vector(name_to_values):
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {"metric": {"instance": instance}, "value": [1764640000.0, str(value)]}
                for instance, value in name_to_values.items()
            ],
        },
    }


def test_a_windows_increases_become_the_day2_findings():
    names = list(monitoring.FINDING_COUNTERS)
    answers = [
        _vector({"h/gpu0": 12.0, "h/gpu1": 0.0}),  # preemptions
        _vector({"h/gpu0": 100.0, "h/gpu1": 900.0}),  # prefix cache hits (tokens)
        _vector({"h/gpu0": 5000.0, "h/gpu1": 1000.0}),  # prefix cache queries (tokens)
        _vector({"h/gpu0": 400.0}),  # draft tokens: only gpu0 speculates
        _vector({"h/gpu0": 80.0}),  # accepted tokens
    ]
    increases = monitoring.increases_by_instance(answers, names)
    assert increases["h/gpu1"]["vllm:spec_decode_num_draft_tokens"] is None
    gpu0 = monitoring.window_findings(increases["h/gpu0"], "1h", prefix_caching=True)
    assert {f["id"] for f in gpu0} == {"preemptions_growing", "prefix_hit_rate_low", "spec_acceptance_low"}
    assert all(f["basis"] == "the last 1h" for f in gpu0)
    assert any("preemptions grew by 12 in the last 1h" in f["message"] for f in gpu0)
    assert monitoring.window_findings(increases["h/gpu1"], "1h", prefix_caching=True) == []  # 90 % hits, none else
    # Prefix caching off: a low hit rate is no finding.
    assert {f["id"] for f in monitoring.window_findings(increases["h/gpu0"], "1h", prefix_caching=False)} == {
        "preemptions_growing",
        "spec_acceptance_low",
    }


def test_range_answers_become_series_by_instance():
    answer = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [{"metric": {"instance": "h/gpu0"}, "values": [[1764640000, "0.5"], [1764640060, "0.97"]]}],
        },
    }
    assert monitoring.series_by_instance([answer], ["kv_cache_usage"]) == {
        "kv_cache_usage": {"h/gpu0": [[1764640000.0, 0.5], [1764640060.0, 0.97]]}
    }


def test_each_gateway_is_scraped_at_its_exporter_port():
    got = monitoring.gateway_targets(
        [
            {"ansible_host": "10.0.10.5"},
            {"ansible_host": "fd00::5", "vllm_gateway_metrics_port": 9101},
            {"inventory_hostname": "gw-3.example"},
        ]
    )
    assert got == ["10.0.10.5:8405", "[fd00::5]:9101", "gw-3.example:8405"]


# --- Plan-time checks of a monitoring host's settings ---------------------------------------------------------------

# The role's literal defaults, as the plan's filter reads them (a templated one is the role's to resolve).
DEFAULTS = {
    k: v
    for k, v in yaml.safe_load((ROOT / "roles" / "vllm_monitoring" / "defaults" / "main.yml").read_text()).items()
    if not (isinstance(v, str) and "{{" in v)
}
TOKEN = "T0KEN-abcdef0123456789"
PASSWORD = "smtp-pa55word-0123456789"


def settings(**changes):
    """The role's defaults with a site's receivers, SMTP relay and route, changed by `changes`."""
    values = {k: v for k, v in DEFAULTS.items() if k in monitoring.SETTINGS}
    values.update(
        vllm_monitoring_allow=["10.0.20.0/24"],
        vllm_monitoring_node_exporters=["10.0.0.11:9100"],
        vllm_monitoring_receivers=[
            {"name": "chat", "webhook_url": f"https://chat.example.org/hooks/{TOKEN}"},
            {"name": "ops", "email_to": "ops@example.org"},
        ],
        vllm_monitoring_smtp_smarthost="smtp.example.org:587",
        vllm_monitoring_smtp_from="alerts@example.org",
        vllm_monitoring_smtp_auth_password=PASSWORD,
        vllm_monitoring_alert_pending={"VllmInstanceDown": "1m"},
        vllm_monitoring_route=dict(
            DEFAULTS["vllm_monitoring_route"],
            receiver="chat",
            routes=[{"receiver": "ops", "matchers": ['severity="warning"']}],
        ),
    )
    values.update(changes)
    return values


def test_the_roles_defaults_and_a_sites_settings_pass():
    assert monitoring.check("mon", {k: v for k, v in DEFAULTS.items() if k in monitoring.SETTINGS}) == []
    assert monitoring.check("mon", settings()) == []
    assert monitoring.check("mon", {}) == []  # nothing set: the role's defaults


@pytest.mark.parametrize(
    "text, number",
    [
        ("15s", 15),
        ("1h30m", 5400),
        ("2w", 1209600),
        ("500ms", 0.5),
        ("0", 0),
        ("1y", 31536000),
        ("15", None),
        ("1m1h", None),
        ("", None),
        (15, None),
    ],
)
def test_durations_are_read_as_prometheus_reads_them(text, number):
    assert monitoring.seconds(text) == number


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"vllm_monitoring_scrape_interval": "0s"}, "mon: vllm_monitoring_scrape_interval='0s' must be at least 1s"),
        ({"vllm_monitoring_scrape_interval": "500ms"}, "vllm_monitoring_scrape_interval='500ms' must be at least 1s"),
        ({"vllm_monitoring_evaluation_interval": "0"}, "vllm_monitoring_evaluation_interval='0' must be at least 1s"),
        ({"vllm_monitoring_retention_time": "0d"}, "vllm_monitoring_retention_time='0d' must be at least 1s"),
        ({"vllm_monitoring_retention_time": "15 days"}, "vllm_monitoring_retention_time='15 days' is not a duration"),
        ({"vllm_monitoring_resolve_timeout": "0m"}, "vllm_monitoring_resolve_timeout='0m' must be at least 1s"),
        ({"vllm_monitoring_retention_size": "20G"}, "vllm_monitoring_retention_size='20G' is not a size"),
        (
            {"vllm_monitoring_alert_pending": {"VllmInstanceDown": "1 minute"}},
            "vllm_monitoring_alert_pending.VllmInstanceDown='1 minute' is not a duration",
        ),
        (
            {"vllm_monitoring_route": {"group_interval": "0s"}},
            "vllm_monitoring_route.group_interval='0s' must be at least 1s (Alertmanager refuses 0); fix: e.g. 5m",
        ),
        ({"vllm_monitoring_route": {"repeat_interval": "0h"}}, "vllm_monitoring_route.repeat_interval='0h' must be at"),
        (
            {"vllm_monitoring_route": {"group_wait": "soon"}},
            "vllm_monitoring_route.group_wait='soon' is not a duration",
        ),
        (
            {"vllm_monitoring_route": {"receiver": "pager"}},
            "vllm_monitoring_route.receiver='pager' is not one of vllm_monitoring_receivers (chat, ops)",
        ),
        (
            {"vllm_monitoring_route": {"routes": [{"receiver": "pager"}]}},
            "vllm_monitoring_route.routes[0].receiver='pager' is not one of vllm_monitoring_receivers",
        ),
        (
            {"vllm_monitoring_route": {"group_by": ["alert name"]}},
            "vllm_monitoring_route.group_by=['alert name'] must be",
        ),
        ({"vllm_monitoring_route": {"receivers": "ops"}}, "vllm_monitoring_route has unknown keys ['receivers']"),
        ({"vllm_monitoring_prometheus_port": 0}, "vllm_monitoring_prometheus_port=0 must be a port number"),
        (
            {"vllm_monitoring_alertmanager_port": 9090},
            "vllm_monitoring_prometheus_port and vllm_monitoring_alertmanager_port are both 9090",
        ),
        ({"vllm_monitoring_listen_address": "monitoring"}, "vllm_monitoring_listen_address='monitoring' is not an IP"),
        ({"vllm_monitoring_allow": ["operators"]}, "mon: vllm_monitoring_allow has 'operators', not an IP address"),
        (
            {"vllm_monitoring_node_exporters": ["10.0.0.11"]},
            "vllm_monitoring_node_exporters[0]='10.0.0.11' is not host:port",
        ),
        (
            {"vllm_monitoring_smtp_smarthost": "smtp.example.org"},
            "vllm_monitoring_smtp_smarthost='smtp.example.org' is not host:port",
        ),
        ({"vllm_monitoring_smtp_from": "alerts"}, "vllm_monitoring_smtp_from='alerts' is not an e-mail address"),
        (
            {"vllm_monitoring_smtp_smarthost": ""},
            "vllm_monitoring_receivers[1].email_to needs vllm_monitoring_smtp_smarthost",
        ),
        (
            {"vllm_monitoring_receivers": [{"name": "ops", "email_to": "ops"}]},
            "vllm_monitoring_receivers[0].email_to='ops' is not an e-mail address",
        ),
        (
            {"vllm_monitoring_receivers": [{"name": "chat", "webhook_url": f"ftp://x/{TOKEN}"}]},
            "vllm_monitoring_receivers[0].webhook_url (value not shown: it may hold a token) is not an http(s) URL",
        ),
        (
            {"vllm_monitoring_receivers": [{"name": "chat", "webhook_url": f"https://x/{TOKEN}", "email_to": "a@b"}]},
            "vllm_monitoring_receivers[0] (name 'chat') must have exactly one of webhook_url or email_to",
        ),
        (
            {"vllm_monitoring_receivers": [{"name": "a b", "email_to": "a@b"}]},
            "vllm_monitoring_receivers[0].name='a b'",
        ),
        (
            {"vllm_monitoring_receivers": [{"name": "ops", "email_to": "a@b"}, {"name": "ops", "email_to": "c@d"}]},
            "vllm_monitoring_receivers[1].name='ops' is given twice",
        ),
        (
            {"vllm_monitoring_receivers": [{"name": "ops", "email": "a@b"}]},
            "vllm_monitoring_receivers[0] has unknown keys",
        ),
    ],
)
def test_bad_settings_name_the_host_the_setting_the_value_and_the_fix_never_a_secret(change, needle):
    errors = monitoring.check("mon", settings(**change))
    assert any(needle in e for e in errors), errors
    assert all(e.startswith("mon: ") and "fix:" in e for e in errors), errors
    text = " ".join(errors)
    assert TOKEN not in text and PASSWORD not in text


# A line break, the Unicode line separator and a zero-width space (a format character).
UNSEEN = ["\n", "\u2028", "\u200b"]


@pytest.mark.parametrize(
    "setting, value, where",
    [
        ("vllm_monitoring_scrape_interval", "15s", "vllm_monitoring_scrape_interval"),
        ("vllm_monitoring_evaluation_interval", "15s", "vllm_monitoring_evaluation_interval"),
        ("vllm_monitoring_retention_time", "15d", "vllm_monitoring_retention_time"),
        ("vllm_monitoring_retention_size", "20GB", "vllm_monitoring_retention_size"),
        ("vllm_monitoring_resolve_timeout", "5m", "vllm_monitoring_resolve_timeout"),
        ("vllm_monitoring_listen_address", "0.0.0.0", "vllm_monitoring_listen_address"),
        ("vllm_monitoring_backend_group", "vllm_nodes", "vllm_monitoring_backend_group"),
        ("vllm_monitoring_smtp_smarthost", "smtp.example.org:587", "vllm_monitoring_smtp_smarthost"),
        ("vllm_monitoring_smtp_from", "alerts@example.org", "vllm_monitoring_smtp_from"),
        ("vllm_monitoring_smtp_auth_username", "alerts", "vllm_monitoring_smtp_auth_username"),
        ("vllm_monitoring_node_exporters", ["10.0.0.11:9100"], "vllm_monitoring_node_exporters[0]"),
        ("vllm_monitoring_allow", ["10.0.20.0/24"], "vllm_monitoring_allow[0]"),
        ("vllm_monitoring_packages", ["prometheus"], "vllm_monitoring_packages[0]"),
        ("vllm_monitoring_alert_pending", {"VllmInstanceDown": "1m"}, "vllm_monitoring_alert_pending.VllmInstanceDown"),
        ("vllm_monitoring_route", {"receiver": "chat", "group_wait": "30s"}, "vllm_monitoring_route.group_wait"),
        (
            "vllm_monitoring_route",
            {"routes": [{"receiver": "ops", "matchers": ['severity="warning"']}]},
            "vllm_monitoring_route.routes[0].matchers[0]",
        ),
        (
            "vllm_monitoring_receivers",
            [{"name": "ops", "email_to": "ops@example.org"}],
            "vllm_monitoring_receivers[0].email_to",
        ),
    ],
)
@pytest.mark.parametrize("character", UNSEEN, ids=["newline", "u2028", "u200b"])
def test_a_control_or_format_character_in_a_string_of_the_configuration_is_refused(setting, value, where, character):
    def spoil(v):
        if isinstance(v, dict):
            key = list(v)[-1]  # the last one named
            return dict(v, **{key: spoil(v[key])})
        if isinstance(v, list):
            return [spoil(v[0]), *v[1:]]
        return v[:2] + character + v[2:]

    errors = monitoring.check("mon", settings(**{setting: spoil(value)}))
    assert any(
        e.startswith(f"mon: {where}=") and "holds a control or format character" in e and "fix: remove it" in e
        for e in errors
    ), errors


@pytest.mark.parametrize("character", UNSEEN, ids=["newline", "u2028", "u200b"])
def test_a_control_character_in_a_secret_is_refused_without_showing_it(character):
    errors = monitoring.check(
        "mon",
        settings(
            vllm_monitoring_smtp_auth_password=PASSWORD[:5] + character + PASSWORD[5:],
            vllm_monitoring_receivers=[
                {"name": "chat", "webhook_url": f"https://x/{TOKEN[:5]}{character}{TOKEN[5:]}"},
                {"name": "ops", "email_to": "ops@example.org"},
            ],
        ),
    )
    assert errors == [
        "mon: vllm_monitoring_smtp_auth_password (value not shown) holds a control or format character (a line "
        "break, an invisible character); fix: remove it and encrypt the value again with ansible-vault",
        "mon: vllm_monitoring_receivers[0].webhook_url (value not shown) holds a control or format character (a line "
        "break, an invisible character); fix: remove it and encrypt the value again with ansible-vault",
    ], errors


def test_zero_is_a_choice_where_it_means_at_once():
    """An alert's pending period of 0s fires at its first evaluation; a group_wait of 0s sends at once."""
    assert (
        monitoring.check(
            "mon",
            settings(
                vllm_monitoring_alert_pending={"VllmInstanceDown": "0s"},
                vllm_monitoring_route={"receiver": "chat", "group_wait": "0s"},
            ),
        )
        == []
    )


SIGNED = {"vllm_signed_manifest_url": "http://10.0.9.5:8081/BUNDLE.sha256", "vllm_signed_manifest_public_key": "/k"}


@pytest.mark.parametrize(
    "values, says",
    [
        pytest.param(
            {"vllm_monitoring_mirror_check": "maybe"},
            "vllm_monitoring_mirror_check='maybe' is not a boolean",
            id="not a boolean",
        ),
        pytest.param(
            {"vllm_monitoring_mirror_check": True},
            "vllm_monitoring_mirror_check is true but vllm_signed_manifest_url is empty",
            id="on without a manifest",
        ),
        pytest.param(
            {**SIGNED, "vllm_signed_manifest_public_key": ""},
            "vllm_signed_manifest_public_key is empty",
            id="a manifest without its key",
        ),
        pytest.param(
            {**SIGNED, "vllm_monitoring_mirror_check_port": 9090},
            "vllm_monitoring_mirror_check_port=9090 is vllm_monitoring_prometheus_port's port too",
            id="Prometheus' port",
        ),
        pytest.param({**SIGNED, "vllm_monitoring_mirror_check_port": "x"}, "must be a port number", id="not a port"),
        pytest.param(
            {**SIGNED, "vllm_monitoring_mirror_check_timeout_s": 0},
            "vllm_monitoring_mirror_check_timeout_s=0 must be a whole number of seconds, at least 1",
            id="no time",
        ),
        pytest.param(
            {**SIGNED, "vllm_monitoring_mirror_check_calendar": ""},
            "vllm_monitoring_mirror_check_calendar='' must be a systemd calendar",
            id="no calendar",
        ),
    ],
)
def test_the_mirror_checks_settings_are_refused_at_plan_time_naming_the_fix(values, says):
    errors = monitoring.check("mon-1", {"vllm_monitoring_prometheus_port": 9090, **values})
    assert len(errors) == 1 and errors[0].startswith("mon-1: ") and says in errors[0] and "fix: " in errors[0], errors


def test_the_mirror_check_is_on_where_the_site_signs_and_off_elsewhere():
    assert monitoring.mirror_check_on(SIGNED) is True
    assert monitoring.mirror_check_on({}) is False
    assert monitoring.mirror_check_on({**SIGNED, "vllm_monitoring_mirror_check": "false"}) is False
    assert (
        monitoring.check(
            "mon-1", {**SIGNED, "vllm_monitoring_mirror_check": False, "vllm_monitoring_mirror_check_port": "x"}
        )
        == []
    )
