"""Triton kernels behind `ops` on CUDA: each replaces a chain of small torch kernels with one launch.

Rounding follows the torch versions in `ops` step by step (a residual add rounds to the model dtype before it
is normalised, the normalised value rounds before the weight scales it), so either path gives the same
bf16 values up to float32 arithmetic order.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    res_out_ptr,
    heads,
    stride_xn,
    stride_xh,
    stride_rn,
    eps,
    D: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    ZERO_CENTERED: tl.constexpr,
):
    row = tl.program_id(0)
    n = row // heads
    h = row % heads
    offs = tl.arange(0, BLOCK)
    mask = offs < D
    x = tl.load(x_ptr + n * stride_xn + h * stride_xh + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + n * stride_rn + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        tl.store(res_out_ptr + row * D + offs, x, mask=mask)
    xf = x.to(tl.float32)
    normed = xf * tl.rsqrt(tl.sum(xf * xf, axis=0) / D + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if ZERO_CENTERED:
        out = normed * (1.0 + w)
    else:
        out = normed.to(x.dtype).to(tl.float32) * w
    tl.store(out_ptr + row * D + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None,
    zero_centered: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    dim = x.shape[-1]
    if x.stride(-1) != 1:
        x = x.contiguous()
    if residual is not None:
        rows, res = x.reshape(-1, 1, dim), residual.reshape(-1, dim)
    else:
        # [..., heads, dim] may be a strided view into a wider projection: rows are (token, head) pairs.
        rows = x.flatten(0, -3) if x.dim() >= 3 else x.reshape(-1, 1, dim)
        res = rows
    n, heads = rows.shape[0], rows.shape[1]
    out_dtype = x.dtype if zero_centered else torch.promote_types(x.dtype, weight.dtype)
    out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    res_out = torch.empty_like(x) if residual is not None else out
    block = triton.next_power_of_2(dim)
    _rms_norm_kernel[(n * heads,)](
        rows,
        res,
        weight,
        out,
        res_out,
        heads,
        rows.stride(0),
        rows.stride(1),
        res.stride(0),
        eps,
        D=dim,
        BLOCK=block,
        HAS_RESIDUAL=residual is not None,
        ZERO_CENTERED=zero_centered,
        num_warps=max(1, min(16, block // 256)),
    )
    return out if residual is None else (out, res_out)


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, inter, stride_xn, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = col < inter
    gate = tl.load(x_ptr + row * stride_xn + col, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_xn + inter + col, mask=mask, other=0.0).to(tl.float32)
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype).to(tl.float32)  # F.silu rounds before the product
    tl.store(out_ptr + row * inter + col, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    inter = gate_up.shape[-1] // 2
    rows = gate_up.reshape(-1, 2 * inter)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(*gate_up.shape[:-1], inter, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(rows.shape[0], triton.cdiv(inter, block))](
        rows, out, inter, rows.stride(0), BLOCK=block, num_warps=4
    )
    return out
