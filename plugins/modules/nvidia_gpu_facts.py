#!/usr/bin/python
# -*- coding: utf-8 -*-
# Part of the vllm-fleet Ansible package. Runs on the managed host; standard library only.

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: nvidia_gpu_facts
short_description: Report the NVIDIA GPUs and the loaded driver of a host, from nvidia-smi
description:
  - Runs C(nvidia-smi --query-gpu=... --format=csv,noheader,nounits) with C(LC_ALL=C) and returns one
    entry per GPU (name, memory, compute capability, persistence mode, PCI bus id, UUID) and host-level
    facts (count, names, driver version, the CUDA version the driver supports).
  - Reads C(/proc/driver/nvidia/version) for the version and flavour (open or proprietary) of the
    loaded kernel module, when the kernel exposes it.
  - Tells apart the states an operator acts on differently - no C(nvidia-smi), no driver loaded, a
    driver/library version mismatch (a driver upgraded under a running module, reboot pending),
    no devices - through RV(status). With O(require=true) any state but V(ok) fails the task.
  - Reads only; changes nothing on the host.
version_added: "0.1.0"
author:
  - vllm-fleet maintainers
options:
  nvidia_smi:
    description:
      - Path to C(nvidia-smi). When unset, the module looks in E(PATH), then in C(/usr/bin),
        C(/usr/local/nvidia/bin) (container and driver-container layouts) and C(/usr/local/bin).
    type: path
  require:
    description:
      - Fail unless nvidia-smi answered with at least one GPU (RV(status=ok)).
      - Set to V(false) to probe a host that may not have a driver yet; RV(status) then says why.
    type: bool
    default: true
  mask_uuids:
    description:
      - Replace the hexadecimal digits of each GPU UUID with zeros, for reports that leave the site.
    type: bool
    default: false
  proc_version_path:
    description:
      - Where the loaded kernel module reports its version.
    type: path
    default: /proc/driver/nvidia/version
  proc_gpus_path:
    description:
      - Where the loaded driver describes each GPU (C(<pci address>/information), its device minor number).
    type: path
    default: /proc/driver/nvidia/gpus
  sysfs_pci_path:
    description:
      - Where sysfs describes each PCI device (C(<pci address>/numa_node) and C(local_cpulist)).
    type: path
    default: /sys/bus/pci/devices
requirements:
  - An NVIDIA driver that ships C(nvidia-smi) (R450 or newer for the C(compute_cap) field).
notes:
  - Supports check mode (it only reads).
seealso:
  - name: nvidia-smi documentation
    description: The query fields and their meaning.
    link: https://docs.nvidia.com/deploy/nvidia-smi/index.html
"""

EXAMPLES = r"""
- name: Probe the GPUs; a host without a driver is not an error here
  vllm_fleet.fleet.nvidia_gpu_facts:
    require: false
  register: __nvidia_driver_probe

- name: Fail unless the driver answers, with UUIDs masked for the report
  vllm_fleet.fleet.nvidia_gpu_facts:
    mask_uuids: true
  register: __gpu

- name: Show what the planner will use
  ansible.builtin.debug:
    msg: "{{ __gpu.count }} x {{ __gpu.names[0] }} ({{ __gpu.memory_mib_min }} MiB), driver {{ __gpu.driver_version }}"
"""

RETURN = r"""
status:
  description:
    - V(ok) - nvidia-smi listed at least one GPU.
    - V(missing) - no nvidia-smi found.
    - V(driver_not_loaded) - nvidia-smi cannot talk to a kernel module.
    - V(nvml_mismatch) - C(Failed to initialize NVML - Driver/library version mismatch); a reboot (or a module
      reload) is pending.
    - V(no_devices) - the driver is loaded but sees no GPU.
    - V(no_permission) - nvidia-smi lacks permission on the device nodes.
    - V(error) - anything else; RV(message) holds nvidia-smi's output.
  returned: always
  type: str
  sample: ok
message:
  description: One line on the state, with nvidia-smi's own words when it failed.
  returned: always
  type: str
  sample: 1 GPU(s), driver 580.159.04
nvidia_smi:
  description: The nvidia-smi that was run, or null when none was found.
  returned: always
  type: str
  sample: /usr/bin/nvidia-smi
count:
  description: Number of GPUs (0 unless RV(status=ok)).
  returned: always
  type: int
  sample: 1
