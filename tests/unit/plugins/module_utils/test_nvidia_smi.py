"""Unit tests of plugins/module_utils/nvidia_smi.py (the nvidia_gpu_facts module that runs it on a host:
tests/unit/plugins/modules/test_nvidia_gpu_facts.py).

Real outputs: tests/unit/fixtures/gpu/h200/ (verbatim copies of ../shared/fixtures/gpu/h200/).
Constructed outputs in the same format: rtx4090/, l40/, errors/ (see fixtures/gpu/README.md).
"""

import re
import sys

import pytest
import yaml

from conftest import GPU_FIXTURES as FIXTURES
from conftest import ROOT as REPO
from conftest import load_source

SHARED_H200 = REPO / ".." / "shared" / "fixtures" / "gpu" / "h200"
ROLE = REPO / "roles" / "nvidia_driver"


nvidia_smi = load_source("nvidia_smi", REPO / "plugins" / "module_utils" / "nvidia_smi.py")


def fixture(*parts):
    return (FIXTURES.joinpath(*parts)).read_text()


# --- the real H200 capture ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["query-gpu-nounits.csv", "query-gpu.csv", "nvidia-smi-q.txt"])
def test_h200_copies_are_verbatim(name):
    original = SHARED_H200 / name
    if not original.exists():
        pytest.skip("../shared is not beside this checkout")
    assert (FIXTURES / "h200" / name).read_bytes() == original.read_bytes()


def test_query_fields_match_the_real_capture():
    # The nounits capture has one value per QUERY_FIELDS entry: the module asks for exactly what was captured.
    line = fixture("h200", "query-gpu-nounits.csv").strip()
    assert len(line.split(", ")) == len(nvidia_smi.QUERY_FIELDS)
    header = fixture("h200", "query-gpu.csv").splitlines()[0]
    names = [nvidia_smi._HEADER_UNIT_RE.sub("", field).strip() for field in header.split(", ")]
    assert tuple(names[: len(nvidia_smi.QUERY_FIELDS)]) == nvidia_smi.QUERY_FIELDS


def test_h200_nounits():
    facts = nvidia_smi.parse_gpus(fixture("h200", "query-gpu-nounits.csv"))
    assert facts["count"] == 1
    assert facts["names"] == ["NVIDIA H200"]
    assert facts["short_names"] == ["H200"]
    assert facts["memory_mib"] == [143771]
    assert facts["memory_mib_min"] == 143771
    assert facts["driver_version"] == "580.159.04"
    assert facts["compute_caps"] == ["9.0"]
    assert facts["persistence_mode"] is True
    assert facts["homogeneous"] is True
    gpu = facts["gpus"][0]
    assert gpu["index"] == 0
    assert gpu["pci_bus_id"] == "00000000:00:06.0"
    assert gpu["memory_used_mib"] == 0
    assert gpu["uuid"] == "GPU-00000000-0000-0000-0000-000000000000"


def test_h200_with_header_and_units_gives_the_same_facts():
    rows = nvidia_smi.parse_csv(fixture("h200", "query-gpu.csv"))
    assert rows[0]["memory.total"] == "143771"
    assert rows[0]["power.limit"] == "700.00"
    assert rows[0]["clocks.max.memory"] == "3201"
    with_units = nvidia_smi.summarize([nvidia_smi.gpu_from_row(row) for row in rows])
    assert with_units == nvidia_smi.parse_gpus(fixture("h200", "query-gpu-nounits.csv"))


def test_h200_query_header():
    header = nvidia_smi.parse_query_header(fixture("h200", "nvidia-smi-q.txt"))
    assert header == {"driver_version": "580.159.04", "cuda_version": "13.0", "attached_gpus": 1}


# --- constructed RTX 4090 and L40 outputs ------------------------------------------------------


def test_rtx4090_two_cards():
    facts = nvidia_smi.parse_gpus(fixture("rtx4090", "query-gpu-nounits.csv"))
    assert facts["count"] == 2
    assert facts["short_names"] == ["RTX 4090", "RTX 4090"]
    assert facts["memory_mib"] == [24564, 24564]
    assert facts["memory_mib_total"] == 49128
    assert facts["compute_caps"] == ["8.9"]
    assert facts["persistence_mode"] is False
    assert [gpu["index"] for gpu in facts["gpus"]] == [0, 1]


