"""Projection kernels: one row's dense projection (`linear_one_row`), the matrix-vector tile the MoE kernels share,
and a few rows' projection of a small weight (`linear_rows`).

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
from specdeploy.engine.triton_rounding import rounded, rounded_silu


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


# The one-row fusions (`norm_linear_row`, `swiglu_down_row`) take weights up to this size. Each of their programs
# reads its input row whole besides its weight tiles (the norm's sum of squares; gate | up): 5 / BLOCK_N and
# 2 / BLOCK_N times the weight's bytes again, from L2. That is nothing against the launch a fusion saves (a few us)
# while the weight is small, and more than it once the weight takes tens of us to read: on one H100 (at d113647)
# the fusions slowed Qwen3.6-27B's AR step from 18.15 to 19.75 ms (gate|up 356 MB, down 178 MB, q|k|v 100 MB and
# more) and sped mla-moe-16b's from 2.63 to 2.59 ms (MLA's first projection 8.6 MB)
# (`benchmarks/results/gpu-2026-12-06-walk-fusions/`).
FUSED_ROW_MAX_WEIGHT_BYTES = 16 << 20


def fuses_row(weight: torch.Tensor) -> bool:
    """Whether a one-row fusion takes `weight` (FUSED_ROW_MAX_WEIGHT_BYTES)."""
    return weight.numel() * weight.element_size() <= FUSED_ROW_MAX_WEIGHT_BYTES


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
def _two_gemv_tiles_waiting(
    w, up_ptr, row_width, col, col_ok, vector_ptr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr
):
    """`_gemv_tile_waiting` of two weights at once (gate `w` and `up_ptr`, the same sums): the first tile of each
    is loaded, then the kernel waits, then reads the vector."""
    kk = tl.arange(0, BLOCK_K)
    k_ok = kk < row_width
    gate_rows = w + col[:, None].to(tl.int64) * row_width
    up_rows = up_ptr + col[:, None].to(tl.int64) * row_width
    gate = tl.load(gate_rows + kk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
    up = tl.load(up_rows + kk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
    dependent_launch()
    v = tl.load(vector_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
    gate_acc = gate.to(tl.float32) * v[None, :]
    up_acc = up.to(tl.float32) * v[None, :]
    gate_acc = _add_gemv_tiles(gate_acc, gate_rows, row_width, col_ok, vector_ptr, BLOCK_K, BLOCK_K)
    up_acc = _add_gemv_tiles(up_acc, up_rows, row_width, col_ok, vector_ptr, BLOCK_K, BLOCK_K)
    return tl.sum(gate_acc, axis=1), tl.sum(up_acc, axis=1)


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


@triton.jit
def _normed_tile(x_ptr, res_ptr, norm_ptr, kk, k_ok, rstd, dtype: tl.constexpr, ZERO_CENTERED: tl.constexpr):
    """RMSNorm(x + residual) at columns kk, rounded as `ops.rms_norm` stores it (float32 values of `dtype`)."""
    x = tl.load(x_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
    normed = rounded(x + r, dtype) * rstd
    w = tl.load(norm_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
    if ZERO_CENTERED:
        return rounded(normed * (1.0 + w), dtype)
    return rounded(rounded(normed, dtype) * w, dtype)


@triton.jit
def _normed_gemv_tile_waiting(
    w, row_width, col, col_ok, x_ptr, res_ptr, norm_ptr, eps,
    dtype: tl.constexpr, ZERO_CENTERED: tl.constexpr, ROW: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """`_gemv_tile_waiting` of RMSNorm(x + residual) (a row of `row_width`, ROW its power of two), the norm made as
    the weights are read: the first weight tile loaded, the wait, the row's squares summed, then normalised tile by
    tile with `ops.rms_norm`'s roundings. -> (the sums, x + residual over the row's ROW columns rounded to `dtype`
    as the norm keeps it, and its 1 / sqrt(mean square + eps))."""
    rows = w + col[:, None].to(tl.int64) * row_width
    kk = tl.arange(0, BLOCK_K)
    k_ok = kk < row_width
    m = tl.load(rows + kk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
    dependent_launch()
    d = tl.arange(0, ROW)
    d_ok = d < row_width
    total = rounded(
        tl.load(x_ptr + d, mask=d_ok, other=0.0).to(tl.float32)
        + tl.load(res_ptr + d, mask=d_ok, other=0.0).to(tl.float32),
        dtype,
    )
    rstd = tl.rsqrt(tl.sum(total * total, axis=0) / row_width + eps)
    acc = (
        m.to(tl.float32)
        * _normed_tile(x_ptr, res_ptr, norm_ptr, kk, k_ok, rstd, dtype, ZERO_CENTERED)[None, :]
    )
    for k0 in range(BLOCK_K, row_width, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < row_width
        v = _normed_tile(x_ptr, res_ptr, norm_ptr, kk, k_ok, rstd, dtype, ZERO_CENTERED)
        m = tl.load(rows + kk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc += m.to(tl.float32) * v[None, :]
    return tl.sum(acc, axis=1), total, rstd


@triton.jit
def _norm_linear_row_kernel(
    x_ptr, res_ptr,  # [K] a layer's output and the residual stream before it
    norm_ptr,  # [K] the norm's weight
    w_ptr,  # [N, K] contiguous
    bias_ptr,  # [N] (read when HAS_BIAS)
    out_ptr,  # [N]
    sum_ptr,  # [K] out: x + residual, the residual stream after (program 0 writes it)
    out_features, in_features, eps,
    HAS_BIAS: tl.constexpr, ZERO_CENTERED: tl.constexpr, ROW: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """`_linear_row_kernel` of RMSNorm(x + residual), the norm made as the weights are read: each program sums the
    row's squares itself, then normalises tile by tile, with `ops.rms_norm`'s roundings."""
    col = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = col < out_features
    dtype = out_ptr.dtype.element_ty
    out, total, _ = _normed_gemv_tile_waiting(
        w_ptr, in_features, col, col_ok, x_ptr, res_ptr, norm_ptr, eps, dtype, ZERO_CENTERED, ROW, BLOCK_K
    )
    if tl.program_id(0) == 0:
        d = tl.arange(0, ROW)
        tl.store(sum_ptr + d, total.to(dtype), mask=d < in_features)
    if HAS_BIAS:
        out += tl.load(bias_ptr + col, mask=col_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + col, out.to(dtype), mask=col_ok)


def norm_linear_row(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    zero_centered: bool,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    tiles: GemvTiles,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(F.linear(RMSNorm(x + residual), weight, bias), x + residual) of one row x [..., in] in one kernel."""
    out_features, in_features = weight.shape
    out = _one_row_output(x, 1, weight)
    if residual.numel() != in_features:
        raise ValueError(f"a residual of {in_features} values expected, got {tuple(residual.shape)}")
    total = torch.empty_like(x)
    _norm_linear_row_kernel[(triton.cdiv(out_features, tiles.block_n),)](
        x.contiguous(), residual.contiguous(), norm_weight, weight, weight if bias is None else bias, out, total,
        out_features, in_features, eps,
        HAS_BIAS=bias is not None, ZERO_CENTERED=zero_centered, ROW=triton.next_power_of_2(in_features),
        BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, num_warps=tiles.warps, num_stages=tiles.stages,
        **launch_options(),
    )  # fmt: skip
    return out, total


