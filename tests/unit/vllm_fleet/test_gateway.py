"""vllm_fleet.gateway (the vllm_gateway role's checks, tenants, servers, drain numbers), the filter plugin over it
and the plan's instances and --shutdown-timeout.

The `show stat` fixture was captured from HAProxy 2.6.12 (Debian 12's) on the lab's gateway on 2026-12-01, with
4 streams in flight; the /metrics ones are the real vLLM captures of ../shared/fixtures. The certificates and keys
are made here with cryptography (the library the check reads them with): RSA and EC pairs, a lab-like chain, a
mismatched pair, an expired certificate, encrypted keys and garbage."""

import datetime
import ipaddress
import itertools
import json
import re
import sys

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from conftest import FIXTURES, ROOT
from vllm_fleet import gateway, planner

sys.path.insert(0, str(ROOT / "plugins" / "filter"))
import vllm_gateway as gateway_filters
import vllm_plan as plan_filters

NOW = datetime.datetime.now(datetime.UTC)


def name(common_name):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def certificate(key, subject="gw1.example", issuer_key=None, issuer="", valid=(-1, 825), ca=False):
    """A certificate in PEM for `key`'s public key, self-signed unless an issuer's key and name are given; `valid`:
    its first and last day, counted from today."""
    builder = (
        x509.CertificateBuilder()
        .subject_name(name(subject))
        .issuer_name(name(issuer or subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW + datetime.timedelta(days=valid[0]))
        .not_valid_after(NOW + datetime.timedelta(days=valid[1]))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(subject), x509.IPAddress(ipaddress.ip_address("10.0.10.5"))]),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()


def pem(key, form=serialization.PrivateFormat.PKCS8, passphrase=None):
    """A private key in PEM: PKCS#8 by default, TraditionalOpenSSL for PKCS#1 (RSA) or SEC1 (EC)."""
    encryption = serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, form, encryption).decode()


RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
EC_KEY = ec.generate_private_key(ec.SECP256R1())
OTHER_KEY = ec.generate_private_key(ec.SECP256R1())
CA_KEY = ec.generate_private_key(ec.SECP256R1())
CA = certificate(CA_KEY, "vllm-fleet lab CA", ca=True, valid=(-1, 3650))
CERT = certificate(EC_KEY)
KEY = pem(EC_KEY)
SECRET = "s3cr3t-0123456789abcdefghijKLMN"


def key_material(*pems):
    """The base64 lines of private keys in PEM: no message may hold one."""
    return [
        line for text in pems for line in text.splitlines() if line and not line.startswith("-----") and ":" not in line
    ]


def good():
    return {
        "vllm_gateway_tls_certificate": CERT,
        "vllm_gateway_tls_key": KEY,
        "vllm_gateway_api_keys": [
            {"tenant": "team-a", "key": SECRET, "requests_per_minute": 0},
            {"tenant": "team-b", "key": SECRET[::-1], "requests_per_minute": 600},
        ],
        "vllm_gateway_port": 443,
        "vllm_gateway_bind_address": "0.0.0.0",
        "vllm_gateway_metrics_allow": ["10.0.0.0/24"],
        "ansible_host": "10.0.10.5",
    }


def test_good_settings_pass():
    assert gateway.check("gw1", good()) == []


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"vllm_gateway_tls_certificate": ""}, "gw1: vllm_gateway_tls_certificate is empty; fix:"),
        ({"vllm_gateway_tls_certificate": KEY}, "vllm_gateway_tls_certificate is not a PEM CERTIFICATE"),
        ({"vllm_gateway_tls_key": CERT}, "vllm_gateway_tls_key is not a PEM PRIVATE KEY"),
        ({"vllm_gateway_api_keys": []}, "vllm_gateway_api_keys is empty: the gateway would refuse every request"),
        (
            {"vllm_gateway_api_keys": [{"tenant": "a b", "key": SECRET}]},
            "vllm_gateway_api_keys[0].tenant='a b' must be",
        ),
        (
            {"vllm_gateway_api_keys": [{"tenant": "a", "key": SECRET}, {"tenant": "a", "key": SECRET[::-1]}]},
            "vllm_gateway_api_keys[1].tenant='a' is given twice",
        ),
        (
            {"vllm_gateway_api_keys": [{"tenant": "a", "key": "short"}]},
            "vllm_gateway_api_keys[0].key (value not shown)",
        ),
        (
            {"vllm_gateway_api_keys": [{"tenant": "a", "key": SECRET}, {"tenant": "b", "key": SECRET}]},
            "vllm_gateway_api_keys[1].key (value not shown) is also another tenant's key",
        ),
        (
            {"vllm_gateway_api_keys": [{"tenant": "a", "key": SECRET, "requests_per_minute": -1}]},
            "requests_per_minute=-1 must be a whole number",
        ),
        ({"vllm_gateway_api_keys": [{"tenant": "a", "key": SECRET, "rate": 5}]}, "has unknown keys ['rate']"),
        ({"vllm_gateway_port": 70000}, "vllm_gateway_port=70000 must be a port number"),
        ({"vllm_gateway_bind_address": "gateway.example"}, "vllm_gateway_bind_address='gateway.example' is not an IP"),
        ({"vllm_gateway_metrics_allow": ["monitoring"]}, "vllm_gateway_metrics_allow has 'monitoring'"),
        ({"vllm_gateway_drain_timeout": 0}, "vllm_gateway_drain_timeout=0 must be a positive number"),
        ({"vllm_gateway_timeout_server": 0}, "vllm_gateway_timeout_server=0 must be a positive number of seconds"),
        ({"vllm_gateway_balance": "least_conn"}, "vllm_gateway_balance='least_conn' is not a balance algorithm"),
        ({"vllm_gateway_backend_api_key": SECRET}, "vllm_gateway_backend_api_key is set (value not shown)"),
        (
            {"ansible_host": "gw-01.example.internal"},
            "vllm_gateway_source_address='gw-01.example.internal' (by default its ansible_host, else its name) "
            "is not an IP",
        ),
    ],
)
def test_bad_settings_name_the_host_the_setting_and_the_fix_and_never_a_key(change, needle):
    errors = gateway.check("gw1", dict(good(), **change))
    assert any(needle in e for e in errors), errors
    assert all(e.startswith("gw1: ") and "fix:" in e for e in errors), errors
    text = " ".join(errors)
    assert SECRET not in text and SECRET[::-1] not in text and "short" not in text.replace("short_", "")