def test_rtx4090_query_header():
    header = nvidia_smi.parse_query_header(fixture("rtx4090", "nvidia-smi-q-compute.txt"))
    assert header == {"driver_version": "580.95.05", "cuda_version": "13.0", "attached_gpus": 2}


def test_l40_four_cards_and_header_form():
    facts = nvidia_smi.parse_gpus(fixture("l40", "query-gpu-nounits.csv"))
    assert facts["count"] == 4
    assert set(facts["names"]) == {"NVIDIA L40"}
    assert facts["memory_mib_min"] == 46068
    assert facts["persistence_mode"] is True
    rows = nvidia_smi.parse_csv(fixture("l40", "query-gpu.csv"))
    assert [row["pci.bus_id"] for row in rows] == ["00000000:17:00.0", "00000000:31:00.0"]


def test_mixed_cards_are_not_homogeneous():
    text = (
        fixture("l40", "query-gpu-nounits.csv").splitlines()[0]
        + "\n"
        + fixture("rtx4090", "query-gpu-nounits.csv").splitlines()[1]
    )
    facts = nvidia_smi.parse_gpus(text)
    assert facts["homogeneous"] is False
    assert facts["memory_mib_min"] == 24564


# --- edge cases ---------------------------------------------------------------------------------


def test_missing_values_become_none():
    row = nvidia_smi.parse_csv(
        "0, GPU-1, NVIDIA L40, 46068, [N/A], 580.95.05, [Not Supported], 00000000:17:00.0, [N/A]\n",
        nvidia_smi.QUERY_FIELDS,
    )[0]
    gpu = nvidia_smi.gpu_from_row(row)
    assert gpu["memory_used_mib"] is None
    assert gpu["compute_cap"] is None
    assert gpu["persistence_mode"] is None


def test_wrong_field_count_names_the_line():
    with pytest.raises(nvidia_smi.NvidiaSmiParseError, match="has 3 fields, expected 9"):
        nvidia_smi.parse_csv("0, GPU-1, NVIDIA L40\n", nvidia_smi.QUERY_FIELDS)


def test_non_numeric_memory_is_an_error():
    with pytest.raises(nvidia_smi.NvidiaSmiParseError, match=re.escape("memory.total is not a number")):
        nvidia_smi.parse_gpus("0, GPU-1, NVIDIA L40, lots, 0, 580.95.05, 8.9, 00000000:17:00.0, Enabled\n")


def test_empty_output_has_no_gpus():
    facts = nvidia_smi.parse_gpus("")
    assert facts["count"] == 0
    assert facts["memory_mib_min"] is None
    assert facts["driver_version"] is None
    assert facts["persistence_mode"] is False


def test_mask_uuid_keeps_the_shape():
    assert (
        nvidia_smi.mask_uuid("GPU-3f2a9c1e-77b0-4d2e-9a51-0c8e11aa42fd") == "GPU-00000000-0000-0000-0000-000000000000"
    )
    facts = nvidia_smi.parse_gpus(
        fixture("rtx4090", "query-gpu-nounits.csv").replace("0000-000000000001", "9abc-def012345678"), mask=True
    )
    assert facts["uuids"] == ["GPU-00000000-0000-0000-0000-000000000000"] * 2


@pytest.mark.parametrize(
    "name, status",
    [
        ("nvml-mismatch.txt", "nvml_mismatch"),
        ("driver-not-loaded.txt", "driver_not_loaded"),
        ("no-devices.txt", "no_devices"),
    ],
)
def test_error_outputs_are_classified(name, status):
    assert nvidia_smi.classify_error(fixture("errors", name)) == status


def test_unknown_error_and_nvml_library_version():
    assert nvidia_smi.classify_error("Segmentation fault") == "error"
    assert nvidia_smi.nvml_library_version(fixture("errors", "nvml-mismatch.txt")) == "580.105"
    assert nvidia_smi.nvml_library_version("No devices were found") is None