@triton.jit
def _silu_mul_tile(gate_up_ptr, inter, kk, k_ok, dtype: tl.constexpr):
    """SwiGLU's activations silu(gate[k]) * up[k] at columns kk of one row [gate | up], rounded as `ops.silu_mul`
    stores them (float32 values of the model dtype)."""
    gate = tl.load(gate_up_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + inter + kk, mask=k_ok, other=0.0).to(tl.float32)
    silu = rounded_silu(gate, dtype)
    return rounded(silu * up, dtype)


@triton.jit
def _swiglu_down_row_kernel(
    gate_up_ptr,  # [2 * K] one row's gate | up
    w_ptr,  # [N, K] contiguous: the down projection
    bias_ptr,  # [N] (read when HAS_BIAS)
    out_ptr,  # [N]
    out_features, inter,
    HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """`_linear_row_kernel` of SwiGLU's activations, made from gate | up tile by tile as the weights are read: the
    same sums in the same order as `ops.silu_mul` followed by `linear_one_row`, in one launch (bitwise the same in bf16
    on one H100; in float32 they differed in the last bits there)."""
    col = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = col < out_features
    rows = w_ptr + col[:, None].to(tl.int64) * inter
    kk = tl.arange(0, BLOCK_K)
    k_ok = kk < inter
    m = tl.load(rows + kk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
    dependent_launch()
    dtype = out_ptr.dtype.element_ty
    acc = m.to(tl.float32) * _silu_mul_tile(gate_up_ptr, inter, kk, k_ok, dtype)[None, :]
    for k0 in range(BLOCK_K, inter, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < inter
        v = _silu_mul_tile(gate_up_ptr, inter, kk, k_ok, dtype)
        m = tl.load(rows + kk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc += m.to(tl.float32) * v[None, :]
    out = tl.sum(acc, axis=1)
    if HAS_BIAS:
        out += tl.load(bias_ptr + col, mask=col_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + col, out.to(dtype), mask=col_ok)


def _one_row_output(row: torch.Tensor, parts: int, weight: torch.Tensor) -> torch.Tensor:
    """The output of a one-row projection of `row` [..., parts * in] (its `parts` input vectors make the one the
    weight [out, in] multiplies), once both are checked. Each caller launches its kernel itself: the launch checker
    (tests/test_triton_launch.py) reads the kernel's name at the launch."""
    out_features, in_features = weight.shape
    if row.numel() != parts * in_features or weight.stride() != (in_features, 1):
        raise ValueError(
            f"one row of {parts * in_features} values and a contiguous weight expected, got {tuple(row.shape)} "
            f"and strides {weight.stride()}"
        )
    return torch.empty(*row.shape[:-1], out_features, dtype=row.dtype, device=row.device)


def swiglu_down_row(
    gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tiles: GemvTiles
) -> torch.Tensor:
    """F.linear(silu(gate) * up, weight, bias) of one row gate_up [..., 2 * in] in one kernel."""
    out = _one_row_output(gate_up, 2, weight)
    _swiglu_down_row_kernel[(triton.cdiv(weight.shape[0], tiles.block_n),)](
        gate_up.contiguous(), weight, weight if bias is None else bias, out, *weight.shape,
        HAS_BIAS=bias is not None, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, num_warps=tiles.warps,
        num_stages=tiles.stages, **launch_options(),
    )  # fmt: skip
    return out


def linear_one_row(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tiles: GemvTiles
) -> torch.Tensor:
    """F.linear(x, weight, bias) of one row x [..., in] (float32 sums, rounded once, as cuBLAS's)."""
    out = _one_row_output(x, 1, weight)
    _linear_row_kernel[(triton.cdiv(weight.shape[0], tiles.block_n),)](
        x.contiguous(), weight, weight if bias is None else bias, out, *weight.shape,
        HAS_BIAS=bias is not None, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, num_warps=tiles.warps,
        num_stages=tiles.stages, **launch_options(),
    )  # fmt: skip
    return out


class RowsLinear(NamedTuple):
    """Which few-row projections `linear_rows` takes, and its tiles: up to `max_rows` rows (each program holds a
    power-of-two tile of them, at least 16) of weights up to `max_weight_bytes`; output columns and reduction
    width per program, warps, pipeline stages."""

    max_rows: int
    max_weight_bytes: int
    block_n: int
    block_k: int
    warps: int
    stages: int


# A verify of a small model (the zoo's: 256 wide) multiplies a few dozen rows by weights under 1 MB: launches,
# not bytes, bound it, and cuBLAS's kernels each broke the chain of dependent launches. On one H200
# `benchmarks/rows_linear_sweep.py` timed the zoo's projections at 1.78 / 2.87 / 2.91 us (16 / 65 / 128 rows) at these
# tiles against cuBLAS's 2.55 / 2.96 / 3.05; at 2-12 MB weights cuBLAS was faster at every row count
# (`benchmarks/results/gpu-2026-12-06-few-rows/`). None: every projection of more than one row through F.linear.
ROWS_LINEAR: RowsLinear | None = RowsLinear(128, 1 << 20, 32, 128, 4, 3)


def takes_rows(rows: int, weight: torch.Tensor, rule: RowsLinear | None) -> bool:
    """Whether `linear_rows` takes `rows` rows of `weight` under `rule`."""
    return (
        rule is not None
        and 1 < rows <= rule.max_rows
        and weight.numel() * weight.element_size() <= rule.max_weight_bytes
    )


@triton.jit
def _linear_rows_kernel(
    x_ptr,  # [M, K] rows `stride_x` apart, contiguous within a row
    w_ptr,  # [N, K] contiguous
    bias_ptr,  # [N] (read when HAS_BIAS)
    out_ptr,  # [M, N] contiguous
    rows, out_features, in_features, stride_x,
    HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_K)
    m_ok, n_ok = m < rows, n < out_features
    w_cols = w_ptr + n[None, :].to(tl.int64) * in_features  # [1, BLOCK_N]: the weight's rows as columns
    x_rows = x_ptr + m[:, None].to(tl.int64) * stride_x
    # the first weight tile, loaded before the wait: no kernel writes weights
    w = tl.load(w_cols + k[:, None], mask=n_ok[None, :] & (k < in_features)[:, None], other=0.0)
    dependent_launch()
    precision: tl.constexpr = "ieee" if IEEE else "tf32"
    x = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & (k < in_features)[None, :], other=0.0)
    acc = tl.dot(x, w, input_precision=precision, out_dtype=tl.float32)
    for k0 in range(BLOCK_K, in_features, BLOCK_K):
        kk = k0 + k
        k_ok = kk < in_features
        w = tl.load(w_cols + kk[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)
        x = tl.load(x_rows + kk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(x, w, acc, input_precision=precision, out_dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + m[:, None].to(tl.int64) * out_features + n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def linear_rows(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tiles: RowsLinear
) -> torch.Tensor:
    """F.linear(x, weight, bias) of x [..., in] (float32 sums, rounded once; float32 inputs multiplied in full
    float32, not TF32) as one Triton kernel in the chain of dependent launches."""
    out_features, in_features = weight.shape
    if x.shape[-1] != in_features or weight.stride() != (in_features, 1):
        raise ValueError(
            f"rows of {in_features} values and a contiguous weight expected, got {tuple(x.shape)} "
            f"and strides {weight.stride()}"
        )
    flat = x.reshape(-1, in_features)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    rows = flat.shape[0]
    block_m = min(128, max(16, triton.next_power_of_2(rows)))  # tl.dot takes 16 rows and more
    out = torch.empty(*x.shape[:-1], out_features, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(out_features, tiles.block_n), triton.cdiv(rows, block_m))
    _linear_rows_kernel[grid](
        flat, weight, weight if bias is None else bias, out, rows, out_features, in_features, flat.stride(0),
        HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32, BLOCK_M=block_m, BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k, num_warps=tiles.warps, num_stages=tiles.stages, **launch_options(),
    )  # fmt: skip
    return out