def test_a_gateway_named_by_dns_passes_with_its_source_address():
    values = dict(good(), ansible_host="gw-01.example.internal", vllm_gateway_source_address="10.0.10.5")
    assert gateway.check("gw1", values) == []


# --- The certificate and its key, read with cryptography ----------------------------------------------------------


def tls(certificate_pem, key_pem):
    return dict(good(), vllm_gateway_tls_certificate=certificate_pem, vllm_gateway_tls_key=key_pem)


@pytest.mark.parametrize(
    "certificate_pem, key_pem",
    [
        (certificate(RSA_KEY), pem(RSA_KEY)),  # RSA, PKCS#8
        (certificate(RSA_KEY), pem(RSA_KEY, serialization.PrivateFormat.TraditionalOpenSSL)),  # RSA, PKCS#1
        (certificate(EC_KEY), pem(EC_KEY)),  # EC, PKCS#8
        (certificate(EC_KEY), pem(EC_KEY, serialization.PrivateFormat.TraditionalOpenSSL)),  # EC, SEC1
        (certificate(EC_KEY, issuer_key=CA_KEY, issuer="vllm-fleet lab CA") + CA, pem(EC_KEY)),  # a chain, leaf first
    ],
    ids=["rsa-pkcs8", "rsa-pkcs1", "ec-pkcs8", "ec-sec1", "chain"],
)
def test_a_certificate_and_its_own_key_pass(certificate_pem, key_pem):
    assert gateway.check("gw1", tls(certificate_pem, key_pem)) == []


def test_the_labs_certificate_passes():
    """As lab/playbooks/lab_hosts.yml makes it: a P-256 key (`openssl req -nodes`: PKCS#8), the leaf alone, signed by
    the lab's CA for 825 days, read from files whose last newline the file lookup strips."""
    leaf = certificate(EC_KEY, "lab-gw", issuer_key=CA_KEY, issuer="vllm-fleet lab CA", valid=(0, 825))
    assert gateway.check("gw1", tls(leaf.rstrip("\n"), pem(EC_KEY).rstrip("\n"))) == []


@pytest.mark.parametrize(
    "certificate_pem, key_pem, needle",
    [
        (
            certificate(EC_KEY),
            pem(OTHER_KEY),
            "gw1: vllm_gateway_tls_key (value not shown) is not the private key of vllm_gateway_tls_certificate's leaf "
            "(CN=gw1.example); fix: the key the certificate was issued for",
        ),
        (certificate(RSA_KEY), pem(EC_KEY), "is not the private key of vllm_gateway_tls_certificate's leaf"),
        (
            CA + certificate(EC_KEY, issuer_key=CA_KEY, issuer="vllm-fleet lab CA"),
            pem(EC_KEY),
            "(it is the key of certificate 2 of the chain: put that one first, the leaf first)",
        ),
        (
            certificate(EC_KEY, valid=(-400, -30)),
            pem(EC_KEY),
            "gw1: vllm_gateway_tls_certificate's leaf (CN=gw1.example) "
            f"expired on {(NOW - datetime.timedelta(days=30)):%Y-%m-%d}",
        ),
        (
            CERT,
            pem(EC_KEY, passphrase=b"pass phrase"),
            "gw1: vllm_gateway_tls_key (value not shown) is encrypted with a passphrase, which HAProxy cannot read",
        ),
        (
            certificate(RSA_KEY),
            pem(RSA_KEY, serialization.PrivateFormat.TraditionalOpenSSL, b"pass phrase"),
            "vllm_gateway_tls_key (value not shown) is encrypted with a passphrase",
        ),
        (
            CERT,
            "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5IGF0IGFsbA==\n-----END PRIVATE KEY-----\n",
            "gw1: vllm_gateway_tls_key (value not shown) does not parse as a private key",
        ),
        (CERT, "garbage", "gw1: vllm_gateway_tls_key is not a PEM PRIVATE KEY (value not shown)"),
        (CERT, KEY + pem(OTHER_KEY), "vllm_gateway_tls_key (value not shown) holds 2 private keys"),
        (
            "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n",
            KEY,
            "gw1: vllm_gateway_tls_certificate's certificate 1 of 1 does not parse",
        ),
        (
            CERT + "-----BEGIN CERTIFICATE-----\nZ2FyYmFnZQ==\n-----END CERTIFICATE-----\n",
            KEY,
            "vllm_gateway_tls_certificate's certificate 2 of 2 does not parse",
        ),
        ("garbage", KEY, "gw1: vllm_gateway_tls_certificate is not a PEM CERTIFICATE (no -----BEGIN CERTIFICATE----- "),
        (
            CERT + KEY,
            KEY,
            "vllm_gateway_tls_certificate is not a PEM CERTIFICATE: its block 2 of 2 is a private key, "
            "which belongs in vllm_gateway_tls_key",
        ),
    ],
    ids=[
        "mismatched-ec",
        "mismatched-rsa-ec",
        "ca-first",
        "expired",
        "encrypted-pkcs8",
        "encrypted-pkcs1",
        "garbage-key-block",
        "garbage-key",
        "two-keys",
        "garbage-certificate",
        "garbage-second-certificate",
        "no-pem",
        "key-in-certificate",
    ],
)
def test_a_bad_certificate_or_key_is_refused_without_showing_the_key(certificate_pem, key_pem, needle):
    errors = gateway.check("gw1", tls(certificate_pem, key_pem))
    assert any(needle in e for e in errors), errors
    assert all(e.startswith("gw1: ") and "fix:" in e for e in errors), errors
    text = " ".join(errors)
    assert [line for line in key_material(key_pem, KEY, pem(OTHER_KEY)) if line in text] == []
    assert "PRIVATE KEY-----" not in text


def test_the_certificate_must_still_be_valid_when_checked():
    later = NOW + datetime.timedelta(days=900)
    errors = gateway.check("gw1", good(), now=later)
    assert errors == [
        "gw1: vllm_gateway_tls_certificate's leaf (CN=gw1.example) expired on "
        f"{(NOW + datetime.timedelta(days=825)):%Y-%m-%d %H:%M} UTC; fix: renew the gateway's "
        "certificate and give its new chain"
    ]


# --- Timeouts, counts, balance, and the strings that reach haproxy.cfg ------------------------------------------


