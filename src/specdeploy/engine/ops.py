"""The forward pass's fused elementwise operations: one Triton kernel each on CUDA, plain torch elsewhere.

Both versions round where transformers rounds (a bf16 model normalises in float32, casts back, then scales),
so switching between them moves logits by float32 noise only. Triton is imported only when a CUDA tensor
first needs it; `SPECDEPLOY_TRITON=0` forces the torch versions (to compare the two).
"""

from __future__ import annotations

import os
from functools import cache

import torch
import torch.nn.functional as F


@cache
def _triton_kernels():
    """The Triton kernel module, or None where Triton cannot run."""
    if os.environ.get("SPECDEPLOY_TRITON", "1") == "0":
        return None
    try:
        from specdeploy.engine import triton_kernels
    except ImportError:
        return None
    return triton_kernels


def _use_triton(x: torch.Tensor) -> bool:
    return x.is_cuda and _triton_kernels() is not None


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    zero_centered: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim; with `residual`, of x + residual, returning (normed, x + residual).

    Standard (Llama/Qwen3): weight * cast(x * rsqrt(mean(x^2) + eps)). Zero-centred (Qwen3-Next): the weight
    is an offset from 1 and the product is taken in float32 before the cast.
    """
    if _use_triton(x):
        return _triton_kernels().rms_norm(x, weight, eps, residual, zero_centered)
    return torch_rms_norm(x, weight, eps, residual, zero_centered)


def torch_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    zero_centered: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`rms_norm` in plain torch ops."""
    if residual is not None:
        x = x + residual
    dtype = x.dtype
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if zero_centered:
        out = (normed * (1.0 + weight.float())).to(dtype)
    else:
        out = weight * normed.to(dtype)
    return out if residual is None else (out, x)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up] along the last dim (SwiGLU's activation)."""
    if _use_triton(gate_up):
        return _triton_kernels().silu_mul(gate_up)
    return torch_silu_mul(gate_up)


def torch_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu_mul` in plain torch ops."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
