"""Detect the GPUs of this machine (NVML, else nvidia-smi) in the terms a hardware profile uses."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel

from specdeploy.errors import SpecdeployError
from specdeploy.recipes.schema import HardwareProfile

Interconnect = Literal["nvlink", "pcie", "none"]

# Runs a command and returns its stdout; raises OSError or CalledProcessError when it cannot.
CommandRunner = Callable[[list[str]], str]

NVIDIA_SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=name,memory.total,compute_cap,driver_version",
    "--format=csv,noheader",
]
NVIDIA_SMI_TOPOLOGY = ["nvidia-smi", "topo", "-m"]
NVIDIA_SMI_MEMORY_USED = ["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]

_INTERCONNECT_WORDS = {"nvlink": ", NVLink", "pcie": ", PCIe only: no NVLink", "none": ""}
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


class GpuInfo(BaseModel):
    name: str
    memory_bytes: int
    compute_capability: str  # "major.minor", as nvidia-smi prints it: "12.0", "10.0", "9.0"


class DetectedHardware(BaseModel):
    """What this machine has; `source` says how it was found ("nvml", "nvidia-smi" or "none")."""

    gpus: list[GpuInfo]
    interconnect: Interconnect
    driver_version: str | None
    source: str
    problem: str | None = None  # why no GPU was found, when none was

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def gpu_model(self) -> str | None:
        names = sorted({gpu.name for gpu in self.gpus})
        return " + ".join(names) if names else None

    @property
    def memory_bytes_per_gpu(self) -> int | None:
        """The smallest GPU's memory: tensor parallelism is limited by the smallest rank."""
        return min((gpu.memory_bytes for gpu in self.gpus), default=None)

    @property
    def compute_capability(self) -> str | None:
        capabilities = sorted({gpu.compute_capability for gpu in self.gpus})
        return capabilities[0] if len(capabilities) == 1 else None

    @property
    def sm(self) -> str | None:
        """The CUDA architecture name, e.g. "sm_120" for compute capability 12.0."""
        capability = self.compute_capability
        return f"sm_{capability.replace('.', '')}" if capability else None


def parse_gpu_query(text: str) -> tuple[list[GpuInfo], str | None]:
    """Parse `nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv,noheader`."""
    gpus: list[GpuInfo] = []
    drivers: set[str] = set()
    for line in text.strip().splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 4:
            raise ValueError(f"unexpected nvidia-smi query line (want 4 comma-separated fields): {line!r}")
        name, memory, capability, driver = fields
        memory_mib = int(memory.removesuffix("MiB").strip())
        gpus.append(GpuInfo(name=name, memory_bytes=memory_mib * 2**20, compute_capability=capability))
        drivers.add(driver)
    return gpus, (sorted(drivers)[0] if drivers else None)


def parse_memory_used(text: str) -> dict[int, int]:
    """Parse `nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits`: GPU index -> bytes."""
    used: dict[int, int] = {}
    for line in text.strip().splitlines():
        index, mib = (field.strip() for field in line.split(","))
        used[int(index)] = int(mib) * 2**20
    return used


def parse_topology(text: str) -> Interconnect:
    """Read `nvidia-smi topo -m`: "nvlink" when every GPU pair is joined by NVLink (NV#), else "pcie"."""
    lines = [_ANSI_ESCAPE.sub("", line) for line in text.splitlines()]
    header = next((line for line in lines if line.lstrip().startswith("GPU0")), None)
    if header is None:
        raise ValueError("no GPU column header in `nvidia-smi topo -m` output")
    columns = [column.strip() for column in header.strip().split("\t")]
    gpu_columns = [i for i, column in enumerate(columns) if re.fullmatch(r"GPU\d+", column)]
    if len(gpu_columns) < 2:
        return "none"
    links: list[str] = []
    for line in lines:
        cells = line.split("\t")
        if not re.fullmatch(r"GPU\d+", cells[0].strip()):
            continue
        row = [cell.strip() for cell in cells[1:]]
        links += [row[i] for i in gpu_columns if i < len(row) and row[i] != "X"]
    return "nvlink" if links and all(link.startswith("NV") for link in links) else "pcie"


def run_command(argv: list[str]) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30).stdout