@pytest.mark.parametrize("setting", sorted(gateway.TIMEOUTS))
@pytest.mark.parametrize("value", [0, -5, "0", "30s", 1.5, True])
def test_every_timeout_is_a_whole_number_of_seconds_of_at_least_one(setting, value):
    errors = gateway.check("gw1", dict(good(), **{setting: value}))
    assert len(errors) == 1 and errors[0].startswith(
        f"gw1: {setting}={value!r} must be a positive number of seconds, a whole number of at least 1 (0 would be "
    ), errors
    assert f"; fix: e.g. {gateway.TIMEOUTS[setting][0]}" in errors[0]


@pytest.mark.parametrize("setting", sorted(gateway.TIMEOUTS))
def test_a_timeout_of_one_second_or_digits_from_the_command_line_pass(setting):
    assert gateway.check("gw1", dict(good(), **{setting: 1})) == []
    assert gateway.check("gw1", dict(good(), **{setting: "30"})) == []  # -e gives strings


@pytest.mark.parametrize("setting", sorted(gateway.COUNTS))
@pytest.mark.parametrize("value", [0, -1, "many", None])
def test_health_checks_and_maxconn_are_positive_whole_numbers(setting, value):
    errors = gateway.check("gw1", dict(good(), **{setting: value}))
    if value is None:  # not set: the role's default
        assert errors == []
    else:
        assert errors == [
            f"gw1: {setting}={value!r} must be a positive whole number; fix: e.g. {gateway.COUNTS[setting]}"
        ]


def test_the_balance_algorithms_are_the_argument_specs_choices():
    specs = yaml.safe_load((ROOT / "roles" / "vllm_gateway" / "meta" / "argument_specs.yml").read_text())
    assert specs["argument_specs"]["main"]["options"]["vllm_gateway_balance"]["choices"] == list(gateway.BALANCE)
    for balance in gateway.BALANCE:
        assert gateway.check("gw1", dict(good(), vllm_gateway_balance=balance)) == []
    for balance in ("hdr(host)", "LEASTCONN", "leastconn;", ""):
        (error,) = gateway.check("gw1", dict(good(), vllm_gateway_balance=balance))
        assert error.startswith(
            f"gw1: vllm_gateway_balance={balance!r} is not a balance algorithm the gateway "
            "offers (leastconn, roundrobin, static-rr, first, source, random, prefix); fix: leastconn"
        )


@pytest.mark.parametrize(
    "setting, value, bounds",
    [
        ("vllm_gateway_prefix_bytes", 0, "from 16 to 8192"),
        ("vllm_gateway_prefix_bytes", 8193, "from 16 to 8192"),
        ("vllm_gateway_prefix_bytes", "256b", "from 16 to 8192"),
        ("vllm_gateway_prefix_load_factor", 100, "from 101 to 1000"),
        ("vllm_gateway_prefix_load_factor", 1001, "from 101 to 1000"),
        ("vllm_gateway_prefix_load_factor", True, "from 101 to 1000"),
    ],
)
def test_the_prefix_affinitys_bytes_and_load_bound_are_checked(setting, value, bounds):
    """HAProxy takes a hash-balance-factor of 100 or less (every server over the bound at once) and any byte count;
    the plan refuses them, naming the host, the setting, the value and a working one."""
    (error,) = gateway.check("gw1", dict(good(), vllm_gateway_balance="prefix", **{setting: value}))
    assert error.startswith(f"gw1: {setting}={value!r} must be a whole number {bounds} ("), error
    assert error.endswith("; fix: e.g. 1024" if setting.endswith("bytes") else "; fix: e.g. 200"), error


def test_the_prefix_affinitys_bounds_and_digits_from_the_command_line_pass():
    for bytes_, factor in ((16, 101), (8192, 1000), ("256", "150")):
        prefix = {"vllm_gateway_prefix_bytes": bytes_, "vllm_gateway_prefix_load_factor": factor}
        values = dict(good(), vllm_gateway_balance="prefix", **prefix)
        assert gateway.check("gw1", values) == []


def test_the_roles_defaults_pass():
    defaults = yaml.safe_load((ROOT / "roles" / "vllm_gateway" / "defaults" / "main.yml").read_text())
    literal = {k: v for k, v in defaults.items() if not (isinstance(v, str) and "{{" in v)}
    assert gateway.check("gw1", dict(literal, **good())) == []


# A line break, the Unicode line separator and a zero-width space (a format character).
UNSEEN = ["\n", "\u2028", "\u200b"]


@pytest.mark.parametrize(
    "setting, value",
    [
        ("vllm_gateway_bind_address", "10.0.10.5"),
        ("vllm_gateway_metrics_address", "0.0.0.0"),
        ("vllm_gateway_backend_group", "vllm_nodes"),
        ("vllm_gateway_balance", "leastconn"),
        ("vllm_gateway_source_address", "10.0.10.5"),
    ],
)
@pytest.mark.parametrize("character", UNSEEN, ids=["newline", "u2028", "u200b"])
def test_a_control_or_format_character_in_a_string_for_haproxy_cfg_is_refused(setting, value, character):
    bad = value[:2] + character + value[2:]
    errors = gateway.check("gw1", dict(good(), **{setting: bad}))
    assert errors == [
        f"gw1: {setting}={bad!r} holds a control or format character (a line break, an invisible "
        "character); fix: remove it"
    ], errors


@pytest.mark.parametrize("character", UNSEEN, ids=["newline", "u2028", "u200b"])
def test_a_control_or_format_character_in_a_tenant_or_its_key_is_refused_without_showing_the_key(character):
    key = SECRET[:10] + character + SECRET[10:]
    errors = gateway.check(
        "gw1",
        dict(
            good(),
            vllm_gateway_api_keys=[
                {"tenant": "team" + character + "a", "key": SECRET},
                {"tenant": "team-b", "key": key},
            ],
        ),
    )
    assert any(
        e.startswith(f"gw1: vllm_gateway_api_keys[0].tenant={'team' + character + 'a'!r} must be") for e in errors
    ), errors
    assert any(e.startswith("gw1: vllm_gateway_api_keys[1].key (value not shown)") for e in errors), errors
    assert SECRET[:10] not in " ".join(errors) and SECRET[10:] not in " ".join(errors)


