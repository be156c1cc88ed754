"""Per-GPU memory budget: weights, drafter, recurrent state, CUDA graphs, and the KV tokens that fit."""

from __future__ import annotations

import math
from dataclasses import dataclass

from specdeploy.errors import SpecdeployError
from specdeploy.plan.launch_plan import MemoryTable
from specdeploy.recipes.schema import HardwareProfile, ModelFacts, TargetFacts

GIB = 1 << 30
MIB = 1 << 20
# Heuristics (not measured here): CUDA-graph private pools grow with the captured batch size, and
# speculative modes capture both draft and verify graphs.
GRAPH_BASE_BYTES = 512 * MIB
GRAPH_BYTES_PER_BATCH = 32 * MIB
# CUDA context, NCCL buffers and allocator slack, plus prefill activations for one chunk of this many tokens.
RUNTIME_BASE_BYTES = 2 * GIB
PREFILL_CHUNK_TOKENS = 8192
ACTIVATION_COPIES = 16  # live hidden-sized tensors per prefill token (MLP intermediates, residuals, logits)
# SGLang's own automatic value stays at or below this on large GPUs; above it fragmentation bites.
MAX_MEM_FRACTION = 0.92
MIN_MEM_FRACTION = 0.5
# The reference engine computes in fp32 on CPU: twice the bf16 bytes of the checkpoint.
REFERENCE_DTYPE_FACTOR = 2
REFERENCE_RUNTIME_BYTES = 256 * MIB


def gib(n: float) -> str:
    """A size for people: GiB from one GiB up, MiB below (the zoo's models weigh megabytes)."""
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"


@dataclass(frozen=True)
class Workload:
    tp: int
    context_length: int
    max_running_requests: int
    cuda_graph_max_bs: int | None  # None: no CUDA graphs (reference engine)
    speculative: bool
    tree_buffers: int = 0  # triton's tree-verify graph buffers per GPU (full-tree DDTree)
    dtype_factor: int = 1  # bytes held per checkpoint byte: REFERENCE_DTYPE_FACTOR for fp32 on a CPU
    kv_fp8: bool = False  # the target's KV pool in fp8_e4m3: one byte per value instead of bf16's two


def weights_per_gpu(model: ModelFacts, tp: int) -> int:
    return model.replicated_bytes + math.ceil((model.disk_bytes - model.replicated_bytes) / tp)


