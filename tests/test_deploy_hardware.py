import sys
from types import SimpleNamespace

import pytest
from deploy_helpers import NVIDIA_SMI, recorded_nvidia_smi

from specdeploy.deploy.hardware import (
    NVIDIA_SMI_TOPOLOGY,
    detect_hardware,
    detect_with_nvidia_smi,
    detect_with_nvml,
    parse_gpu_query,
    parse_topology,
    profile_for,
)
from specdeploy.recipes.loader import list_hardware


@pytest.mark.parametrize(
    ("machine", "count", "model", "capability", "sm", "interconnect", "memory_gib", "driver"),
    [
        (
            "rtx-pro-6000-x8",
            8,
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "12.0",
            "sm_120",
            "pcie",
            95.6,
            "580.95.05",
        ),
        ("b200-x8", 8, "NVIDIA B200", "10.0", "sm_100", "nvlink", 179.1, "570.133.20"),
        ("h200-x1", 1, "NVIDIA H200", "9.0", "sm_90", "none", 140.4, "550.127.05"),
    ],
)
def test_recorded_machines(machine, count, model, capability, sm, interconnect, memory_gib, driver):
    hardware = detect_with_nvidia_smi(recorded_nvidia_smi(machine))
    assert hardware.source == "nvidia-smi"
    assert hardware.gpu_count == count
    assert hardware.gpu_model == model
    assert hardware.compute_capability == capability
    assert hardware.sm == sm
    assert hardware.interconnect == interconnect
    assert hardware.memory_bytes_per_gpu / 2**30 == pytest.approx(memory_gib, abs=0.05)
    assert hardware.driver_version == driver


def test_single_gpu_does_not_ask_for_topology():
    calls = []

    def run(argv):
        calls.append(argv)
        return recorded_nvidia_smi("h200-x1")(argv)

    detect_with_nvidia_smi(run)
    assert NVIDIA_SMI_TOPOLOGY not in calls


def test_no_driver_is_reported_not_raised():
    hardware = detect_with_nvidia_smi(recorded_nvidia_smi("no-gpu"))
    assert hardware.gpu_count == 0 and hardware.driver_version is None
    assert "couldn't communicate with the NVIDIA driver" in hardware.problem


def test_no_nvidia_smi_binary():
    def run(argv):
        raise FileNotFoundError(argv[0])

    hardware = detect_with_nvidia_smi(run)
    assert hardware.source == "none" and "not installed" in hardware.problem


def test_partial_nvlink_counts_as_pcie():
    text = (
        (NVIDIA_SMI / "b200-x8.topo.txt")
        .read_text()
        .replace(
            "NV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tPIX", "SYS\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tPIX", 1
        )
    )
    assert parse_topology(text) == "pcie"


def test_malformed_query_line_is_an_error():
    with pytest.raises(ValueError, match="4 comma-separated"):
        parse_gpu_query("NVIDIA H200, 143771 MiB\n")


class FakeNvml:
    """The slice of the NVML API that detect_with_nvml uses: two H200 joined by NVLink."""

    NVML_NVLINK_MAX_LINKS = 18
    NVML_FEATURE_ENABLED = 1

    class NVMLError(Exception):
        pass

    def __init__(self, nvlink: bool):
        self.nvlink = nvlink
        self.shut_down = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shut_down = True

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA H200"

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return (9, 0)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=143771 * 2**20)

    def nvmlDeviceGetNvLinkState(self, handle, link):
        if not self.nvlink:
            raise self.NVMLError("Not Supported")
        return self.NVML_FEATURE_ENABLED

    def nvmlSystemGetDriverVersion(self):
        return "550.127.05"


@pytest.mark.parametrize(("nvlink", "interconnect"), [(True, "nvlink"), (False, "pcie")])
def test_nvml(nvlink, interconnect):
    nvml = FakeNvml(nvlink)
    hardware = detect_with_nvml(nvml)
    assert hardware.source == "nvml" and nvml.shut_down
    assert hardware.gpu_count == 2 and hardware.compute_capability == "9.0"
    assert hardware.interconnect == interconnect
    assert hardware.memory_bytes_per_gpu == 143771 * 2**20


@pytest.mark.parametrize(
    ("machine", "profile"),
    [
        ("rtx-pro-6000-x8", "rtx-pro-6000-x8"),
        ("b200-x8", "b200-x8"),
        ("h200-x1", "h200-x1"),
        ("no-gpu", "cpu"),
    ],
)
def test_auto_matches_shipped_profiles(machine, profile):
    hardware = detect_with_nvidia_smi(recorded_nvidia_smi(machine))
    assert profile_for(hardware, list_hardware()).name == profile


def test_auto_describes_an_unknown_machine():
    hardware = detect_with_nvidia_smi(recorded_nvidia_smi("b200-x8"))
    four = hardware.model_copy(update={"gpus": hardware.gpus[:4]})
    profile = profile_for(four, list_hardware())
    assert profile.name == "detected-nvidia-b200-x4"
    assert profile.description == "4x NVIDIA B200 (192 GB each, sm_100), NVLink, as detected"
    assert (profile.gpu_count, profile.memory_mib, profile.compute_capability, profile.interconnect) == (
        4,
        183359,
        "10.0",
        "nvlink",
    )


def test_detect_prefers_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(nvlink=True))
    assert detect_hardware(recorded_nvidia_smi("b200-x8")).source == "nvml"


def test_detect_falls_back_to_nvidia_smi_when_nvml_fails(monkeypatch):
    class BrokenNvml(FakeNvml):
        def nvmlInit(self):
            raise self.NVMLError("Driver Not Loaded")

    monkeypatch.setitem(sys.modules, "pynvml", BrokenNvml(nvlink=True))
    hardware = detect_hardware(recorded_nvidia_smi("b200-x8"))
    assert hardware.source == "nvidia-smi" and hardware.gpu_count == 8


def test_detect_without_nvidia_ml_py(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert detect_hardware(recorded_nvidia_smi("h200-x1")).gpu_model == "NVIDIA H200"
