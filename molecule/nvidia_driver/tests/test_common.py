"""Both nvidia_driver hosts after converge (see ../molecule.yml): nouveau blacklisted, nothing installed or held."""

testinfra_hosts = ["podman://nvd-present", "podman://nvd-install"]

BLACKLIST = "/etc/modprobe.d/nvidia-driver-blacklist-nouveau.conf"


def installed_nvidia_packages(host):
    out = host.check_output("dpkg-query -W -f '${Package} ${db:Status-Abbrev}\\n' 2>/dev/null || true")
    return [line.split()[0] for line in out.splitlines() if "nvidia" in line and line.split()[1].startswith("i")]


def test_nouveau_blacklisted_on_both(host):
    conf = host.file(BLACKLIST)
    assert conf.exists
    assert (conf.user, conf.group, conf.mode) == ("root", "root", 0o644)
    assert "blacklist nouveau" in conf.content_string
    assert "options nouveau modeset=0" in conf.content_string


def test_nothing_installed_on_either(host):
    assert installed_nvidia_packages(host) == []
    assert host.run("apt-mark showhold").stdout.strip() == ""