def test_proc_version_open_and_proprietary():
    assert nvidia_smi.parse_proc_version(fixture("errors", "proc-version-open-580.txt")) == {
        "version": "580.95.05",
        "open": True,
    }
    assert nvidia_smi.parse_proc_version(fixture("errors", "proc-version-proprietary-535.txt")) == {
        "version": "535.261.03",
        "open": False,
    }
    assert nvidia_smi.parse_proc_version("") is None


@pytest.mark.parametrize(
    "version, minimum, expected",
    [
        ("580.159.04", "580.65.06", True),
        ("580.65.06", "580.65.06", True),
        ("575.57.08", "580.65.06", False),
        ("535.261.03", "580.65.06", False),
        ("590.44", "580.65.06", True),
    ],
)
def test_version_at_least(version, minimum, expected):
    assert nvidia_smi.version_at_least(version, minimum) is expected


def test_query_command_runs_the_captured_query():
    argv = nvidia_smi.query_command("/usr/bin/nvidia-smi")
    assert argv == [
        "/usr/bin/nvidia-smi",
        "--query-gpu=index,uuid,name,memory.total,memory.used,driver_version,compute_cap,pci.bus_id,persistence_mode",
        "--format=csv,noheader,nounits",
    ]


# --- the module's probe, with run_command replaced ---------------------------------------------


def _load_module():
    """Import plugins/modules/nvidia_gpu_facts.py with its module_utils import satisfied."""
    pytest.importorskip("ansible")
    sys.modules.setdefault("ansible.module_utils.nvidia_smi", nvidia_smi)
    return load_source("nvidia_gpu_facts", REPO / "plugins" / "modules" / "nvidia_gpu_facts.py")


class FakeModule:
    def __init__(self, answers, params=None, nvidia_smi_path="/usr/bin/nvidia-smi"):
        self.params = {
            "nvidia_smi": None,
            "require": True,
            "mask_uuids": False,
            "proc_version_path": "/nonexistent",
            "proc_gpus_path": "/nonexistent",
            "sysfs_pci_path": "/nonexistent",
        }
        self.params.update(params or {})
        self.answers = answers
        self.calls = []
        self.path = nvidia_smi_path

    def get_bin_path(self, name, required=False, opt_dirs=None):
        return self.path

    def run_command(self, argv, environ_update=None):
        self.calls.append((argv, environ_update))
        return self.answers[argv[1]]


def test_probe_ok_runs_with_c_locale(tmp_path):
    module_code = _load_module()
    proc = tmp_path / "version"
    proc.write_text(fixture("errors", "proc-version-open-580.txt"))
    fake = FakeModule(
        {
            nvidia_smi.query_command()[1]: (0, fixture("h200", "query-gpu-nounits.csv"), ""),
            "-q": (0, fixture("h200", "nvidia-smi-q.txt"), ""),
        },
        params={"proc_version_path": str(proc)},
    )
    result = module_code.probe(fake)
    assert result["status"] == "ok"
    assert result["changed"] is False
    assert result["count"] == 1 and result["driver_version"] == "580.159.04" and result["cuda_version"] == "13.0"
    assert result["kernel_module"] == {"loaded": True, "version": "580.95.05", "open": True}
    assert all(env == {"LC_ALL": "C", "LANG": "C"} for dummy, env in fake.calls)


