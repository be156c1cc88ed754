"""What SGLang 0.5.23 itself keeps outside the static pool, the floor a plan's headroom is held against.

A plan sets --mem-fraction-static, so SGLang skips its own sizing; this is that sizing, as
sglang/srt/arg_groups/memory_hook.py (`handle_gpu_memory_settings`, `reserve_for_graph_mb`) computes it, in MiB:
- the prefill chunk: SGLang's default for the GPU's memory (:88-170), since plans leave --chunked-prefill-size
  to it; activations 1.5 MiB per chunk token, at least 2048 tokens (:305, :310);
- 512 MiB of attention-backend metadata (:309) and 1 GiB per 8 ranks of TP x PP (:312);
- CUDA graphs (:357-399): 2 MiB per decode batch slot (:368); prefill graphs 1.5 GiB under MLA (:389), else
  8 MiB per captured prefill size, up to the chunk (:386, :233-236, sizes from
  cuda_graph_hook.py:480);
- its minimum of 10 GiB on GPUs over 60 GiB (:314-315) never binds at its default chunks (activations alone
  are 12 GiB there), so it is not repeated here.
Left out: multimodal targets' image-encoder allowance (:331-338; the plans serve text) and DeepEP buffers (:317;
no plan enables DeepEP).
"""

from __future__ import annotations

from dataclasses import dataclass

ACTIVATION_MIB_PER_TOKEN = 1.5
MIN_ACTIVATION_TOKENS = 2048
METADATA_MIB = 512
PARALLEL_MIB_PER_8_RANKS = 1024
DECODE_GRAPH_MIB_PER_BATCH = 2
MLA_PREFILL_GRAPHS_MIB = 1536
PREFILL_GRAPH_MIB_PER_SIZE = 8
# (GPU memory below this many MiB, SGLang's default --chunked-prefill-size there); larger GPUs get 16384.
DEFAULT_CHUNKS = ((20 * 1024, 2048), (35 * 1024, 4096), (60 * 1024, 4096), (160 * 1024, 8192))
LARGEST_GPU_CHUNK = 16384


@dataclass(frozen=True)
class SglangReserve:
    """SGLang's own reserve outside the static pool on one GPU, in MiB, part by part."""

    chunk_tokens: int
    activations: float
    metadata: float
    parallel: float
    graphs: float

    @property
    def total(self) -> float:
        return self.activations + self.metadata + self.parallel + self.graphs


def default_chunk_tokens(memory_mib: float) -> int:
    return next((chunk for below, chunk in DEFAULT_CHUNKS if memory_mib < below), LARGEST_GPU_CHUNK)


def prefill_capture_sizes(max_tokens: int) -> list[int]:
    """The prefill token counts SGLang captures a graph for, up to `max_tokens` (cuda_graph_hook.py:480)."""
    sizes = [
        *range(4, 33, 4),
        *range(48, 257, 16),
        *range(288, 513, 32),
        *range(576, 1025, 64),
        *range(1280, 4097, 256),
        *range(4608, max_tokens + 1, 512),
    ]
    return [size for size in sizes if size <= max_tokens]


def sglang_reserve(memory_mib: float, tp: int, decode_batch: int, mla: bool) -> SglangReserve:
    """SGLang 0.5.23's reserve for a GPU of `memory_mib`, at TP `tp` (one pipeline stage) and this decode batch."""
    chunk = default_chunk_tokens(memory_mib)
    if mla:
        prefill_graphs = MLA_PREFILL_GRAPHS_MIB
    else:
        prefill_graphs = PREFILL_GRAPH_MIB_PER_SIZE * len(prefill_capture_sizes(chunk))
    return SglangReserve(
        chunk_tokens=chunk,
        activations=ACTIVATION_MIB_PER_TOKEN * max(chunk, MIN_ACTIVATION_TOKENS),
        metadata=METADATA_MIB,
        parallel=tp / 8 * PARALLEL_MIB_PER_8_RANKS,
        graphs=DECODE_GRAPH_MIB_PER_BATCH * decode_batch + prefill_graphs,
    )
