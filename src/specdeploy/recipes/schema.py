"""The shape of recipe data: model pairs (target + drafters + facts) and hardware profiles."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

EngineName = Literal["sglang", "reference"]
AttentionKind = Literal["mla", "gqa", "hybrid"]
Interconnect = Literal["nvlink", "pcie", "none"]
ReferenceDevice = Literal["cpu", "cuda"]
MIB = 1 << 20


class _Data(BaseModel):
    # Typos in a TOML key must fail loudly instead of silently falling back to a default.
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelFacts(_Data):
    """A checkpoint and the numbers the memory budget needs; sizes in bytes."""

    path: str  # Hugging Face repo id, or `zoo:NAME` for the shipped tiny models
    revision: str | None = None  # a commit hash; absent in TOML means unpinned (every plan warns)
    gated: bool = False
    access_url: str | None = None  # where access to a gated repo is requested
    architecture: str
    parameters: int = Field(gt=0)
    disk_bytes: int = Field(gt=0)
    # Weights every tensor-parallel rank holds in full (replicated projections, norms); the rest is sharded.
    replicated_bytes: int = Field(default=0, ge=0)
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    kv_heads: int = Field(gt=0)  # MLA: 1 (its latent KV is replicated on every rank)
    kv_bytes_per_token: int = Field(ge=0)  # whole model, bf16, all layers
    quantization: str
    unverified: list[str] = Field(default_factory=list)  # facts nobody here has confirmed
    # What a deployer must know about this checkpoint; plans that load it repeat them as warnings.
    notes: list[str] = Field(default_factory=list)
    # The checkpoint's config.json, as far as SGLang's start-up resolution reads it (`plan --check`)
    hf_config: dict[str, Any] | None = None

    @property
    def is_zoo(self) -> bool:
        return self.path.startswith("zoo:")


class TargetFacts(ModelFacts):
    attention: AttentionKind
    context_length: int = Field(gt=0)  # the longest context the model supports
    # Recurrent (Gated DeltaNet / Mamba) state one running request holds, whole model; 0 for pure attention.
    recurrent_state_bytes_per_request: int = Field(default=0, ge=0)
    # MoE: routed experts per MoE layer and how many each token picks (absent for a dense target).
    routed_experts: int | None = Field(default=None, ge=1)
    experts_per_token: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _experts_go_together(self) -> TargetFacts:
        if (self.routed_experts is None) != (self.experts_per_token is None):
            raise ValueError("routed_experts and experts_per_token go together (both or none)")
        if self.routed_experts is not None and self.experts_per_token > self.routed_experts:
            raise ValueError("experts_per_token exceeds routed_experts")
        return self


class DFlashDrafterFacts(ModelFacts):
    block_size: int = Field(ge=2)
    trained_for: str  # the target repo this drafter was trained against
    draft_window_size: int | None = Field(default=None, gt=0)  # recommended sliding window, tokens


class Eagle3DrafterFacts(ModelFacts):
    trained_for: str
    num_steps: int = Field(ge=1)
    topk: int = Field(ge=1)
    num_draft_tokens: int = Field(ge=2)


class ThinkingSwitch(_Data):
    """A target that thinks before it answers, and the chat-template argument that turns it off."""

    kwarg: str  # the chat_template_kwargs key: `thinking` (Kimi K2.x), `enable_thinking` (Qwen3)
    default: bool = True  # what the chat template does when the key is absent


class Recipe(_Data):
    """A model pair: the target, its DFlash drafter, optionally an EAGLE3 drafter, and serving defaults."""

    name: str
    description: str
    engine: EngineName
    target: TargetFacts
    dflash: DFlashDrafterFacts
    eagle3: Eagle3DrafterFacts | None = None
    trust_remote_code: bool = False
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    default_context_length: int = Field(gt=0)
    default_max_running_requests: int = Field(gt=0)
    # Tokens a typical request of this pair holds (prompt + output, thinking included): SGLang plans size
    # --max-running-requests from the KV pool at this length; None: default_max_running_requests as it is.
    working_context_length: int | None = Field(default=None, gt=0)
    known_issues: list[str] = Field(default_factory=list)  # repeated as warnings in every plan
    # Set for thinking models: bench and campaign then refuse to run without a thinking setting.
    thinking: ThinkingSwitch | None = None

    @model_validator(mode="after")
    def _defaults_fit_the_model(self) -> Recipe:
        if self.default_context_length > self.target.context_length:
            raise ValueError(
                f"default_context_length {self.default_context_length} exceeds the target's "
                f"context_length {self.target.context_length}"
            )
        return self


class Fabric(_Data):
    """How nodes of this machine reach each other for multi-node serving (NCCL over RDMA or sockets)."""

    # NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME: the interface of the node-to-node network (bootstrap, sockets)
    socket_ifname: str
    # NCCL_IB_HCA: the RDMA adapters NCCL may use; None: sockets only (no InfiniBand / RoCE)
    ib_hca: str | None = None
    # The Kubernetes extended resource the RDMA device plugin exposes, requested once per pod
    rdma_resource: str | None = None


class HardwareProfile(_Data):
    """One machine: what GPUs, how many, how much memory, and how they are connected."""

    name: str
    description: str
    engine: EngineName  # which engine this machine runs: SGLang on GPUs, the reference engine on CPU
    gpu_model: str | None = None  # as nvidia-smi names it; None for the CPU profile
    gpu_count: int = Field(ge=0)
    memory_mib: int = Field(gt=0)  # per GPU as nvidia-smi reports it; host memory budget for CPU
    compute_capability: str | None = None  # "12.0", "10.0", "9.0"; None for CPU
    interconnect: Interconnect
    # Where the reference engine runs: "cuda" is any one CUDA GPU (its model is not checked).
    device: ReferenceDevice = "cpu"
    # Per-GPU peaks that `project --hardware` scales step costs by (datasheet figures, not measured).
    hbm_gb_s: float | None = Field(default=None, gt=0)  # memory bandwidth, GB/s
    bf16_dense_tflops: float | None = Field(default=None, gt=0)  # tensor-core BF16 without sparsity
    interconnect_gb_s: float | None = Field(default=None, gt=0)  # GPU-to-GPU, per GPU and direction
    allreduce_latency_us: float | None = Field(default=None, ge=0)  # one small all-reduce at gpu_count ranks
    price_per_gpu_hour: float | None = Field(default=None, ge=0)  # USD, for $ per million tokens
    fabric: Fabric | None = None  # None: the profile serves from one node only
    unverified: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _gpu_fields_agree(self) -> HardwareProfile:
        has_model = self.gpu_model is not None
        if has_model != (self.compute_capability is not None):
            raise ValueError("gpu_model and compute_capability go together (both or none)")
        if has_model != (self.engine == "sglang"):
            raise ValueError("SGLang profiles name their GPU model; reference-engine profiles name none")
        if self.engine == "sglang" and (self.gpu_count < 1 or self.device != "cpu"):
            raise ValueError("SGLang profiles have gpu_count >= 1 and no device (the reference engine's key)")
        if self.engine == "reference" and self.gpu_count != (self.device == "cuda"):
            raise ValueError("a reference-engine profile has gpu_count 1 with device cuda, 0 with device cpu")
        return self

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB

    @property
    def sm_major(self) -> int | None:
        return None if self.compute_capability is None else int(self.compute_capability.split(".")[0])

    @property
    def sm(self) -> str | None:
        """`sm_120` style name of the compute capability."""
        return None if self.compute_capability is None else "sm_" + self.compute_capability.replace(".", "")