def test_the_old_backend_key_setting_is_refused_and_an_empty_one_passes():
    errors = gateway.check("gw1", dict(good(), vllm_gateway_backend_api_key=SECRET))
    assert errors == [
        "gw1: vllm_gateway_backend_api_key is set (value not shown), but the gateway no longer reads "
        "it: it sends its backend hosts their own vllm_api_key; fix: remove vllm_gateway_backend_api_key "
        "from the inventory (and its Vault entry), and give the group vllm_nodes one vllm_api_key"
    ]
    assert gateway.check("gw1", dict(good(), vllm_gateway_backend_api_key="")) == []


# --- The backend key: one home, the backend hosts' own vllm_api_key ------------------------------------------------


@pytest.mark.parametrize(
    "backends, key",
    [
        ({"gpu-1": SECRET, "gpu-2": SECRET, "gpu-3": SECRET}, SECRET),
        ({"gpu-1": "", "gpu-2": None, "gpu-3": ""}, ""),
        ({"gpu-1": SECRET}, SECRET),
        ({}, ""),
    ],
)
def test_the_backend_key_is_the_one_every_backend_host_shares(backends, key):
    assert gateway.backend_api_key("gw1", backends) == (key, [])


@pytest.mark.parametrize(
    "backends, needle",
    [
        (
            {"gpu-1": SECRET, "gpu-2": None, "gpu-3": SECRET},
            "gw1: its backend hosts do not share the one vllm_api_key the gateway sends them: gpu-1 has a "
            "vllm_api_key and gpu-2 has none; 2 of 3 have a key, 1 different one(s) (no key is shown); fix: the one "
            "vllm_api_key of the group vllm_nodes, in its group_vars, from Ansible Vault (none in a host's own vars)",
        ),
        ({"gpu-2": SECRET, "gpu-1": ""}, "gpu-2 has a vllm_api_key and gpu-1 has none"),
        (
            {"gpu-1": SECRET, "gpu-2": SECRET, "gpu-3": SECRET[::-1]},
            "gw1: its backend hosts do not share the one vllm_api_key the gateway sends them: gpu-1 and gpu-3 have "
            "different vllm_api_key values; 3 of 3 have a key, 2 different one(s)",
        ),
    ],
)
def test_backend_hosts_with_different_keys_are_named_never_their_keys(backends, needle):
    key, errors = gateway.backend_api_key("gw1", backends)
    assert key == "" and len(errors) == 1 and needle in errors[0], errors
    assert SECRET not in errors[0] and SECRET[::-1] not in errors[0]


def test_clients_are_the_gateways_by_source_address_and_the_allowed_networks_by_family():
    gateways = {
        "gw-b": {"ansible_host": "gw-b.example", "vllm_gateway_source_address": "10.0.10.6"},
        "gw-a": {"ansible_host": "10.0.10.5"},
        "10.0.10.7": {},
    }
    got = gateway.clients(gateways, ["10.0.20.0/24", "10.0.20.9", "fd00::5", "10.0.10.5"], "gpu-1")
    assert got == {
        "ipv4": ["10.0.10.5/32", "10.0.10.6/32", "10.0.10.7/32", "10.0.20.0/24", "10.0.20.9/32"],
        "ipv6": ["fd00::5/128"],
    }
    assert gateway.clients({}, [], "gpu-1") == {"ipv4": [], "ipv6": []}


def test_clients_include_the_monitoring_hosts_by_their_ansible_host():
    got = gateway.clients(
        {"gw-a": {"ansible_host": "10.0.10.5"}}, [], "gpu-1", {"mon-1": {"ansible_host": "10.0.10.9"}, "10.0.10.8": {}}
    )
    assert got == {"ipv4": ["10.0.10.5/32", "10.0.10.8/32", "10.0.10.9/32"], "ipv6": []}
    with pytest.raises(
        ValueError, match=re.escape("gpu-1: the monitoring host mon-1's ansible_host has 'mon.example'")
    ):
        gateway.clients({}, [], "gpu-1", {"mon-1": {"ansible_host": "mon.example"}})


@pytest.mark.parametrize(
    "gateways, allowed, needle",
    [
        (
            {"gw-1": {"ansible_host": "gw-1.example"}},
            [],
            "gpu-1: the gateway gw-1's vllm_gateway_source_address has 'gw-1.example', not an IP address",
        ),
        ({}, ["monitoring.example"], "gpu-1: vllm_allowed_clients has 'monitoring.example', not an IP address"),
        ({}, "10.0.0.5", "gpu-1: vllm_allowed_clients='10.0.0.5' must be a list"),
    ],
)
def test_clients_that_are_not_addresses_are_refused_naming_the_host_setting_and_value(gateways, allowed, needle):
    with pytest.raises(ValueError, match="fix:") as raised:
        gateway.clients(gateways, allowed, "gpu-1")
    assert needle in str(raised.value)


def test_the_clients_filter_reads_the_gateways_from_hostvars():
    hostvars = {"gw-1": {"ansible_host": "10.0.10.5"}, "gpu-1": {"ansible_host": "10.0.30.1"}}
    got = gateway_filters.vllm_gateway_clients(hostvars, ["gw-1"], ["10.0.20.5"], "gpu-1")
    assert got == {"ipv4": ["10.0.10.5/32", "10.0.20.5/32"], "ipv6": []}
    got = gateway_filters.vllm_gateway_clients(
        dict(hostvars, **{"mon-1": {"ansible_host": "10.0.10.9"}}), ["gw-1"], [], "gpu-1", ["mon-1"]
    )
    assert got == {"ipv4": ["10.0.10.5/32", "10.0.10.9/32"], "ipv6": []}
    with pytest.raises(gateway_filters.AnsibleFilterError, match="gpu-1: vllm_allowed_clients has 'x'"):
        gateway_filters.vllm_gateway_clients(hostvars, ["gw-1"], ["x"], "gpu-1")


# --- the gateways' shared virtual address (keepalived): vip_errors and vrrp_interface -------------------------------
VRRP_SECRET = "Vr7q!x2z"  # 8 characters: a test value that must never appear in a message


def pair(**changes):
    """Two gateways that share 10.89.77.9/24 correctly over VRRPv2 (version 2 and its password: the password's checks
    run with it); `changes`: {gateway, or "all": {setting: value, None to remove}}."""
    gateways = {
        "gw-1": {"ansible_host": "10.89.77.11", "vllm_gateway_vrrp_priority": 150},
        "gw-2": {"ansible_host": "10.89.77.12", "vllm_gateway_vrrp_priority": 100},
    }
    for values in gateways.values():
        values.update(
            vllm_gateway_vip="10.89.77.9/24",
            vllm_gateway_vrrp_version=2,
            vllm_gateway_vrrp_password=VRRP_SECRET,
            vllm_gateway_bind_address="0.0.0.0",
        )
    for name, settings in changes.items():
        for one in list(gateways) if name == "all" else [name]:
            gateways[one] = {k: v for k, v in {**gateways.get(one, {}), **settings}.items() if v is not None}
    return gateways


