"""Matrix-vector kernels: one row's dense projection (`linear_one_row`) and the tile the MoE kernels share.

At batch 1 a decoding step's projections each multiply one row by a weight matrix: reading the weight is all the
work. cuBLAS's kernels for one row of MLA's projections took about 6 us each on an H200, half the copy bandwidth
(`benchmarks/results/h200-2026-12-05-mla-fusions/`), and, not being Triton kernels, each broke the chain of
programmatic dependent launches (`triton_launch`) twice. `linear_one_row`, which every target family's one-row
projections take (`ops.linear`), is a Triton kernel in that chain, and loads its first weight tile before it waits
for the kernel before it (`_gemv_tile_waiting`, which the router's kernel uses too): the weights do not depend on
that kernel, so their load overlaps its end.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from specdeploy.engine.triton_launch import dependent_launch, launch_options


class GemvTiles(NamedTuple):
    """A matrix-vector kernel's launch shape: output columns per program, reduction tile, warps, pipeline stages."""

    block_n: int
    block_k: int
    warps: int
    stages: int


# One row's projection (`ops.linear`): 4 output columns a program and whole 2048-wide weight rows a load. On one
# H100 `benchmarks/one_row_linear_sweep.py` timed mla-moe-16b's projections at 4.58 us against 4.52 at the fastest
# tiles and 6.75 through cuBLAS, Kimi's at 20.63, the fastest, against 23.90
# (`benchmarks/results/gpu-2026-12-06-one-row-linear/`); None: F.linear (cuBLAS).
ONE_ROW_LINEAR: GemvTiles | None = GemvTiles(4, 2048, 4, 2)


@triton.jit
def _add_gemv_tiles(acc, rows, row_width, col_ok, vector_ptr, start, BLOCK_K: tl.constexpr):
    """acc [BLOCK_N, BLOCK_K] plus the float32 products of rows[:, k] and vector[k] for start <= k < row_width."""
    for k0 in range(start, row_width, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < row_width
        v = tl.load(vector_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
        m = tl.load(rows + kk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc += m.to(tl.float32) * v[None, :]
    return acc


@triton.jit
def _gemv_tile(w, row_width, col, col_ok, vector_ptr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """float32 sums over k < row_width of w[col, k] * vector[k] (rows of `row_width` contiguous values)."""
    rows = w + col[:, None].to(tl.int64) * row_width
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    return tl.sum(_add_gemv_tiles(acc, rows, row_width, col_ok, vector_ptr, 0, BLOCK_K), axis=1)


@triton.jit
def _gemv_tile_waiting(w, row_width, col, col_ok, vector_ptr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """`_gemv_tile` as a kernel's first reads: its first weight tile is loaded, then the kernel waits for the one
    before it (`dependent_launch`), then reads the vector. For weights no earlier kernel writes: their load overlaps
    that kernel's end."""
    kk = tl.arange(0, BLOCK_K)
    k_ok = kk < row_width
    rows = w + col[:, None].to(tl.int64) * row_width
    m = tl.load(rows + kk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
    dependent_launch()
    v = tl.load(vector_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
    acc = m.to(tl.float32) * v[None, :]
    return tl.sum(_add_gemv_tiles(acc, rows, row_width, col_ok, vector_ptr, BLOCK_K, BLOCK_K), axis=1)


@triton.jit
def _linear_row_kernel(
    x_ptr,  # [K] the row
    w_ptr,  # [N, K] contiguous
    bias_ptr,  # [N] (read when HAS_BIAS)
    out_ptr,  # [N]
    out_features, in_features,
    HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    col = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = col < out_features
    out = _gemv_tile_waiting(w_ptr, in_features, col, col_ok, x_ptr, BLOCK_N, BLOCK_K)
    if HAS_BIAS:
        out += tl.load(bias_ptr + col, mask=col_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + col, out.to(out_ptr.dtype.element_ty), mask=col_ok)


def linear_one_row(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tiles: GemvTiles
) -> torch.Tensor:
    """F.linear(x, weight, bias) of one row x [..., in] (float32 sums, rounded once, as cuBLAS's)."""
    out_features, in_features = weight.shape
    if x.numel() != in_features or weight.stride() != (in_features, 1):
        raise ValueError(
            f"one row of {in_features} values and a contiguous weight expected, got {tuple(x.shape)} "
            f"and strides {weight.stride()}"
        )
    out = torch.empty(*x.shape[:-1], out_features, dtype=x.dtype, device=x.device)
    _linear_row_kernel[(triton.cdiv(out_features, tiles.block_n),)](
        x.contiguous(), weight, weight if bias is None else bias, out, out_features, in_features,
        HAS_BIAS=bias is not None, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, num_warps=tiles.warps,
        num_stages=tiles.stages, **launch_options(),
    )  # fmt: skip
    return out
