"""The forward pass's fused elementwise operations: one Triton kernel each on CUDA, plain torch elsewhere.

Both versions round where transformers rounds (a bf16 model normalises in float32, casts back, then scales),
so switching between them moves logits by float32 noise only. Triton is imported only when a CUDA tensor
first needs it. `SPECDEPLOY_TRITON`, read once at the first op: `0` forces the torch versions (to compare the
two), and `interpret` runs the Triton versions on CPU tensors through Triton's interpreter (the CUDA code
path on a machine without a GPU, slowly: for tests and for counting a step's launches).
"""

from __future__ import annotations

import os
import sys
from functools import cache

import torch
import torch.nn.functional as F

from specdeploy.engine.models.rope import Rope, apply_rope
from specdeploy.errors import SpecdeployError


@cache
def _setting() -> str:
    # read once: every op on a CPU tensor asks, and a lookup in os.environ per op showed in a tiny model's CPU step
    return os.environ.get("SPECDEPLOY_TRITON", "1")


@cache
def _triton_kernels():
    """The Triton kernel module, or None where Triton cannot run."""
    if _setting() == "0":
        return None
    if _setting() == "interpret":
        # Triton reads this when it is first imported: afterwards its kernels would stay compiled for a GPU.
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise SpecdeployError(
                "SPECDEPLOY_TRITON=interpret needs Triton's interpreter, and Triton was imported without it: "
                "set TRITON_INTERPRET=1 before the process starts"
            )
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        from specdeploy.engine import triton_kernels
    except ImportError:
        if _setting() == "interpret":
            raise
        return None
    return triton_kernels


def _use_triton(x: torch.Tensor) -> bool:
    # The kernels have no backward: training (autograd on) takes the torch versions.
    where = x.is_cuda or (_setting() == "interpret" and x.device.type == "cpu")
    return where and not torch.is_grad_enabled() and _triton_kernels() is not None


def triton_kernels_for(x: torch.Tensor):
    """The Triton kernel module when `x` lives where the kernels run (CUDA, autograd off), else None."""
    return _triton_kernels() if _use_triton(x) else None


def gdn_kernels_for(x: torch.Tensor):
    """The Gated DeltaNet kernel module (`triton_gdn`) when `x` lives where Triton kernels run, else None."""
    if not _use_triton(x):
        return None
    from specdeploy.engine import triton_gdn

    return triton_gdn


def step_kernels_for(x: torch.Tensor):
    """The decoding step's bookkeeping kernels (`triton_step`) when `x` lives where Triton kernels run, else None."""
    if not _use_triton(x):
        return None
    from specdeploy.engine import triton_step

    return triton_step


def linear(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    """layer(x), for the projections of targets and drafters (`project`)."""
    return project(x, layer.weight, layer.bias)


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias). Where Triton runs: one row (batch-1 decode) through the matrix-vector kernel
    (`triton_gemv.linear_one_row`, unless `triton_gemv.ONE_ROW_LINEAR` is None), a few rows of a small weight
    through `triton_gemv.linear_rows` (the rule `triton_gemv.ROWS_LINEAR`); the rest through cuBLAS."""
    if _use_triton(x) and weight.is_contiguous():  # the kernels read the weight's rows as they lie
        from specdeploy.engine import triton_gemv

        rows = x.numel() // weight.shape[1]
        if rows == 1 and triton_gemv.ONE_ROW_LINEAR is not None:
            return triton_gemv.linear_one_row(x, weight, bias, triton_gemv.ONE_ROW_LINEAR)
        rule = triton_gemv.ROWS_LINEAR
        if triton_gemv.takes_rows(rows, weight, rule):
            return triton_gemv.linear_rows(x, weight, bias, rule)
    return F.linear(x, weight, bias)


def norm_linear(
    x: torch.Tensor, residual: torch.Tensor, norm: torch.nn.Module, layer: torch.nn.Linear
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(layer(norm(x + residual)), x + residual) in one kernel for one row where Triton runs
    (`triton_gemv.norm_linear_row`: the norm made as the weights are read, one launch fewer); None elsewhere,
    for a norm whose weight is not in x's dtype, and for a weight larger than the fusions take
    (`triton_gemv.fuses_row`)."""
    if x.numel() != layer.in_features or not _use_triton(x) or not layer.weight.is_contiguous():
        return None
    if norm.weight.dtype != x.dtype:
        return None
    from specdeploy.engine import triton_gemv

    tiles = triton_gemv.ONE_ROW_LINEAR
    if tiles is None or not triton_gemv.fuses_row(layer.weight):
        return None
    return triton_gemv.norm_linear_row(
        x, residual, norm.weight, norm.eps, norm.zero_centered, layer.weight, layer.bias, tiles
    )