names:
  description: Product name of each GPU, as nvidia-smi prints it.
  returned: always
  type: list
  elements: str
  sample: ["NVIDIA H200"]
short_names:
  description: Product names without the C(NVIDIA) and C(GeForce) prefixes.
  returned: always
  type: list
  elements: str
  sample: ["H200"]
uuids:
  description: GPU UUIDs (masked with O(mask_uuids)).
  returned: always
  type: list
  elements: str
  sample: ["GPU-00000000-0000-0000-0000-000000000000"]
memory_mib:
  description: Total memory of each GPU in MiB.
  returned: always
  type: list
  elements: int
  sample: [143771]
memory_mib_min:
  description: The smallest GPU's memory in MiB (what a per-GPU plan must fit in); null without GPUs.
  returned: always
  type: int
  sample: 143771
memory_mib_total:
  description: Memory of all GPUs together in MiB.
  returned: always
  type: int
  sample: 143771
driver_version:
  description: Version of the loaded driver as nvidia-smi reports it; null unless RV(status=ok).
  returned: always
  type: str
  sample: 580.159.04
cuda_version:
  description: Newest CUDA version the loaded driver supports (from the C(nvidia-smi -q) header); null when unknown.
  returned: always
  type: str
  sample: "13.0"
compute_caps:
  description: Distinct compute capabilities of the GPUs.
  returned: always
  type: list
  elements: str
  sample: ["9.0"]
persistence_mode:
  description: True when persistence mode is on for every GPU.
  returned: always
  type: bool
  sample: true
homogeneous:
  description: True when all GPUs have the same name and memory size.
  returned: always
  type: bool
  sample: true
gpus:
  description: One entry per GPU.
  returned: always
  type: list
  elements: dict
  contains:
    index: {description: nvidia-smi index., type: int}
    uuid: {description: GPU UUID (masked with O(mask_uuids))., type: str}
    name: {description: Product name., type: str}
    short_name: {description: Product name without vendor and brand prefixes., type: str}
    memory_mib: {description: Total memory in MiB., type: int}
    memory_used_mib: {description: Memory in use in MiB., type: int}
    driver_version: {description: Driver version., type: str}
    compute_cap: {description: "Compute capability (C(8.9) for Ada, C(9.0) for Hopper).", type: str}
    pci_bus_id: {description: PCI bus id., type: str}
    persistence_mode: {description: Persistence mode on., type: bool}
    minor:
      description: Minor number of its device node C(/dev/nvidia<minor>), null when the driver does not say.
      type: int
    numa_node: {description: NUMA node the GPU is attached to (null when the platform has none)., type: int}
    cpus: {description: "CPUs local to the GPU, as sysfs lists them (C(0-15,32-47)); null when unknown.", type: str}
kernel_module:
  description: The loaded kernel module, from O(proc_version_path).
  returned: always
  type: dict
  contains:
    loaded: {description: The file exists and names a version., type: bool}
    version: {description: "Version of the loaded module, or null.", type: str}
    open: {description: "True for NVIDIA's open kernel modules, null when not loaded.", type: bool}
nvml_library_version:
  description: User-space NVML version that newer nvidia-smi prints after a version mismatch; null otherwise.
  returned: always
  type: str
  sample: "580.105"
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vllm_fleet.fleet.plugins.module_utils.nvidia_smi import (
    NvidiaSmiParseError,
    classify_error,
    nvml_library_version,
    parse_gpus,
    parse_proc_version,
    parse_query_header,
    query_command,
    topology,
)

_SEARCH_DIRS = ["/usr/bin", "/usr/local/nvidia/bin", "/usr/local/bin"]
_C_LOCALE = {"LC_ALL": "C", "LANG": "C"}

_ADVICE = {
    "missing": "nvidia-smi was not found: the NVIDIA driver's utilities are not installed on this host",
    "driver_not_loaded": "nvidia-smi cannot reach the kernel module: the driver is installed but not loaded "
    "(a reboot is pending, nouveau holds the GPU, or Secure Boot refused an unsigned module)",
    "nvml_mismatch": "the user-space driver and the loaded kernel module differ (the driver was upgraded under a "
    "running module): reboot the host, or unload and reload the nvidia modules when nothing uses the GPU",
    "no_devices": "the driver is loaded but sees no GPU (check lspci, the PCI passthrough, and dmesg)",
    "no_permission": "nvidia-smi lacks permission on /dev/nvidia* (run as root or check the device node modes)",
    "error": "nvidia-smi failed",
}


