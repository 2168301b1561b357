"""keepalived's configuration and the VRRP rules the vllm_gateway role writes for a pair of gateways that share an
address, rendered from the role's own templates, defaults and vars (ansible-playbook on the controller only), the
rules then checked by nftables' own parser (nft -c, which changes nothing). keepalived's own check
(keepalived --config-test) runs where keepalived is installed: in the role, before it installs the file, on the
Molecule fleet scenario's gateways."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, run_ansible

pytestmark = pytest.mark.integration
GATEWAYS = {"gw-1": ("10.0.10.5", 200), "gw-2": ("10.0.10.6", 100)}


def render(tmp_path: Path, **settings) -> dict[str, dict[str, str]]:
    """{gateway: {"keepalived.conf": text, "vrrp.nft": text}} for the pair, with `settings` as the gateways' group
    variables."""
    role = ROOT / "roles" / "vllm_gateway"
    defaults = yaml.safe_load((ROOT / "roles" / "vllm_defaults" / "defaults" / "main.yml").read_text())
    defaults.update(yaml.safe_load((role / "defaults" / "main.yml").read_text()))
    hosts = {
        name: {
            "ansible_connection": "local",
            "ansible_host": address,
            "vllm_gateway_vrrp_priority": priority,
            "vllm_gateway_vrrp_interface": "eth0",
        }
        for name, (address, priority) in GATEWAYS.items()
    }
    group = {"vllm_gateway_vip": "10.0.10.9/24", **settings}
    (tmp_path / "pair.yml").write_text(
        yaml.safe_dump({"all": {"vars": defaults, "children": {"vllm_gateways": {"hosts": hosts, "vars": group}}}})
    )
    out = tmp_path / "out"
    tasks = [
        {
            "name": "Folder",
            "ansible.builtin.file": {"path": f"{out}/{{{{ inventory_hostname }}}}", "state": "directory"},
        }
    ] + [
        {
            "name": name,
            "ansible.builtin.template": {
                "src": str(role / "templates" / template),
                "dest": f"{out}/{{{{ inventory_hostname }}}}/{name}",
                "mode": "0644",
            },
        }
        for name, template in (("keepalived.conf", "keepalived.conf.j2"), ("vrrp.nft", "vrrp.nft.j2"))
    ]
    (tmp_path / "render.yml").write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Render the VRRP files",
                    "hosts": "vllm_gateways",
                    "gather_facts": False,
                    "vars_files": [str(role / "vars" / "main.yml")],
                    "vars": {"role_path": str(role)},
                    "tasks": tasks,
                }
            ]
        )
    )
    env = {
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin:/usr/sbin:/sbin",
        "HOME": str(tmp_path),
        "ANSIBLE_FORCE_COLOR": "0",
    }
    proc = run_ansible(
        "ansible-playbook", "-i", str(tmp_path / "pair.yml"), str(tmp_path / "render.yml"), cwd=ROOT, env=env
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return {name: {f.name: f.read_text() for f in (out / name).iterdir()} for name in GATEWAYS}


def nft_check(path: Path) -> subprocess.CompletedProcess[str]:
    nft = shutil.which("nft") or "/usr/sbin/nft"
    return subprocess.run([nft, "-c", "-f", str(path)], capture_output=True, text=True, timeout=30)


def test_vrrp_v3_by_default_sub_second_adverts_no_password_and_vrrp_only_from_the_peer(tmp_path):
    files = render(tmp_path)
    for name, (address, priority) in GATEWAYS.items():
        (peer,) = [a for n, (a, _) in GATEWAYS.items() if n != name]
        conf, rules = files[name]["keepalived.conf"], files[name]["vrrp.nft"]
        assert "    version 3\n" in conf and "    advert_int 0.5\n" in conf, conf
        assert f"    priority {priority}\n" in conf and f"    unicast_src_ip {address}\n" in conf, conf
        assert f"    unicast_peer {{\n        {peer}\n    }}\n" in conf, conf
        assert "include" not in conf and "auth" not in conf.split("global_defs")[1], conf
        # VRRP (112) admitted from the peer only; every other VRRP packet dropped and counted.
        chain = rules.split("chain input {")[1]
        assert f"ip saddr {peer} meta l4proto 112 accept" in chain, rules
        assert address not in chain and chain.count("accept") == 2, rules  # the policy's and the peer's
        assert "meta l4proto 112 counter name refused drop" in chain, rules
        path = tmp_path / f"{name}.nft"
        path.write_text(rules)
        checked = nft_check(path)
        assert checked.returncode == 0, checked.stderr


def test_vrrp_v2_keeps_whole_seconds_and_includes_the_password_file(tmp_path):
    files = render(tmp_path, vllm_gateway_vrrp_version=2, vllm_gateway_vrrp_advert_s=1)
    conf = files["gw-1"]["keepalived.conf"]
    assert "    version 2\n" in conf and "    advert_int 1\n" in conf, conf
    assert "    include /etc/keepalived/vllm-gateway-auth.conf\n" in conf, conf
    assert "ip saddr 10.0.10.6 meta l4proto 112 accept" in files["gw-1"]["vrrp.nft"]


def test_a_rule_file_nft_refuses_is_refused(tmp_path):
    """The check above can fail: nft -c refuses a broken rule."""
    files = render(tmp_path)
    path = tmp_path / "broken.nft"
    path.write_text(files["gw-1"]["vrrp.nft"].replace("meta l4proto 112 accept", "meta l4proto 112 acept", 1))
    assert nft_check(path).returncode != 0
