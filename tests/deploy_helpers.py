"""Plans, hardware and recorded nvidia-smi outputs shared by the deploy tests."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from specdeploy.deploy.hardware import NVIDIA_SMI_MEMORY_USED, NVIDIA_SMI_TOPOLOGY
from specdeploy.plan.launch_plan import EngineSpec, GpuRequirement, LaunchPlan, MemoryTable, ModelRef

FIXTURES = Path(__file__).parent / "fixtures"
NVIDIA_SMI = FIXTURES / "nvidia_smi"
FAKE_SERVER = FIXTURES / "fake_sglang_server.py"
GB = 10**9

PROFILES = {
    "rtx-pro-6000-x8": GpuRequirement(
        profile="rtx-pro-6000-x8",
        gpu_model="NVIDIA RTX PRO 6000 Blackwell Server Edition",
        count=8,
        memory_bytes_per_gpu=96 * 2**30,
        compute_capability="12.0",
        interconnect="pcie",
    ),
    "b200-x8": GpuRequirement(
        profile="b200-x8",
        gpu_model="NVIDIA B200",
        count=8,
        memory_bytes_per_gpu=180 * GB,
        compute_capability="10.0",
        interconnect="nvlink",
    ),
    "h200-x8": GpuRequirement(
        profile="h200-x8",
        gpu_model="NVIDIA H200",
        count=8,
        memory_bytes_per_gpu=141 * GB,
        compute_capability="9.0",
        interconnect="nvlink",
    ),
    "cpu": GpuRequirement(
        profile="cpu",
        gpu_model=None,
        count=0,
        memory_bytes_per_gpu=0,
        compute_capability=None,
        interconnect="none",
    ),
}

KIMI_MODELS = [
    ModelRef(role="target", path="moonshotai/Kimi-K2.6", revision="abc123", gated=False, disk_bytes=595 * GB),
    ModelRef(
        role="drafter",
        path="z-lab/Kimi-K2.6-DFlash",
        revision=None,
        gated=True,
        disk_bytes=7 * GB,
        access_url="https://huggingface.co/z-lab/Kimi-K2.6-DFlash",
    ),
]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def make_plan(
    profile: str = "rtx-pro-6000-x8",
    models: list[ModelRef] | None = None,
    argv: list[str] | None = None,
    port: int = 30000,
    engine: str = "sglang",
    mode: str = "dflash",
) -> LaunchPlan:
    gpus = PROFILES[profile]
    default_argv = ["python", "-m", "sglang.launch_server", "--model-path", "moonshotai/Kimi-K2.6"]
    return LaunchPlan(
        recipe="kimi-k2.6",
        hardware=profile,
        mode=mode,
        tp=max(gpus.count, 1),
        engine=EngineSpec(
            name=engine,
            version="0.5.23",
            image="lmsysorg/sglang:v0.5.23-cu130" if engine == "sglang" else None,
            source="sglang==0.5.23",
        ),
        argv=argv or [*default_argv, "--host", "127.0.0.1", "--port", str(port)],
        env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"},
        host="127.0.0.1",
        port=port,
        models=KIMI_MODELS if models is None else models,
        gpus=gpus,
        memory=MemoryTable(
            gpu_memory=gpus.memory_bytes_per_gpu,
            weights_per_gpu=75 * GB,
            drafter_per_gpu=1 * GB,
            cuda_graph_reserve=2 * GB,
            activation_reserve=2 * GB,
            kv_bytes_per_token=70272,
            kv_budget_per_gpu=10 * GB,
            kv_tokens_fit=142000,
            mem_fraction_static=0.9,
        ),
        warnings=[],
        reasons=[],
    )


def fake_server_plan(port: int, *server_flags: str, engine: str = "reference") -> LaunchPlan:
    """A CPU plan whose argv starts the fake SGLang server (run by the local or the docker launcher).

    The engine is "reference" by default so that preflight does not look for SGLang; docker needs "sglang"
    for the plan to name an image.
    """
    argv = [sys.executable, str(FAKE_SERVER), "--port", str(port), *server_flags]
    return make_plan(profile="cpu", models=[], argv=argv, port=port, engine=engine)


def recorded_nvidia_smi(name: str, memory_used: str = "memory-used"):
    """A command runner that answers nvidia-smi with the outputs recorded on machine `name`."""

    def run(argv: list[str]) -> str:
        if name == "no-gpu":
            stderr = (NVIDIA_SMI / "no-gpu.stderr.txt").read_text()
            raise subprocess.CalledProcessError(9, argv, output="", stderr=stderr)
        if argv == NVIDIA_SMI_MEMORY_USED:
            return (NVIDIA_SMI / f"{name}.{memory_used}.csv").read_text()
        suffix = "topo.txt" if argv == NVIDIA_SMI_TOPOLOGY else "query.csv"
        return (NVIDIA_SMI / f"{name}.{suffix}").read_text()

    return run