def _empty(status, message, nvidia_smi=None):
    return {
        "changed": False,
        "status": status,
        "message": message,
        "nvidia_smi": nvidia_smi,
        "count": 0,
        "gpus": [],
        "names": [],
        "short_names": [],
        "uuids": [],
        "memory_mib": [],
        "memory_mib_min": None,
        "memory_mib_total": 0,
        "driver_version": None,
        "cuda_version": None,
        "compute_caps": [],
        "persistence_mode": False,
        "homogeneous": True,
        "nvml_library_version": None,
    }


def _kernel_module(path):
    try:
        with open(path) as handle:
            parsed = parse_proc_version(handle.read())
    except OSError:
        parsed = None
    if not parsed:
        return {"loaded": False, "version": None, "open": None}
    return {"loaded": True, "version": parsed["version"], "open": parsed["open"]}


def _find_nvidia_smi(module):
    wanted = module.params["nvidia_smi"]
    if wanted:
        return wanted if os.access(wanted, os.X_OK) else None
    return module.get_bin_path("nvidia-smi", required=False, opt_dirs=_SEARCH_DIRS)


def probe(module):
    """Run nvidia-smi and build the result dict (no failure decided here)."""
    kernel_module = _kernel_module(module.params["proc_version_path"])
    nvidia_smi = _find_nvidia_smi(module)
    if not nvidia_smi:
        result = _empty("missing", _ADVICE["missing"])
        result["kernel_module"] = kernel_module
        return result

    rc, out, err = module.run_command(query_command(nvidia_smi), environ_update=_C_LOCALE)
    text = (out or "") + (err or "")
    if rc != 0 or not out.strip():
        status = classify_error(text) if text.strip() else "no_devices"
        first_line = text.strip().splitlines()[0] if text.strip() else "no output"
        result = _empty(
            status, "%s (nvidia-smi rc=%d: %s)" % (_ADVICE.get(status, _ADVICE["error"]), rc, first_line), nvidia_smi
        )
        result["nvml_library_version"] = nvml_library_version(text)
        result["kernel_module"] = kernel_module
        return result

    try:
        result = parse_gpus(out, mask=module.params["mask_uuids"])
    except NvidiaSmiParseError as exc:
        result = _empty("error", "could not read nvidia-smi output: %s" % exc, nvidia_smi)
        result["kernel_module"] = kernel_module
        return result

    def read(kind, address):
        root = module.params["proc_gpus_path"] if kind == "information" else module.params["sysfs_pci_path"]
        try:
            with open(os.path.join(root, address, kind)) as handle:
                return handle.read()
        except OSError:
            return None

    for gpu in result["gpus"]:
        gpu.update(topology(gpu, read))

    # The header of `nvidia-smi -q` is the one place that names the CUDA version the driver supports.
    rc, q_out, _dummy = module.run_command([nvidia_smi, "-q", "-d", "COMPUTE"], environ_update=_C_LOCALE)
    header = parse_query_header(q_out) if rc == 0 else {}

    result.update(
        changed=False,
        status="ok",
        nvidia_smi=nvidia_smi,
        cuda_version=header.get("cuda_version"),
        nvml_library_version=None,
        kernel_module=kernel_module,
        message="%d GPU(s), driver %s" % (result["count"], result["driver_version"]),
    )
    return result


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nvidia_smi=dict(type="path"),
            require=dict(type="bool", default=True),
            mask_uuids=dict(type="bool", default=False),
            proc_version_path=dict(type="path", default="/proc/driver/nvidia/version"),
            proc_gpus_path=dict(type="path", default="/proc/driver/nvidia/gpus"),
            sysfs_pci_path=dict(type="path", default="/sys/bus/pci/devices"),
        ),
        supports_check_mode=True,
    )
    result = probe(module)
    result["ansible_facts"] = {"nvidia_gpu": {k: v for k, v in result.items() if k != "changed"}}
    if module.params["require"] and result["status"] != "ok":
        module.fail_json(msg="nvidia_gpu_facts on this host: %s" % result["message"], **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
