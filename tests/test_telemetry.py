"""NVML telemetry of a bench cell, through an injected fake NVML: sampled values, energy, tokens per joule,
$ per million tokens, and every way telemetry can be absent without failing the cell."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from specdeploy.bench import runner
from specdeploy.bench.fakeserver import FakeServer, ServerThread, StreamPlan
from specdeploy.bench.runner import run
from specdeploy.bench.runs import load_series
from specdeploy.bench.telemetry import CellSampler, cell_sampler, load_nvml
from specdeploy.report.rows import report_rows
from tests.test_bench_runner import config, custom_prompts

LOCAL = "http://127.0.0.1:30000"


class FakeNvml:
    """pynvml's API for two GPUs: GPU 0 has an energy counter, GPU 1 none (power samples integrate)."""

    NVML_CLOCK_SM = 1

    class NVMLError(Exception):
        pass

    def __init__(self, fail_init: bool = False, gpus: int = 2) -> None:
        self.fail_init = fail_init
        self.count = gpus
        self.energy_reads = 0
        self.shut = False

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        if handle == 1:
            raise self.NVMLError("Not Supported")
        self.energy_reads += 1
        return 1_000_000 if self.energy_reads == 1 else 1_500_000  # mJ: 500 J over the cell

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return 300_000  # mW

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return SimpleNamespace(gpu=90, memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(used=3 << 30)


def test_a_cell_is_sampled_and_energy_turns_into_tokens_per_joule_and_dollars() -> None:
    nvml = FakeNvml()
    started = time.monotonic()
    with CellSampler(LOCAL, nvml, interval_s=0.01, price_per_gpu_hour=2.0) as sampler:
        time.sleep(0.1)
    wall = time.monotonic() - started
    result = sampler.result(output_tokens=1000, duration_s=36.0)
    assert nvml.shut and result.absent is None
    counter, integrated = result.gpus
    assert counter.samples >= 3 and counter.power_w_mean == 300 and counter.sm_clock_mhz_mean == 1980
    assert (counter.gpu_util_pct_mean, counter.memory_util_pct_mean, counter.memory_used_mib_max) == (
        90,
        40,
        3072,
    )
    assert (counter.energy_j, counter.energy_source) == (500.0, "counter")  # (1,500,000 - 1,000,000) mJ
    # No counter: 300 W over the span between the first and last sample, which lies within the block.
    assert integrated.energy_source == "power samples"
    assert 0 < integrated.energy_j <= 300 * wall
    assert result.energy_j == pytest.approx(500 + integrated.energy_j)
    assert result.tokens_per_joule == pytest.approx(1000 / result.energy_j)
    # 2 GPUs x $2/h x 36 s = $0.04 for 1000 tokens: $40 per million.
    assert result.usd_per_million_tokens == pytest.approx(40.0)


@pytest.mark.parametrize(
    ("sampler", "reason"),
    [
        (CellSampler(LOCAL, FakeNvml(fail_init=True)), "NVML failed: Driver Not Loaded"),
        (CellSampler(LOCAL, FakeNvml(gpus=0)), "NVML sees no GPU"),
        (CellSampler("http://10.1.2.3:30000", FakeNvml()), "not on this machine"),
        (CellSampler(LOCAL, None, "nvidia-ml-py is not installed"), "nvidia-ml-py is not installed"),
    ],
)
def test_absent_telemetry_says_why(sampler: CellSampler, reason: str) -> None:
    with sampler:
        pass
    result = sampler.result(output_tokens=10, duration_s=1.0)
    assert reason in (result.absent or "") and result.gpus == [] and result.tokens_per_joule is None


def test_without_nvidia_ml_py_the_reason_names_the_package() -> None:
    nvml, why = load_nvml()
    if nvml is not None:
        pytest.skip("nvidia-ml-py is installed here")
    assert "nvidia-ml-py" in (why or "")
    assert "nvidia-ml-py" in (cell_sampler(LOCAL).result(1, 1.0).absent or "")


def test_every_cell_of_a_run_records_telemetry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        runner, "cell_sampler", lambda url, price: CellSampler(url, FakeNvml(), None, 0.005, price)
    )
    server = ServerThread(FakeServer(StreamPlan(ttft_s=0.01, gap_s=0.01, output_tokens=8))).start()
    try:
        summary = run(
            config(
                server.url, custom_prompts(tmp_path, 2), concurrency=[2], repeats=2, price_per_gpu_hour=3.0
            ),
            tmp_path / "run",
        )
    finally:
        server.stop()
    assert len(summary.cells) == 2  # one point, two repeats
    for cell in summary.cells.values():
        telemetry = cell.telemetry
        assert telemetry is not None and telemetry.absent is None and len(telemetry.gpus) == 2
        assert telemetry.tokens_per_joule == pytest.approx(cell.metrics.output_tokens / telemetry.energy_j)
        expected = 3.0 * 2 * cell.metrics.duration_s / 3600 / cell.metrics.output_tokens * 1e6
        assert telemetry.usd_per_million_tokens == pytest.approx(expected)
    # The report pools a point's repeats: all their tokens over all their joules.
    rows = report_rows(load_series([tmp_path / "run"]))
    assert [r.load_label for r in rows] == ["c=2"], rows
    row = rows[0]
    cells = list(summary.cells.values())
    joules = sum(c.telemetry.energy_j for c in cells if c.telemetry and c.telemetry.energy_j)
    assert row.tokens_per_joule == pytest.approx(sum(c.metrics.output_tokens for c in cells) / joules)
    assert row.power_w_mean == pytest.approx(600.0)  # two GPUs at 300 W