def _topology_tree(tmp_path, bus_ids):
    """/proc/driver/nvidia/gpus and /sys/bus/pci/devices for the given cards, as a 2-socket L40 host has them
    (constructed: the files' formats are the driver's and the kernel's; their values are made up)."""
    proc, sysfs = tmp_path / "proc-gpus", tmp_path / "sys-pci"
    for position, bus_id in enumerate(bus_ids):
        address = nvidia_smi.pci_address(bus_id)
        (proc / address).mkdir(parents=True)
        (proc / address / "information").write_text(
            "Model: \t\t NVIDIA L40\nIRQ:   \t\t 180\nGPU UUID: \t GPU-00000000-0000-0000-0000-000000000000\n"
            "Video BIOS: \t 95.02.5d.00.02\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n"
            "Bus Location: \t %s\nDevice Minor: \t %d\nGPU Excluded:\t No\n" % (address, 3 - position)
        )
        (sysfs / address).mkdir(parents=True)
        (sysfs / address / "numa_node").write_text("%d\n" % (position // 2))
        (sysfs / address / "local_cpulist").write_text("0-15,64-79\n" if position < 2 else "16-31,80-95\n")
    return {"proc_gpus_path": str(proc), "sysfs_pci_path": str(sysfs)}


def test_pci_address_is_what_sysfs_and_the_driver_name():
    assert nvidia_smi.pci_address("00000000:B1:00.0") == "0000:b1:00.0"
    assert nvidia_smi.pci_address("0000:17:00.0") == "0000:17:00.0"
    assert nvidia_smi.pci_address("N/A") is None and nvidia_smi.pci_address(None) is None


def test_probe_reads_each_cards_minor_numa_node_and_cpus(tmp_path):
    module_code = _load_module()
    bus_ids = [line.split(", ")[7] for line in fixture("l40", "query-gpu-nounits.csv").splitlines()]
    fake = FakeModule(
        {nvidia_smi.query_command()[1]: (0, fixture("l40", "query-gpu-nounits.csv"), ""), "-q": (0, "", "")},
        params=_topology_tree(tmp_path, bus_ids),
    )
    gpus = module_code.probe(fake)["gpus"]
    assert [(g["index"], g["minor"], g["numa_node"], g["cpus"]) for g in gpus] == [
        (0, 3, 0, "0-15,64-79"),
        (1, 2, 0, "0-15,64-79"),
        (2, 1, 1, "16-31,80-95"),
        (3, 0, 1, "16-31,80-95"),
    ]


def test_no_topology_where_the_host_does_not_say():
    gpu = {"pci_bus_id": "00000000:00:06.0"}
    assert nvidia_smi.topology(gpu, lambda kind, address: None) == {"minor": None, "numa_node": None, "cpus": None}
    no_numa = {"numa_node": "-1\n", "local_cpulist": "0-15\n", "information": "Device Minor: \t 0\n"}
    assert nvidia_smi.topology(gpu, lambda kind, address: no_numa[kind]) == {
        "minor": 0,
        "numa_node": None,
        "cpus": "0-15",
    }


def test_probe_missing_nvidia_smi():
    module_code = _load_module()
    result = module_code.probe(FakeModule({}, nvidia_smi_path=None))
    assert result["status"] == "missing"
    assert result["count"] == 0
    assert "not installed" in result["message"]


def test_probe_nvml_mismatch_says_reboot():
    module_code = _load_module()
    fake = FakeModule({nvidia_smi.query_command()[1]: (18, "", fixture("errors", "nvml-mismatch.txt"))})
    result = module_code.probe(fake)
    assert result["status"] == "nvml_mismatch"
    assert "reboot" in result["message"]
    assert "Driver/library version mismatch" in result["message"]
    assert result["nvml_library_version"] == "580.105"


def test_probe_unparsable_output_is_an_error_not_a_crash():
    module_code = _load_module()
    fake = FakeModule({nvidia_smi.query_command()[1]: (0, "garbage\n", "")})
    result = module_code.probe(fake)
    assert result["status"] == "error"
    assert "could not read nvidia-smi output" in result["message"]


# --- the role's data agrees with the parser and its own spec ------------------------------------


def test_role_catalog_knows_the_fixture_cards():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    names = {name: model for model, card in defaults["nvidia_driver_gpu_catalog"].items() for name in card["names"]}
    for folder, model in (("h200", "H200"), ("rtx4090", "RTX 4090"), ("l40", "L40")):
        facts = nvidia_smi.parse_gpus(fixture(folder, "query-gpu-nounits.csv"))
        assert {names[name] for name in facts["names"]} == {model}
        card = defaults["nvidia_driver_gpu_catalog"][model]
        assert facts["memory_mib_min"] == card["memory_mib"]
        assert facts["compute_caps"] == [card["compute_cap"]]
    for group, models in defaults["nvidia_driver_group_gpus"].items():
        assert set(models) <= set(defaults["nvidia_driver_gpu_catalog"]), group


def test_role_argument_specs_match_defaults():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    for entry in ("main", "check"):
        options = specs[entry]["options"]
        assert set(options) == set(defaults), entry
        for name, option in options.items():
            assert option.get("description"), name
            if "default" in option:
                assert option["default"] == defaults[name], name
