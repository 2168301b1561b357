"""nvd-install: Debian's own R535 packages, SIMULATED INSTALL: the repository setup is real, the package
selection resolves against the real Debian mirror, and nothing is installed."""

import json

testinfra_hosts = ["podman://nvd-install"]

DEBIAN_SOURCES = "/etc/apt/sources.list.d/nvidia-driver-debian.sources"
CUDA_SOURCES = "/etc/apt/sources.list.d/nvidia-cuda.sources"
PIN = "/etc/apt/preferences.d/nvidia-driver.pref"
DEBIAN_SET = ["nvidia-kernel-dkms", "firmware-nvidia-gsp", "libcuda1", "nvidia-smi", "nvidia-persistenced"]


def facts(host):
    return json.loads(host.file("/root/nvidia_driver_facts.json").content_string)


def test_install_host_adds_debian_non_free(host):
    sources = host.file(DEBIAN_SOURCES)
    assert (sources.user, sources.group, sources.mode) == ("root", "root", 0o644)
    text = sources.content_string
    assert "Suites: bookworm bookworm-updates" in text
    assert "Suites: bookworm-security" in text
    assert text.count("Components: contrib non-free non-free-firmware") == 2
    assert not host.file(CUDA_SOURCES).exists


def test_install_host_pins_the_branch(host):
    pin = host.file(PIN).content_string
    assert "Pin: version 535.*" in pin
    assert "Pin-Priority: 990" in pin
    policy = host.check_output("LC_ALL=C apt-cache policy nvidia-smi")
    assert "990" in policy  # the pin applies to the candidate from non-free


def test_install_host_package_selection_resolves_on_the_mirror(host):
    result = host.run("LC_ALL=C apt-get install --simulate --no-install-recommends " + " ".join(DEBIAN_SET))
    assert result.rc == 0, result.stderr
    for package in DEBIAN_SET:
        assert f"Inst {package} (535." in result.stdout, package


def test_install_host_recorded_the_simulated_transaction(host):
    found = facts(host)
    simulated = found["nvidia_driver_simulated_install"]
    assert simulated["driver_version"].startswith("535.")
    names = [entry.split("=")[0] for entry in simulated["packages"]]
    for package in DEBIAN_SET:
        assert package in names
    assert any(name.startswith("linux-headers") or name == "dkms" for name in names)
    assert found["nvidia_driver_present"] is False
    assert found["nvidia_driver_reboot_required"] is False
    assert found["nvidia_driver_gpus"] is None  # verification waits for a real install
    assert found["nvidia_driver_min_version"] == ""  # this host runs no vLLM (vllm_version: "")
    assert found["nvidia_driver_detected"] is False