def detect_with_nvidia_smi(run: CommandRunner = run_command) -> DetectedHardware:
    try:
        gpus, driver = parse_gpu_query(run(NVIDIA_SMI_QUERY))
    except FileNotFoundError:
        return _no_gpu("nvidia-smi is not installed (no NVIDIA driver on this machine)")
    except subprocess.CalledProcessError as exc:
        reason = (exc.stderr or exc.stdout or "").strip().splitlines()
        return _no_gpu(f"nvidia-smi failed: {reason[0] if reason else f'exit status {exc.returncode}'}")
    if not gpus:
        return _no_gpu("nvidia-smi lists no GPU")
    interconnect = parse_topology(run(NVIDIA_SMI_TOPOLOGY)) if len(gpus) > 1 else "none"
    return DetectedHardware(gpus=gpus, interconnect=interconnect, driver_version=driver, source="nvidia-smi")


def detect_with_nvml(nvml) -> DetectedHardware:
    """Query NVML (the `pynvml` module of nvidia-ml-py, or anything with its API)."""
    nvml.nvmlInit()
    try:
        gpus: list[GpuInfo] = []
        all_nvlink = True
        count = nvml.nvmlDeviceGetCount()
        for index in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            name = nvml.nvmlDeviceGetName(handle)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            total = nvml.nvmlDeviceGetMemoryInfo(handle).total
            gpus.append(
                GpuInfo(
                    name=name.decode() if isinstance(name, bytes) else name,
                    memory_bytes=int(total),
                    compute_capability=f"{major}.{minor}",
                )
            )
            all_nvlink = all_nvlink and _has_active_nvlink(nvml, handle)
        driver = nvml.nvmlSystemGetDriverVersion()
    finally:
        nvml.nvmlShutdown()
    interconnect: Interconnect = "none" if count < 2 else ("nvlink" if all_nvlink else "pcie")
    return DetectedHardware(
        gpus=gpus,
        interconnect=interconnect,
        driver_version=driver.decode() if isinstance(driver, bytes) else driver,
        source="nvml",
    )


def _has_active_nvlink(nvml, handle) -> bool:
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED:
                return True
        except nvml.NVMLError:
            # Links past the device's last one, or GPUs without NVLink at all, answer "not supported".
            continue
    return False


def _no_gpu(problem: str) -> DetectedHardware:
    return DetectedHardware(gpus=[], interconnect="none", driver_version=None, source="none", problem=problem)


def detect_hardware(run: CommandRunner = run_command) -> DetectedHardware:
    """NVML when nvidia-ml-py is installed and a driver answers; otherwise nvidia-smi; otherwise no GPU."""
    try:
        import pynvml  # optional: nvidia-ml-py
    except ImportError:
        return detect_with_nvidia_smi(run)
    try:
        return detect_with_nvml(pynvml)
    except pynvml.NVMLError:
        return detect_with_nvidia_smi(run)


def profile_for(hardware: DetectedHardware, shipped: list[HardwareProfile]) -> HardwareProfile:
    """`--hardware auto`: the shipped profile that describes this machine, else one made from what was found."""
    if not hardware.gpus:
        return next(
            profile for profile in shipped if profile.engine == "reference" and profile.device == "cpu"
        )
    for profile in shipped:
        if (
            profile.gpu_model == hardware.gpu_model
            and profile.gpu_count == hardware.gpu_count
            and profile.compute_capability == hardware.compute_capability
            and profile.interconnect == hardware.interconnect
        ):
            return profile
    if hardware.compute_capability is None:
        raise SpecdeployError(
            f"this machine mixes GPU models ({hardware.gpu_model}); restrict it to one model with "
            "CUDA_VISIBLE_DEVICES, or pass a profile with --hardware"
        )
    slug = re.sub(r"[^a-z0-9]+", "-", str(hardware.gpu_model).lower()).strip("-")
    memory_mib = (hardware.memory_bytes_per_gpu or 0) // 2**20
    return HardwareProfile(
        name=f"detected-{slug}-x{hardware.gpu_count}",
        description=(
            f"{hardware.gpu_count}x {hardware.gpu_model} ({memory_mib * 2**20 / 1e9:.0f} GB each, {hardware.sm})"
            f"{_INTERCONNECT_WORDS[hardware.interconnect]}, as detected"
        ),
        engine="sglang",
        gpu_model=hardware.gpu_model,
        gpu_count=hardware.gpu_count,
        memory_mib=memory_mib,
        compute_capability=hardware.compute_capability,
        interconnect=hardware.interconnect,
    )
