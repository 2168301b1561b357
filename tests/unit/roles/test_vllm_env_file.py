"""The environment file the vllm role writes for each instance (templates/vllm.env.j2, configure.yml), rendered
here with Jinja2 as Ansible's template module renders it (trim_blocks), with the role's filter for the values.

A CUDA host's file keeps FlashInfer from fetching kernels: FLASHINFER_NO_DOWNLOAD=1 (FlashInfer's
flashinfer/jit/cubin_loader.py, in flashinfer-python 0.6.13 to 0.7.2.post1: with it set, a kernel missing from the
wheelhouse's flashinfer-cubin raises, naming the file, rather than being downloaded from NVIDIA's artifactory). The
carried flashinfer-cubin is found without any variable (flashinfer/jit/env.py looks for the package; setting
FLASHINFER_CUBIN_DIR would override it), so none other is set. A CPU host's file has no FlashInfer line."""

import jinja2
import pytest

from conftest import ROOT, load_source
from vllm_fleet import inputs

plugin = load_source("systemd_args_filter", ROOT / "plugins" / "filter" / "systemd_args.py")


def render(target_device, environment=None):
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["comment"] = lambda text: "#\n# " + text + "\n#"
    env.filters["vllm_fleet.fleet.systemd_env_quote"] = plugin.systemd_env_quote
    template = env.from_string((ROOT / "templates" / "vllm.env.j2").read_text())
    return template.render(
        ansible_managed="Ansible managed",
        vllm_instance="main",
        vllm_target_device=target_device,
        _vllm_instance_state_dir="/var/lib/vllm/instances/main",
        _vllm_instance_cache_dir="/var/cache/vllm/instances/main",
        _vllm_instance={"environment": {"CUDA_VISIBLE_DEVICES": "GPU-0"}},
        vllm_environment=environment or {},
        vllm_api_key="",
    )


def assignments(text):
    """{NAME: value} of the file's assignment lines, and no line that is neither one, a comment nor blank."""
    found = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, sep, _ = line.partition("=")
        assert sep and name.isidentifier(), f"not an assignment: {line!r}"
        found[name] = plugin.systemd_env_value(text, name)
    return found


def test_a_cuda_host_never_lets_flashinfer_download_a_kernel():
    values = assignments(render("cuda"))
    assert values["FLASHINFER_NO_DOWNLOAD"] == "1"
    assert values["HF_HUB_OFFLINE"] == "1" and values["VLLM_NO_USAGE_STATS"] == "1"
    assert values["VLLM_TARGET_DEVICE"] == "cuda"
    # The carried flashinfer-cubin package is found by itself; FLASHINFER_CUBIN_DIR would take precedence over it.
    assert not {"FLASHINFER_CUBIN_DIR", "VLLM_HAS_FLASHINFER_CUBIN", "FLASHINFER_DISABLE_VERSION_CHECK"} & set(values)


def test_a_cpu_host_has_no_flashinfer_line():
    text = render("cpu")
    values = assignments(text)
    assert "FLASHINFER" not in text
    assert values["VLLM_TARGET_DEVICE"] == "cpu" and values["HF_HUB_OFFLINE"] == "1"


@pytest.mark.parametrize("value", ["", "0"])
def test_the_inventory_turns_it_off_only_with_the_explicit_opt_in(value):
    """A later assignment wins in an environment file, so vllm_environment may not set it without opting in."""
    (message,) = inputs.check("h1", {"vllm_environment": {"FLASHINFER_NO_DOWNLOAD": value}})
    assert "turns off one of the site's guarantees" in message and "vllm_environment_allow" in message
    allowed = {
        "vllm_environment": {"FLASHINFER_NO_DOWNLOAD": value},
        "vllm_environment_allow": ["FLASHINFER_NO_DOWNLOAD"],
    }
    assert inputs.check("h1", allowed) == []
    assert assignments(render("cuda", {"FLASHINFER_NO_DOWNLOAD": value}))["FLASHINFER_NO_DOWNLOAD"] == value