FROM_VAULT = {"gw-1": None, "gw-2": None, "gw-3": None}


def vip_errors(gateways, host="gw-1", sources=FROM_VAULT):
    errors = gateway.vip_errors(host, gateways, sources)
    for error in errors:
        assert error.startswith(f"{host}: ") and "fix: " in error, error
        assert VRRP_SECRET not in error and VRRP_SECRET[:5] not in error, error
    return errors


def test_a_valid_pair_has_no_vip_errors_and_no_vip_turns_the_check_off():
    assert vip_errors(pair()) == [] and vip_errors(pair(), "gw-2") == []
    # The role's defaults (router id 51, 1 s) and an interface name, explicit, change nothing.
    same = {"vllm_gateway_vrrp_router_id": 51, "vllm_gateway_vrrp_advert_s": "1", "vllm_gateway_vrrp_interface": "eth0"}
    assert vip_errors(pair(**{"gw-1": same, "gw-2": {"vllm_gateway_vrrp_interface": ""}})) == []
    # IPv6 too; and without a vip nothing is checked, not even a password that is not from Vault.
    v6 = {"vllm_gateway_vip": "fd00:89::9/64", "vllm_gateway_bind_address": "::"}
    assert (
        vip_errors(
            pair(**{"gw-1": {**v6, "ansible_host": "fd00:89::11"}, "gw-2": {**v6, "ansible_host": "fd00:89::12"}})
        )
        == []
    )
    off = {"gw-1": {"ansible_host": "10.0.0.1"}, "gw-2": {"vllm_gateway_vip": ""}}
    assert gateway.vip_errors("gw-1", off, {"gw-1": "given on the command line (-e)"}) == []


@pytest.mark.parametrize(
    "changes, needles",
    [
        # --- the vip: one for all, ADDRESS/PREFIX, a free host address of the gateways' network ----------------------
        (
            {"gw-2": {"vllm_gateway_vip": None}},
            ["gw-1: vllm_gateway_vip='10.89.77.9/24' differs from the other gateways': gw-2 (not set)"],
        ),
        (
            {"gw-2": {"vllm_gateway_vip": "10.89.77.10/24"}},
            ["differs from the other gateways': gw-2 ('10.89.77.10/24')", "in the group_vars of vllm_gateways"],
        ),
        ({"all": {"vllm_gateway_vip": "10.89.77.9"}}, ["vllm_gateway_vip='10.89.77.9' is not ADDRESS/PREFIX"]),
        (
            {"all": {"vllm_gateway_vip": "10.89.77.9/255.255.255.0"}},
            ["vllm_gateway_vip='10.89.77.9/255.255.255.0' is not ADDRESS/PREFIX"],
        ),
        ({"all": {"vllm_gateway_vip": "10.89.77.300/24"}}, ["vllm_gateway_vip='10.89.77.300/24' does not parse"]),
        ({"all": {"vllm_gateway_vip": "10.89.77.9/33"}}, ["vllm_gateway_vip='10.89.77.9/33' does not parse"]),
        ({"all": {"vllm_gateway_vip": "10.89.77.9/24\n"}}, ["control or format character"]),
        ({"all": {"vllm_gateway_vip": "10.89.77.0/24"}}, ["is the network address of 10.89.77.0/24"]),
        ({"all": {"vllm_gateway_vip": "10.89.77.255/24"}}, ["is the broadcast address of 10.89.77.0/24"]),
        (
            {"all": {"vllm_gateway_vip": "10.89.77.12/24"}},
            ["vllm_gateway_vip='10.89.77.12/24' is the gateway gw-2's address", "fix: a free address of 10.89.77.0/24"],
        ),
        (
            {"gw-1": {"vllm_gateway_source_address": "10.89.77.9"}},
            ["vllm_gateway_vip='10.89.77.9/24' is its own address"],
        ),
        (
            {"gw-2": {"ansible_host": "10.89.78.12"}},
            [
                "gw-1: vllm_gateway_vip='10.89.77.9/24': the gateway gw-2's address 10.89.78.12",
                "is not in the vip's network 10.89.77.0/24",
                "reach only one link",
            ],
        ),
        (
            {"gw-1": {"ansible_host": "fd00::11"}},
            ["its own address fd00::11 (vllm_gateway_source_address, by default its ansible_host) is not in"],
        ),
        (
            {"gw-1": {"vllm_gateway_bind_address": "10.89.77.11"}},
            ["vllm_gateway_bind_address='10.89.77.11' is a specific address", "fix: 0.0.0.0"],
        ),
        # --- the VRRP numbers ---------------------------------------------------------------------------------------
        ({"gw-1": {"vllm_gateway_vrrp_priority": None}}, ["vllm_gateway_vrrp_priority is not set"]),
        (
            {"gw-1": {"vllm_gateway_vrrp_priority": 255}},
            ["vllm_gateway_vrrp_priority=255 must be a whole number from 1 to 254"],
        ),
        ({"gw-1": {"vllm_gateway_vrrp_priority": 0}}, ["vllm_gateway_vrrp_priority=0 must be"]),
        ({"gw-1": {"vllm_gateway_vrrp_priority": "high"}}, ["vllm_gateway_vrrp_priority='high' must be"]),
        ({"gw-1": {"vllm_gateway_vrrp_priority": True}}, ["vllm_gateway_vrrp_priority=True must be"]),
        (
            {"gw-2": {"vllm_gateway_vrrp_priority": "150"}},
            ["vllm_gateway_vrrp_priority=150 is also the priority of gw-2", "fix: a different priority on each"],
        ),
        (
            {"gw-1": {"vllm_gateway_vrrp_router_id": 0}},
            ["vllm_gateway_vrrp_router_id=0 must be a whole number from 1 to 255"],
        ),
        ({"gw-1": {"vllm_gateway_vrrp_router_id": 256}}, ["vllm_gateway_vrrp_router_id=256 must be"]),
        (
            {"gw-2": {"vllm_gateway_vrrp_router_id": 52}},
            ["vllm_gateway_vrrp_router_id=51 differs from the other gateways': gw-2 ('52')"],
        ),
        (
            {"gw-1": {"vllm_gateway_vrrp_advert_s": 0}},
            ["vllm_gateway_vrrp_advert_s=0 must be whole seconds from 1 to 255"],
        ),
        ({"gw-1": {"vllm_gateway_vrrp_advert_s": 0.5}}, ["vllm_gateway_vrrp_advert_s=0.5 must be whole seconds"]),
        ({"gw-1": {"vllm_gateway_vrrp_advert_s": "256"}}, ["vllm_gateway_vrrp_advert_s='256' must be"]),
        # --- the password: never shown, nor its length ----------------------------------------------------------------
        ({"gw-1": {"vllm_gateway_vrrp_password": None}}, ["vllm_gateway_vrrp_password is not set or empty"]),
        ({"gw-1": {"vllm_gateway_vrrp_password": ""}}, ["vllm_gateway_vrrp_password is not set or empty"]),
        (
            {
                "gw-1": {"vllm_gateway_vrrp_password": VRRP_SECRET + "9"},
                "gw-2": {"vllm_gateway_vrrp_password": VRRP_SECRET + "9"},
            },
            ["vllm_gateway_vrrp_password (value not shown) is longer than 8 characters", "reads only the first 8"],
        ),
        (
            {"gw-1": {"vllm_gateway_vrrp_password": "Vr7q x2"}, "gw-2": {"vllm_gateway_vrrp_password": "Vr7q x2"}},
            ["(value not shown) holds a character that is not printable ASCII, or a space"],
        ),
        (
            {"gw-1": {"vllm_gateway_vrrp_password": "Vr7q\n"}, "gw-2": {"vllm_gateway_vrrp_password": "Vr7q\n"}},
            ["not printable ASCII, or a space, a line break", "no trailing newline"],
        ),
        (
            {"gw-1": {"vllm_gateway_vrrp_password": "Vr7qé"}, "gw-2": {"vllm_gateway_vrrp_password": "Vr7qé"}},
            ["not printable ASCII"],
        ),
        (
            {
                "gw-2": {"vllm_gateway_vrrp_password": VRRP_SECRET[::-1]},
                "gw-3": {
                    "ansible_host": "10.89.77.13",
                    "vllm_gateway_vip": "10.89.77.9/24",
                    "vllm_gateway_vrrp_version": 2,
                    "vllm_gateway_vrrp_priority": 50,
                },
            },
            ["vllm_gateway_vrrp_password (value not shown) differs from the one of gw-2, gw-3 (no value is shown)"],
        ),
        # --- the interface ------------------------------------------------------------------------------------------
        (
            {"gw-1": {"vllm_gateway_vrrp_interface": "eth0; reboot"}},
            ["vllm_gateway_vrrp_interface='eth0; reboot' is not an interface name"],
        ),
        ({"gw-1": {"vllm_gateway_vrrp_interface": "a" * 16}}, ["is not an interface name (1 to 15"]),
        (
            {"gw-1": {"vllm_gateway_vrrp_interface": ".."}},
            ["vllm_gateway_vrrp_interface='..' is not an interface name"],
        ),
    ],
    ids=itertools.count(),
)
def test_each_vip_error_names_the_host_the_setting_the_value_and_the_fix(changes, needles):
    errors = vip_errors(pair(**changes))
    assert len(errors) == 1, errors
    assert all(needle in errors[0] for needle in needles), errors


