"""MLA's small steps around the absorbed attention in one Triton kernel on CUDA.

Per token it builds each head's latent-space query ([query already mapped into the latent by kv_b_proj's key
half | its rotated rope part]) and the cache entry ([RMS-normalised kv latent | rotated shared rope key])
stored at the token's slot: in the torch path that is two RoPEs (each a regroup of DeepSeek's interleaved
pairs, two products and a sum), a norm, two concatenations and a cache copy. Rounding follows the torch
path step by step (the norm as `ops.rms_norm`, RoPE as `rope.apply_rope` in the model dtype).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _round(x, dtype: tl.constexpr):
    return x.to(dtype).to(tl.float32)


@triton.jit
def _rotate(source, cos_ptr, sin_ptr, dtype: tl.constexpr, R: tl.constexpr, INTERLEAVED: tl.constexpr):
    """apply_rope of the R values at `source` (pairs (x0, x1), ... regrouped into halves when interleaved)."""
    j = tl.arange(0, R)
    half: tl.constexpr = R // 2
    partner = tl.where(j < half, j + half, j - half)
    if INTERLEAVED:
        at = tl.where(j < half, 2 * j, 2 * (j - half) + 1)
        partner_at = tl.where(partner < half, 2 * partner, 2 * (partner - half) + 1)
    else:
        at = j
        partner_at = partner
    x = tl.load(source + at).to(tl.float32)
    x_partner = tl.load(source + partner_at).to(tl.float32)
    cos = tl.load(cos_ptr + j).to(tl.float32)
    sin = tl.load(sin_ptr + j).to(tl.float32)
    sign = tl.where(j < half, -1.0, 1.0)
    return _round(_round(x * cos, dtype) + _round(sign * x_partner * sin, dtype), dtype)


@triton.jit
def _mla_query_entry_kernel(
    absorbed_ptr,  # [B, T, H, L] queries mapped into the latent (contiguous)
    q_ptr,  # the rope part of the queries: head h of row r at q_ptr + r * q_row + h * q_head
    kv_ptr,  # [latent (L) | rope key (R)] of row r at kv_ptr + r * kv_row
    norm_ptr,  # [L] the latent's RMSNorm weight
    cos_ptr,  # [B|1, T, R]
    sin_ptr,
    slot_ptr,  # [B * T] flat cache slot of each row
    query_ptr,  # [B, T, H, L + R] out
    cache_ptr,  # [B * capacity, L + R] flat cache entries
    q_row, q_head, kv_row, stride_cos_batch, tokens, heads, eps,
    L: tl.constexpr, R: tl.constexpr, INTERLEAVED: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    head = tl.program_id(1)  # the query heads, then one program for the cache entry
    b = row // tokens
    t = row % tokens
    dtype = query_ptr.dtype.element_ty
    cos = cos_ptr + b * stride_cos_batch + t * R
    sin = sin_ptr + b * stride_cos_batch + t * R
    lat = tl.arange(0, L)
    rot = tl.arange(0, R)
    if head < heads:
        out = query_ptr + (row * heads + head).to(tl.int64) * (L + R)
        tl.store(out + lat, tl.load(absorbed_ptr + (row * heads + head).to(tl.int64) * L + lat))
        rotated = _rotate(q_ptr + row.to(tl.int64) * q_row + head * q_head, cos, sin, dtype, R, INTERLEAVED)
        tl.store(out + L + rot, rotated.to(dtype))
    else:
        source = kv_ptr + row.to(tl.int64) * kv_row
        x = tl.load(source + lat).to(tl.float32)
        inv = tl.rsqrt(tl.sum(x * x, axis=0) / L + eps)
        normed = _round(_round(x * inv, dtype) * tl.load(norm_ptr + lat).to(tl.float32), dtype)
        rotated = _rotate(source + L, cos, sin, dtype, R, INTERLEAVED)
        entry = cache_ptr + tl.load(slot_ptr + row).to(tl.int64) * (L + R)
        tl.store(entry + lat, normed.to(cache_ptr.dtype.element_ty))
        tl.store(entry + L + rot, rotated.to(cache_ptr.dtype.element_ty))


def _rows(x: torch.Tensor) -> int:
    """Row stride of a [B, T, ...] view whose (B, T) rows are evenly spaced."""
    if x.shape[0] > 1 and x.stride(0) != x.shape[1] * x.stride(1):
        raise ValueError("batch rows of the projection view are not evenly spaced")
    return x.stride(1)


def mla_query_entry(
    absorbed: torch.Tensor,
    q_rope: torch.Tensor,
    kv: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    flat_slots: torch.Tensor,
    cache: torch.Tensor,
    interleaved: bool,
) -> torch.Tensor:
    """absorbed [B, T, H, L], q_rope [B, T, H, R] (a view), kv [B, T, L + R] (a view) -> the query
    [B, T, H, L + R] = [absorbed | rope(q_rope)]; [rms_norm(latent) | rope(key)] stored at `flat_slots` of
    cache [B * capacity, 1, L + R]."""
    batch, tokens, heads, latent = absorbed.shape
    rope = q_rope.shape[-1]
    if q_rope.stride(-1) != 1 or kv.stride(-1) != 1:
        raise ValueError("the projection views must be contiguous in their last dimension")
    query = torch.empty(batch, tokens, heads, latent + rope, dtype=absorbed.dtype, device=absorbed.device)
    cos, sin = cos.contiguous(), sin.contiguous()
    _mla_query_entry_kernel[(batch * tokens, heads + 1)](
        absorbed.contiguous(), q_rope, kv, norm_weight, cos, sin, flat_slots, query, cache,
        _rows(q_rope), q_rope.stride(2), _rows(kv), cos.stride(0) if cos.shape[0] > 1 else 0, tokens, heads, eps,
        L=latent, R=rope, INTERLEAVED=interleaved, num_warps=4,
    )  # fmt: skip
    return query
