"""GPU telemetry of a bench cell: NVML sampled in a background thread while the cell runs.

Power, SM clock, GPU and memory utilisation and memory used, every `interval_s`, on each GPU NVML sees
(the server's GPUs when it runs on this machine). Energy comes from NVML's energy counter where the GPU has
one, else from the power samples (trapezoids). Where there is no NVML (no nvidia-ml-py, no driver, no GPU,
a server on another machine), the cell records why, and nothing else changes.
"""

from __future__ import annotations

import threading
import time
from types import ModuleType
from typing import Any
from urllib.parse import urlparse

from pydantic import BaseModel

DEFAULT_INTERVAL_S = 0.1
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}


class GpuTelemetry(BaseModel):
    index: int
    name: str
    samples: int
    power_w_mean: float | None
    power_w_max: float | None
    sm_clock_mhz_mean: float | None
    gpu_util_pct_mean: float | None
    memory_util_pct_mean: float | None
    memory_used_mib_max: float | None
    energy_j: float | None
    energy_source: str | None  # "counter" (nvmlDeviceGetTotalEnergyConsumption) or "power samples"


class CellTelemetry(BaseModel):
    """What a cell's GPUs did, or why nothing was recorded (`absent`)."""

    absent: str | None = None
    interval_s: float | None = None
    gpus: list[GpuTelemetry] = []
    energy_j: float | None = None
    tokens_per_joule: float | None = None
    price_per_gpu_hour: float | None = None
    usd_per_million_tokens: float | None = None


def load_nvml() -> tuple[ModuleType | None, str | None]:
    """The pynvml module, or why it cannot be used."""
    try:
        import pynvml  # optional: nvidia-ml-py (`pip install 'specdeploy[gpu]'`)
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install 'specdeploy[gpu]')"
    return pynvml, None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class _Gpu:
    def __init__(self, nvml: Any, index: int) -> None:
        self.nvml = nvml
        self.index = index
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = nvml.nvmlDeviceGetName(self.handle)
        self.name = name.decode() if isinstance(name, bytes) else str(name)
        self.times: list[float] = []
        self.power_w: list[float] = []
        self.sm_mhz: list[float] = []
        self.gpu_util: list[float] = []
        self.mem_util: list[float] = []
        self.mem_mib: list[float] = []
        self.energy_start_mj = self._energy_mj()

    def _energy_mj(self) -> int | None:
        try:
            return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except self.nvml.NVMLError:  # pre-Volta GPUs have no counter
            return None

    def _read(self, reading: list[float], call: Any, scale: float = 1.0) -> None:
        try:
            reading.append(float(call()) * scale)
        except self.nvml.NVMLError:
            pass  # a metric this GPU does not report: its mean stays None

    def sample(self) -> None:
        nvml, h = self.nvml, self.handle
        self.times.append(time.monotonic())
        self._read(self.power_w, lambda: nvml.nvmlDeviceGetPowerUsage(h), 1e-3)  # milliwatts
        self._read(self.sm_mhz, lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
        self._read(self.gpu_util, lambda: nvml.nvmlDeviceGetUtilizationRates(h).gpu)
        self._read(self.mem_util, lambda: nvml.nvmlDeviceGetUtilizationRates(h).memory)
        self._read(self.mem_mib, lambda: nvml.nvmlDeviceGetMemoryInfo(h).used, 1 / (1 << 20))

    def result(self) -> GpuTelemetry:
        energy, source = None, None
        end = self._energy_mj()
        if self.energy_start_mj is not None and end is not None:
            energy, source = (end - self.energy_start_mj) / 1e3, "counter"
        elif len(self.power_w) >= 2 and len(self.power_w) == len(self.times):
            pairs = zip(self.times, self.power_w, strict=True)
            steps = list(pairs)
            energy = sum(
                (t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(steps, steps[1:], strict=False)
            )
            source = "power samples"
        return GpuTelemetry(
            index=self.index,
            name=self.name,
            samples=len(self.times),
            power_w_mean=_mean(self.power_w),
            power_w_max=max(self.power_w, default=None),
            sm_clock_mhz_mean=_mean(self.sm_mhz),
            gpu_util_pct_mean=_mean(self.gpu_util),
            memory_util_pct_mean=_mean(self.mem_util),
            memory_used_mib_max=max(self.mem_mib, default=None),
            energy_j=energy,
            energy_source=source,
        )


class CellSampler:
    """`with CellSampler(url, nvml) as sampler: ...` around a cell; then `sampler.result(tokens, seconds)`."""

    def __init__(
        self,
        server_url: str,
        nvml: Any = None,
        why_absent: str | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        price_per_gpu_hour: float | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.price = price_per_gpu_hour
        self.nvml = nvml
        self.absent = why_absent
        self.gpus: list[_Gpu] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        host = urlparse(server_url).hostname or ""
        if self.absent is None and host not in LOCAL_HOSTS:
            self.absent = f"the server ({host}) is not on this machine: its GPUs cannot be sampled from here"

    def __enter__(self) -> CellSampler:
        if self.absent is None:
            try:
                self.nvml.nvmlInit()
                count = self.nvml.nvmlDeviceGetCount()
                self.gpus = [_Gpu(self.nvml, i) for i in range(count)]
            except self.nvml.NVMLError as exc:
                self.absent = f"NVML failed: {exc}"
            else:
                if not self.gpus:
                    self.absent = "NVML sees no GPU"
        if self.absent is None:
            self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            for gpu in self.gpus:
                gpu.sample()
            if self._stop.wait(self.interval_s):
                return

    def __exit__(self, *_: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            for gpu in self.gpus:
                gpu.sample()  # the cell's last moment, so that a short cell has two samples
            self.finished = [gpu.result() for gpu in self.gpus]
            self.nvml.nvmlShutdown()

    def result(self, output_tokens: int, duration_s: float) -> CellTelemetry:
        if self.absent is not None:
            return CellTelemetry(absent=self.absent)
        gpus = self.finished
        energies = [g.energy_j for g in gpus]
        energy = sum(e for e in energies if e is not None) if all(e is not None for e in energies) else None
        usd = None
        if self.price is not None and output_tokens > 0:
            usd = self.price * len(gpus) * duration_s / 3600 / output_tokens * 1e6
        return CellTelemetry(
            interval_s=self.interval_s,
            gpus=gpus,
            energy_j=energy,
            tokens_per_joule=output_tokens / energy if energy else None,
            price_per_gpu_hour=self.price,
            usd_per_million_tokens=usd,
        )


def cell_sampler(server_url: str, price_per_gpu_hour: float | None = None) -> CellSampler:
    """A sampler on this machine's NVML (or one that records why there is none)."""
    nvml, why = load_nvml()
    return CellSampler(server_url, nvml, why, price_per_gpu_hour=price_per_gpu_hour)