def silu_mul_linear(gate_up: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    """linear(silu_mul(gate_up), layer): SwiGLU's down projection of its activations. One row where Triton runs is
    one kernel (`triton_gemv.swiglu_down_row`, unless `triton_gemv.ONE_ROW_LINEAR` is None or the weight is
    larger than the fusions take, `triton_gemv.fuses_row`), which makes the activations as it reads the weights;
    the rest launch the two."""
    if gate_up.numel() == 2 * layer.in_features and _use_triton(gate_up):
        from specdeploy.engine import triton_gemv

        if triton_gemv.ONE_ROW_LINEAR is not None and triton_gemv.fuses_row(layer.weight):
            return triton_gemv.swiglu_down_row(gate_up, layer.weight, layer.bias, triton_gemv.ONE_ROW_LINEAR)
    return linear(silu_mul(gate_up), layer)


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
    # x * rsqrt(mean(x^2) + eps) in float32, as one op (bit-identical to the composite, fewer dispatches)
    normed = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)
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


def rotate(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """RoPE on the first rotary-dim channels of x [B, T, heads, D] (all of them, usually); the rest pass."""
    rotated = rope[0].shape[-1]
    if rotated == x.shape[-1]:
        return apply_rope(x, rope)
    return torch.cat([apply_rope(x[..., :rotated], rope), x[..., rotated:]], dim=-1)


def qk_norm_rope_store(
    q: torch.Tensor | None,
    k: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor,
    eps: float,
    zero_centered: bool,
    rope: Rope,
    flat_slots: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
) -> torch.Tensor | None:
    """Qwen3-style attention inputs in one pass: per-head RMSNorm and RoPE of queries q [B, T, H, D] and keys
    k [B, T, Hkv, D]; keys and values v stored at `flat_slots` of the caches [B * capacity, Hkv, D]; the
    queries returned folded by key head, [B, Hkv, H / Hkv, T, D] (None without queries)."""
    if _use_triton(k):
        query = q if q is not None else k[:, :, :0]
        weight = q_weight if q_weight is not None else k_weight
        folded = _triton_kernels().qk_norm_rope_store(
            query, k, v, weight, k_weight, eps, rope[0], rope[1], flat_slots, k_cache, v_cache, zero_centered
        )
        return folded if q is not None else None
    b, tokens, kv_heads, dim = k.shape
    heads = 0 if q is None else q.shape[2]
    if q is not None:  # queries and keys normed and rotated together: half the small ops of two passes
        weight = torch.cat([q_weight.expand(heads, dim), k_weight.expand(kv_heads, dim)])
        q, k = rotate(torch_rms_norm(torch.cat([q, k], dim=2), weight, eps, None, zero_centered), rope).split(
            [heads, kv_heads], dim=2
        )
    else:
        k = rotate(torch_rms_norm(k, k_weight, eps, None, zero_centered), rope)
    k_cache.index_copy_(0, flat_slots, k.reshape(-1, kv_heads, dim).to(k_cache.dtype))
    v_cache.index_copy_(0, flat_slots, v.reshape(-1, *v.shape[2:]).to(v_cache.dtype))
    if q is None:
        return None
    return q.view(b, tokens, kv_heads, heads // kv_heads, dim).permute(0, 2, 3, 1, 4).contiguous()
