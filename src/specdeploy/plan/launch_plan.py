"""LaunchPlan: everything needed to start one inference server, decided before anything is downloaded."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from specdeploy.modes import Budget, Mode

# 2: engine.install (steps run at every container start) became engine.build (an image built once),
# memory.tree_buffers_per_gpu and api_key_env were added.
PLAN_SCHEMA = 2

EngineName = Literal["sglang", "reference"]
ModelRole = Literal["target", "drafter"]
Interconnect = Literal["nvlink", "pcie", "none"]

SGLANG_LAUNCH = ("python", "-m", "sglang.launch_server")
REFERENCE_LAUNCH = ("specdeploy", "serve")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ImageBuild(_Frozen):
    """An image specdeploy builds once per host (an unreleased SGLang build): everything its Dockerfile says."""

    base: str  # FROM: the release image, tag@digest once locked
    repo: str
    pull_request: int
    commit: str
    source_dir: str  # where the source is checked out inside the image
    # name==version pins (from the lock) that the install may not move; empty: dependencies resolve at build
    constraints: list[str] = Field(default_factory=list)


class EngineSpec(_Frozen):
    """Which server runs the plan and exactly how to obtain it."""

    name: EngineName
    version: str
    # A pinned container tag or tag@digest (never `latest`); for a build, its content-addressed tag; None for
    # the reference engine, which runs in-process.
    image: str | None
    # A pip requirement (`sglang==0.5.23`) or `git+URL@COMMIT#subdirectory=...` for unreleased builds.
    source: str
    build: ImageBuild | None = None  # set when `image` is built here rather than pulled


class ModelRef(_Frozen):
    """A checkpoint the server loads: what preflight checks and the weight downloader fetches."""

    role: ModelRole
    path: str  # Hugging Face repo id, local directory, or `zoo:NAME` for the shipped tiny models
    revision: str | None  # None means unpinned; every plan then carries a warning saying so
    gated: bool
    disk_bytes: int
    access_url: str | None = None  # where a gated repo's access is requested


class GpuRequirement(_Frozen):
    """The hardware the plan was made for; preflight compares the real machine against it."""

    profile: str
    gpu_model: str | None  # None for the CPU profile
    count: int
    memory_bytes_per_gpu: int
    compute_capability: str | None  # e.g. "12.0"; None for the CPU profile
    interconnect: Interconnect
    nnodes: int = 1
    # The Kubernetes RDMA resource each pod of a multi-node plan requests; None for one node or sockets only
    rdma_resource: str | None = None


class MemoryTable(_Frozen):
    """Per-GPU memory budget; all sizes in bytes."""

    gpu_memory: int
    weights_per_gpu: int
    drafter_per_gpu: int
    recurrent_state_per_gpu: int = 0  # Gated DeltaNet / Mamba state of all running requests
    cuda_graph_reserve: int
    # Triton's CUDA-graph tree-verify buffers (full-tree DDTree), part of the reserve above
    tree_buffers_per_gpu: int = 0
    activation_reserve: int
    kv_bytes_per_token: int  # per GPU: the target's share plus the drafter's
    kv_budget_per_gpu: int
    kv_tokens_fit: int
    full_length_requests: int = 0  # requests of the full context length whose KV fits at once
    mem_fraction_static: float | None  # None for the reference engine, which has no static pool
    # What SGLang 0.5.23 itself keeps outside the static pool at this plan's batch (plan/headroom.py), and
    # the prefill chunk behind it; 0 for the reference engine
    sglang_reserve: int = 0
    prefill_chunk_tokens: int = 0

    @property
    def headroom(self) -> int:
        """Bytes per GPU outside the static pool (weights + KV): CUDA graphs, activations, the runtime."""
        if self.mem_fraction_static is None:
            return 0
        return self.gpu_memory - int(self.gpu_memory * self.mem_fraction_static)


class Reason(_Frozen):
    """One hardware- or mode-specific choice in the argv/env and why it was made."""

    choice: str  # the flag or variable as it appears, e.g. "--attention-backend triton"
    why: str


class LaunchPlan(_Frozen):
    """A server launch, fully decided: argv, env, image, memory budget, warnings and the reasons."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, serialize_by_alias=True)

    schema_version: int = Field(PLAN_SCHEMA, alias="schema")
    recipe: str
    hardware: str
    mode: Mode
    budget: Budget | None = None  # DDTree node budget or auto; None for other modes
    tp: int
    engine: EngineSpec
    argv: list[str]  # starts with `python -m sglang.launch_server` or `specdeploy serve`
    env: dict[str, str]
    host: str
    port: int
    models: list[ModelRef]
    gpus: GpuRequirement
    memory: MemoryTable
    warnings: list[str]
    reasons: list[Reason]
    summary: str = ""  # one line: what runs where
    # The environment variable the server reads its API key from at launch; None: no key required.
    api_key_env: str | None = None

    @property
    def launcher_prefix(self) -> tuple[str, ...]:
        return SGLANG_LAUNCH if self.engine.name == "sglang" else REFERENCE_LAUNCH

    @property
    def server_args(self) -> list[str]:
        """The argv after the launcher (what SGLang's `prepare_server_args` parses)."""
        return self.argv[len(self.launcher_prefix) :]

    @property
    def drafter(self) -> ModelRef | None:
        return next((m for m in self.models if m.role == "drafter"), None)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def to_json_dict(self) -> dict:
        """The `--format json` document (schema 1)."""
        return self.model_dump(mode="json", by_alias=True)