# VRRPv3, the role's default: no password, adverts in hundredths of a second.
V3 = {"vllm_gateway_vrrp_version": None, "vllm_gateway_vrrp_password": None}


def test_vrrp_v3_is_the_default_and_takes_no_password_and_sub_second_adverts():
    assert vip_errors(pair(all=V3)) == []
    for advert in (0.5, "0.25", 0.01, 40.95, 1, "2"):
        assert vip_errors(pair(all={**V3, "vllm_gateway_vrrp_advert_s": advert})) == [], advert
    assert vip_errors(pair(all={**V3, "vllm_gateway_vrrp_version": "3"})) == []


@pytest.mark.parametrize(
    "changes, needles",
    [
        (
            {"all": {**V3, "vllm_gateway_vrrp_password": VRRP_SECRET}},
            [
                "gw-1: vllm_gateway_vrrp_password (value not shown) is set, but VRRPv3",
                "carries no authentication",
                "fix: remove vllm_gateway_vrrp_password",
                "or set vllm_gateway_vrrp_version: 2",
            ],
        ),
        (
            {"all": {**V3, "vllm_gateway_vrrp_advert_s": 0.005}},
            ["vllm_gateway_vrrp_advert_s=0.005 must be seconds from 0.01 to 40.95 in hundredths", "fix: e.g. 0.5"],
        ),
        ({"all": {**V3, "vllm_gateway_vrrp_advert_s": 0.125}}, ["vllm_gateway_vrrp_advert_s=0.125 must be seconds"]),
        ({"all": {**V3, "vllm_gateway_vrrp_advert_s": 41}}, ["vllm_gateway_vrrp_advert_s=41 must be seconds"]),
        ({"all": {**V3, "vllm_gateway_vrrp_advert_s": "fast"}}, ["vllm_gateway_vrrp_advert_s='fast' must be"]),
        ({"all": {**V3, "vllm_gateway_vrrp_advert_s": True}}, ["vllm_gateway_vrrp_advert_s=True must be"]),
        ({"all": {**V3, "vllm_gateway_vrrp_version": 4}}, ["vllm_gateway_vrrp_version=4 must be 2 or 3", "fix: 3"]),
        (
            {"all": V3, "gw-2": {"vllm_gateway_vrrp_version": 2, "vllm_gateway_vrrp_password": VRRP_SECRET}},
            [
                "gw-1: vllm_gateway_vrrp_version=3 differs from the other gateways': gw-2 ('2')",
                "ignore each other's adverts",
            ],
        ),
    ],
    ids=itertools.count(),
)
def test_each_vrrp_v3_error_names_the_host_the_setting_the_value_and_the_fix(changes, needles):
    errors = vip_errors(pair(**changes))
    assert len(errors) == 1, errors
    assert all(needle in errors[0] for needle in needles), errors