def kv_bytes_per_gpu(model: ModelFacts, tp: int) -> int:
    """KV heads split across TP ranks; with more ranks than heads (and for MLA's one latent) they replicate."""
    heads_per_gpu = max(1, model.kv_heads // tp)
    return model.kv_bytes_per_token * heads_per_gpu // model.kv_heads


def _reserves(target: TargetFacts, work: Workload) -> tuple[int, int]:
    """(CUDA-graph reserve, runtime and activation reserve) per GPU."""
    if work.cuda_graph_max_bs is None:
        return 0, REFERENCE_RUNTIME_BYTES
    graphs = (GRAPH_BASE_BYTES + GRAPH_BYTES_PER_BATCH * work.cuda_graph_max_bs) * (
        2 if work.speculative else 1
    ) + work.tree_buffers
    activations = RUNTIME_BASE_BYTES + ACTIVATION_COPIES * target.hidden * PREFILL_CHUNK_TOKENS * 2
    return graphs, activations


def budget_memory(
    target: TargetFacts,
    drafter: ModelFacts | None,
    hardware: HardwareProfile,
    work: Workload,
    recipe_name: str,
) -> MemoryTable:
    """The table, or a SpecdeployError that shows the arithmetic when the model does not fit."""
    reference = work.cuda_graph_max_bs is None
    factor = work.dtype_factor
    gpu = hardware.memory_bytes
    graphs, activations = _reserves(target, work)
    if reference:
        fraction = None
        usable = gpu - activations
    else:
        fraction = math.floor((gpu - graphs - activations) / gpu * 100) / 100
        fraction = min(MAX_MEM_FRACTION, fraction)
        if fraction < MIN_MEM_FRACTION:
            raise SpecdeployError(
                f"{hardware.name}: CUDA graphs ({gib(graphs)}) and activations ({gib(activations)}) leave less "
                f"than half of the {gib(gpu)} per GPU for weights and KV cache: lower --max-running-requests"
            )
        usable = int(gpu * fraction)
    weights = weights_per_gpu(target, work.tp) * factor
    draft_weights = weights_per_gpu(drafter, work.tp) * factor if drafter else 0
    recurrent = (
        math.ceil(target.recurrent_state_bytes_per_request / work.tp) * work.max_running_requests * factor
    )
    kv_budget = usable - weights - draft_weights - recurrent
    target_kv = kv_bytes_per_gpu(target, work.tp) // (2 if work.kv_fp8 else 1)
    per_token = (target_kv + (kv_bytes_per_gpu(drafter, work.tp) if drafter else 0)) * factor
    tokens = max(0, kv_budget) // per_token
    if tokens < work.context_length:
        raise SpecdeployError(
            _does_not_fit(
                recipe_name, hardware, work, usable, fraction, weights, draft_weights, recurrent, tokens
            )
        )
    if reference:  # static caches: every running request gets the whole context, allocated at start-up
        reserved = work.max_running_requests * work.context_length
        if reserved > tokens:
            raise SpecdeployError(
                f"{recipe_name} on {hardware.name}: the reference engine's static caches hold "
                f"{work.max_running_requests} requests x {work.context_length} positions = "
                f"{gib(reserved * per_token)}, more than the {gib(kv_budget)} left beside the weights: lower "
                "--max-running-requests or --context-length"
            )
        tokens, kv_budget = reserved, reserved * per_token
    return MemoryTable(
        gpu_memory=gpu,
        weights_per_gpu=weights,
        drafter_per_gpu=draft_weights,
        recurrent_state_per_gpu=recurrent,
        cuda_graph_reserve=graphs,
        tree_buffers_per_gpu=work.tree_buffers,
        activation_reserve=activations,
        kv_bytes_per_token=per_token,
        kv_budget_per_gpu=kv_budget,
        kv_tokens_fit=tokens,
        full_length_requests=tokens // work.context_length,
        mem_fraction_static=fraction,
    )


def _does_not_fit(
    recipe_name: str,
    hardware: HardwareProfile,
    work: Workload,
    usable: int,
    fraction: float | None,
    weights: int,
    draft_weights: int,
    recurrent: int,
    tokens: int,
) -> str:
    share = (
        f"{fraction:.2f} x {gib(hardware.memory_bytes)}"
        if fraction
        else f"{gib(hardware.memory_bytes)} less runtime"
    )
    need = weights + draft_weights + recurrent
    parts = f"weights {gib(weights)} + drafter {gib(draft_weights)}"
    if recurrent:
        parts += f" + recurrent state {gib(recurrent)} ({work.max_running_requests} requests)"
    if need >= usable:
        gpus_needed = math.ceil(need * work.tp / usable)
        # Attention heads split evenly only over power-of-two TP sizes.
        tp_needed = 1 << (gpus_needed - 1).bit_length()
        return (
            f"{recipe_name} does not fit on {hardware.name} at TP{work.tp}: per GPU {parts} = {gib(need)} > "
            f"{gib(usable)} usable ({share}); the weights alone need at least {gpus_needed} GPUs of this size, "
            f"so TP{tp_needed}: use a profile with that many GPUs (or larger ones), or --tp {tp_needed} if "
            "this one has them"
        )
    return (
        f"{recipe_name} on {hardware.name} at TP{work.tp}: after {parts} the KV cache holds {tokens} tokens per "
        f"GPU, fewer than one request of --context-length {work.context_length}: lower --context-length "
        f"to {tokens} or less, lower --max-running-requests, or use more GPUs"
    )