def test_a_vip_of_a_network_that_holds_no_gateway_names_each_gateway():
    errors = vip_errors(pair(all={"vllm_gateway_vip": "10.89.77.9/32"}))
    assert len(errors) == 2 and "its own address 10.89.77.11" in errors[0], errors
    assert "the gateway gw-2's address 10.89.77.12 (vllm_gateway_source_address" in errors[1]
    assert all("is not in the vip's network 10.89.77.9/32" in e for e in errors)


def test_a_gateway_without_the_vip_the_others_set_is_told_which_and_nothing_else():
    errors = vip_errors(pair(**{"gw-1": {"vllm_gateway_vip": "", "vllm_gateway_vrrp_priority": None}}))
    assert errors == [
        "gw-1: vllm_gateway_vip is not set, but other gateways set one: gw-2 ('10.89.77.9/24'); fix: one "
        "vllm_gateway_vip for all the gateways, in the group_vars of vllm_gateways (or none on any)"
    ]


@pytest.mark.parametrize(
    "source",
    [
        "written in plain text in group_vars/vllm_gateways.yml line 3",
        "given on the command line (-e)",
        "cannot tell whether it came from Vault (ansible-core without data tags)",
    ],
)
def test_a_password_not_from_vault_is_refused_saying_where_it_came_from(source):
    (error,) = vip_errors(pair(), sources={"gw-1": source, "gw-2": None})
    assert error.startswith("gw-1: vllm_gateway_vrrp_password (value not shown) must come from Ansible Vault; ")
    assert f"where it came from: {source}; fix: encrypt it with `ansible-vault encrypt_string" in error
    # Another gateway's source is its own check's; a gateway missing from sources is not taken as from Vault.
    assert vip_errors(pair(), "gw-2", {"gw-1": source, "gw-2": None}) == []
    (error,) = vip_errors(pair(), "gw-2", {})
    assert "where it came from: nothing says where it came from" in error


def test_every_vip_error_at_once_still_never_shows_the_password():
    bad = {
        "vllm_gateway_vip": "10.89.77.255/24",
        "vllm_gateway_vrrp_password": VRRP_SECRET + "-and-more",
        "vllm_gateway_vrrp_priority": 100,
        "vllm_gateway_vrrp_router_id": 300,
        "vllm_gateway_vrrp_advert_s": 0,
        "vllm_gateway_vrrp_interface": "bad name",
        "vllm_gateway_bind_address": "10.89.77.11",
    }
    errors = vip_errors(pair(**{"gw-1": bad}), sources={"gw-1": "given on the command line (-e)"})
    assert len(errors) == 10, errors
    assert not any(VRRP_SECRET in e or "-and-more" in e for e in errors)


FACTS = {
    "lo": {"ipv4": {"address": "127.0.0.1"}, "ipv6": [{"address": "::1", "prefix": "128", "scope": "host"}]},
    "eth0": {
        "ipv4": {"address": "192.168.0.5", "netmask": "255.255.255.0"},
        "ipv4_secondaries": [{"address": "10.89.77.11", "netmask": "255.255.255.0"}],
        "ipv6": [{"address": "fe80::1", "prefix": "64", "scope": "link"}],
    },
    "br-lab": {"ipv6": [{"address": "fd00:89::11", "prefix": "64", "scope": "global"}]},
    "dummy0": {},
}


@pytest.mark.parametrize(
    "address, interface",
    [("192.168.0.5", "eth0"), ("10.89.77.11", "eth0"), ("fd00:89:0::11", "br-lab"), ("127.0.0.1", "lo")],
)
def test_the_vrrp_interface_is_the_one_that_holds_the_address(address, interface):
    assert gateway.vrrp_interface(FACTS, address) == interface


def test_no_interface_with_the_address_is_an_error_naming_it_and_the_interfaces_seen():
    with pytest.raises(ValueError, match=re.escape("address 10.89.77.99 (interfaces seen: br-lab, dummy0, eth0, lo)")):
        gateway.vrrp_interface(FACTS, "10.89.77.99")
    with pytest.raises(ValueError, match=r"'gw-1\.example' .* is not an IP address"):
        gateway.vrrp_interface(FACTS, "gw-1.example")
    with pytest.raises(ValueError, match=re.escape("(interfaces seen: none)")):
        gateway.vrrp_interface({}, "10.89.77.11")


def test_the_vrrp_interface_filter_reads_ansible_facts():
    # Ansible names a fact after its interface with '-' as '_' (ansible_facts['br_lab'] for br-lab).
    facts = {
        "interfaces": ["lo", "eth0", "br-lab"],
        "lo": FACTS["lo"],
        "eth0": FACTS["eth0"],
        "br_lab": FACTS["br-lab"],
    }
    assert gateway_filters.vllm_gateway_vrrp_interface(facts, "fd00:89::11") == "br-lab"
    with pytest.raises(AnsibleFilterError, match="vllm_gateway_vrrp_interface: no interface holds"):
        gateway_filters.vllm_gateway_vrrp_interface(facts, "10.1.1.1")
    with pytest.raises(AnsibleFilterError, match="expects ansible_facts with the network facts"):
        gateway_filters.vllm_gateway_vrrp_interface({"hostname": "gw-1"}, "10.1.1.1")


def test_the_vip_filter_reads_the_gateways_from_hostvars_and_refuses_untagged_passwords():
    # Plain dicts carry no data tags: no mark of Vault, so the password is refused (the real tags:
    # tests/unit/plugins/filter/test_vllm_gateway.py runs ansible-playbook).
    hostvars = {**pair(), "gpu-1": {"vllm_api_key": SECRET}}
    errors = gateway_filters.vllm_gateway_vip_errors(hostvars, "gw-1", ["gw-1", "gw-2"])
    assert errors == [
        "gw-1: vllm_gateway_vrrp_password (value not shown) must come from Ansible Vault; where it came from: no "
        "record of where it came from, and no mark of Ansible Vault; fix: encrypt it with `ansible-vault "
        "encrypt_string --name vllm_gateway_vrrp_password` (or keep it in a vars file encrypted with `ansible-vault "
        "encrypt`) and put it in the group_vars of vllm_gateways, none in a host's own vars or on the command line"
    ]
    assert gateway_filters.vllm_gateway_vip_errors({"gw-1": {}, "gw-2": {}}, "gw-1", ["gw-1", "gw-2"]) == []
    # The gateway checked is always among the gateways, even where its group is empty.
    assert len(gateway_filters.vllm_gateway_vip_errors(hostvars, "gw-1", [])) == 1
    with pytest.raises(AnsibleFilterError, match="the gateway 'gw-9' is not in the inventory"):
        gateway_filters.vllm_gateway_vip_errors(hostvars, "gw-1", ["gw-1", "gw-9"])
    with pytest.raises(AnsibleFilterError, match="vllm_gateway_vip_errors expects hostvars"):
        gateway_filters.vllm_gateway_vip_errors(hostvars, "gw-1", "gw-1")


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
PLANNED = {
    "vllm_profile_name": "cpu-lab-tiny",
    "vllm_version": "0.32.0",
    "vllm_gpu": {"name": "cpu", "memory_mib": 1024, "bandwidth_gb_s": 20, "count": 0},
    "vllm_environment": {"VLLM_CPU_KVCACHE_SPACE": "1"},
}


def test_servers_are_the_plans_instances_one_per_instance():
    instances = plan_filters.vllm_plan_instances(
        {
            "gpu-2.example": dict(PLANNED, vllm_bind_address="10.0.0.12", vllm_port=8001),
            "gpu-1.example": dict(PLANNED, ansible_host="10.0.0.11"),
            "gpu-3": dict(PLANNED, vllm_bind_address="fd00::3", vllm_instance="solo"),
            # Two CPU slots: two instances, on consecutive ports.
            "cpu-4": dict(PLANNED, ansible_host="10.0.0.14", vllm_gpu=dict(PLANNED["vllm_gpu"], count=2)),
        },
        ["gpu-2.example", "gpu-1.example", "gpu-3", "cpu-4"],
    )
    servers = gateway_filters.vllm_gateway_servers(instances)
    assert [(s["name"], s["address"], s["port"]) for s in servers] == [
        ("cpu-4_cpu0", "10.0.0.14", 8000),
        ("cpu-4_cpu1", "10.0.0.14", 8001),
        ("gpu-1.example_main", "10.0.0.11", 8000),  # binds every interface: reached at its inventory address
        ("gpu-2.example_main", "10.0.0.12", 8001),
        ("gpu-3_solo", "fd00::3", 8000),
    ]
    assert instances["gpu-1.example"][0]["local_url"] == "http://127.0.0.1:8000"
    assert instances["gpu-3"][0]["local_url"] == "http://[fd00::3]:8000"
    assert instances["gpu-2.example"][0]["unit"] == "vllm@main.service"
    assert instances["cpu-4"][1]["unit"] == "vllm@cpu1.service"


def test_an_instance_the_plan_no_longer_has_stays_a_server_until_it_is_removed():
    """A host that runs `main` while its new plan places cpu0 and cpu1 (site.yml read what it runs): the gateway keeps
    `main` (retiring) beside the new ones, so that clients are served until the rollout drains and removes it."""
    planned = plan_filters.vllm_plan_instances(
        {"h": dict(PLANNED, ansible_host="10.0.0.5", vllm_gpu=dict(PLANNED["vllm_gpu"], count=2))}, ["h"]
    )
    deployed = gateway_filters.vllm_gateway_deployed(
        {
            "h": {
                "vllm_deployed_instances": [
                    {"name": "main", "address": "10.0.0.5", "port": 8000},
                    {"name": "cpu0", "address": "10.0.0.5", "port": 8000},
                ]
            },
            "g": {},  # no vllm_deployed_instances read (not in this run): its plan's instances only
        },
        ["h", "g", "absent"],
    )
    assert deployed == {
        "h": [
            {"name": "main", "address": "10.0.0.5", "port": 8000},
            {"name": "cpu0", "address": "10.0.0.5", "port": 8000},
        ]
    }
    servers = gateway_filters.vllm_gateway_servers(planned, deployed)
    assert [(s["name"], s["port"], s["retiring"]) for s in servers] == [
        ("h_cpu0", 8000, False),
        ("h_cpu1", 8001, False),
        ("h_main", 8000, True),
    ]
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


@pytest.mark.parametrize(
    "fixture, running", [("0.32.0-cpu/metrics_idle.txt", 0.0), ("0.26.0-cuda-h200/metrics_after_bench.txt", 0.0)]
)
def test_running_requests_are_read_with_the_prometheus_parser(fixture, running):
    text = (FIXTURES / "vllm" / fixture).read_text()
    assert "vllm:num_requests_running{" in text
    assert gateway.requests_running(text) == running


def test_running_requests_count_what_vllm_reports():
    text = (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 2.0\n'
    )
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
    entry = plan(
        {
            "vllm_version": "0.17.1",
            "vllm_profile_name": None,
            "vllm_profile": {
                "model": "Qwen/Qwen2.5-0.5B-Instruct",
                "max_model_len": 2048,
                "max_num_seqs": 4,
                "gpu_memory_utilization": 0.9,
            },
            "vllm_shutdown_timeout": 30,
        }
    )
    assert "--shutdown-timeout" not in entry["instances"][0]["args"]
    assert any(d["flag"] == "--shutdown-timeout" and "0.18.0" in d["reason"] for d in entry["dropped"]), entry


def test_systemd_must_outlast_vllms_own_drain():
    entry = plan({"vllm_shutdown_timeout": 55, "vllm_timeout_stop_sec": 60})
    assert any(
        "lab-1: vllm_timeout_stop_sec=60 does not outlast vllm_shutdown_timeout=55 by 10 s" in e
        and "fix: vllm_timeout_stop_sec: 85 or more" in e
        for e in entry["errors"]
    ), entry["errors"]
    assert plan({"vllm_shutdown_timeout": 30, "vllm_timeout_stop_sec": 40})["errors"] == []


def test_the_plan_lists_its_instances():
    entry = plan({"vllm_bind_address": "10.89.77.11"})
    (instance,) = entry["instances"]
    assert {key: value for key, value in instance.items() if key != "args"} == {
        "name": "main",
        "unit": "vllm@main.service",
        "port": 8000,
        "local_url": "http://10.89.77.11:8000",
        "address": "10.89.77.11",
        "url": "http://10.89.77.11:8000",
        "gpus": [0],
        "tensor_parallel_size": 1,
        "served_model_name": "tiny-qwen2",
        "weights": "lab/tiny-qwen2",
        "adapters": [],
    }
    assert instance["args"][instance["args"].index("--port") + 1] == "8000"
    assert planner.instances("h", dict(PLANNED, vllm_bind_address="0.0.0.0"))[0]["address"] == "h"
