"""MLA's steps around the absorbed attention as Triton kernels on CUDA: two launches where torch takes a dozen.

`mla_query_entry`, before the attention: per token it maps each head's query into the latent (its nope part
times kv_b_proj's key half, the "absorbed" query), rotates the rope part, and stores the cache entry
[RMS-normalised kv latent | rotated shared rope key] at the token's slot. In torch that is a batched matmul,
two RoPEs (each a regroup of DeepSeek's interleaved pairs, two products and a sum), a norm, two
concatenations and a cache copy.

`combine_up`, after the attention's splits: it combines each head's flash-decoding splits into the attended
latent, rounds it to the model dtype as the attention's output would be, and maps it out through
kv_b_proj's value half: torch's combine and batched matmul in one launch.

Rounding follows the torch path step by step (the norm as `ops.rms_norm`, RoPE as `rope.apply_rope` in the
model dtype, each product accumulated in float32 and rounded once).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from specdeploy.engine.triton_launch import dependent_launch, launch_options
from specdeploy.engine.triton_rounding import rounded


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
    return rounded(rounded(x * cos, dtype) + rounded(sign * x_partner * sin, dtype), dtype)


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """a @ b accumulated in float32; float32 inputs exactly (Triton's default float32 dot rounds to TF32)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _mla_query_entry_kernel(
    q_ptr,  # the queries: head h of row r at q_ptr + r * q_row + h * q_head, [nope (nope_dim) | rope (R)]
    up_ptr,  # kv_b_proj's key half: head h, nope channel n at up_ptr + h * up_head + n * L
    kv_ptr,  # [latent (L) | rope key (R)] of row r at kv_ptr + r * kv_row
    norm_ptr,  # [L] the latent's RMSNorm weight
    cos_ptr,  # [B|1, T, R]
    sin_ptr,
    slot_ptr,  # [B * T] flat cache slot of each row
    query_ptr,  # [B, T, H, L + R] out
    cache_ptr,  # [B * capacity, L + R] flat cache entries
    q_row, q_head, up_head, kv_row, stride_cos_batch, tokens, rows, heads, nope_dim, eps,
    NOPE: tl.constexpr, L: tl.constexpr, R: tl.constexpr, INTERLEAVED: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_L: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    program = tl.program_id(0)
    dtype = query_ptr.dtype.element_ty
    latent_blocks: tl.constexpr = L // BLOCK_L
    absorbing = heads * latent_blocks  # the first programs: one (head, latent block) each, over all rows
    if program < absorbing:
        head = program // latent_blocks
        lat = (program % latent_blocks) * BLOCK_L + tl.arange(0, BLOCK_L)
        nope = tl.arange(0, NOPE)  # the nope width, padded to a power of two of at least 16 for the product
        nope_ok = nope < nope_dim
        # the key half's block is read once and serves every row, as the batched matmul reads it; a weight, so
        # loaded before the wait for the kernel before (its load overlaps that kernel's end)
        key_up = tl.load(up_ptr + head.to(tl.int64) * up_head + nope[:, None] * L + lat[None, :],
                         mask=nope_ok[:, None], other=0.0)  # fmt: skip
        dependent_launch()
        for start in range(0, rows, BLOCK_T):
            row = start + tl.arange(0, BLOCK_T)
            row_ok = row < rows
            q_nope = tl.load(q_ptr + row[:, None].to(tl.int64) * q_row + head * q_head + nope[None, :],
                             mask=row_ok[:, None] & nope_ok[None, :], other=0.0)  # fmt: skip
            absorbed = _dot(q_nope, key_up, IEEE)
            out = query_ptr + (row[:, None] * heads + head).to(tl.int64) * (L + R) + lat[None, :]
            tl.store(out, absorbed.to(dtype), mask=row_ok[:, None])
        return
    dependent_launch()
    index = program - absorbing  # then one program per (row, head) rotates, and one per row stores the entry
    row = index // (heads + 1)
    head = index % (heads + 1)
    b = row // tokens
    t = row % tokens
    cos = cos_ptr + b * stride_cos_batch + t * R
    sin = sin_ptr + b * stride_cos_batch + t * R
    rot = tl.arange(0, R)
    if head < heads:
        out = query_ptr + (row * heads + head).to(tl.int64) * (L + R)
        source = q_ptr + row.to(tl.int64) * q_row + head * q_head + nope_dim
        tl.store(out + L + rot, _rotate(source, cos, sin, dtype, R, INTERLEAVED).to(dtype))
    else:
        lat = tl.arange(0, L)
        source = kv_ptr + row.to(tl.int64) * kv_row
        x = tl.load(source + lat).to(tl.float32)
        inv = tl.rsqrt(tl.sum(x * x, axis=0) / L + eps)
        normed = rounded(rounded(x * inv, dtype) * tl.load(norm_ptr + lat).to(tl.float32), dtype)
        rotated = _rotate(source + L, cos, sin, dtype, R, INTERLEAVED)
        entry = cache_ptr + tl.load(slot_ptr + row).to(tl.int64) * (L + R)
        tl.store(entry + lat, normed.to(cache_ptr.dtype.element_ty))
        tl.store(entry + L + rot, rotated.to(cache_ptr.dtype.element_ty))


# The (head, query row) pairs up to which `combine_up` maps the attention's output out in its combine; more take
# the combine and a batched matmul, which reads each head's value up-projection once for all rows where each
# combine program re-reads its head's block. On one H100 (benchmarks/results/gpu-2026-12-05-new-defaults/
# call-1-h100/mla_combine_sweep.json, `COMBINE_UP` tiles) the combine won up to 8 rows of 16 heads (14.0 against
# 17.7 us at a 640-slot window) and up to 2 rows of 64 heads (15.2 against 19.5 us), and tied or lost beyond.
COMBINE_UP_HEAD_ROWS = 128


class CombineUpTiles(NamedTuple):
    """`combine_up`'s launch: splits merged per load (at most), warps, and whether the value block's load is
    issued before the splits' (so the two round trips to memory overlap) or after them."""

    splits_per_load: int
    warps: int
    value_first: bool


# The fastest of benchmarks/mla_combine_sweep.py's grid on one H100, or within 2% of it, in each of its 16 cases
# (16 and 64 heads, 1 to 8 rows, windows of 640 and 4096): at mla-moe-16b's AR step (16 heads, one row, 640
# slots) 9.0 us against 11.9 at (32, 8, False), the setting before it was measured (same JSON as above).
COMBINE_UP = CombineUpTiles(8, 4, False)


@triton.jit
def _combine_up_kernel(
    part_ptr,  # [SPLITS, B, M, L] float32: each split's unnormalised attended latent, M = heads * tokens
    max_ptr,  # [SPLITS, B, M] each split's running max
    sum_ptr,  # [SPLITS, B, M] each split's softmax denominator
    up_ptr,  # kv_b_proj's value half: head h, value channel v at up_ptr + h * up_head + v * L
    out_ptr,  # [B, T, H * V] out
    splits, split_stride, tokens, heads, up_head, value_dim,
    L: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_V: tl.constexpr, VALUE_FIRST: tl.constexpr,
):  # fmt: skip
    value_blocks = tl.cdiv(value_dim, BLOCK_V)
    head = tl.program_id(0) // value_blocks
    v = (tl.program_id(0) % value_blocks) * BLOCK_V + tl.arange(0, BLOCK_V)
    v_ok = v < value_dim
    row = tl.program_id(1)  # flat (batch row, token)
    at = (row // tokens * heads + head) * tokens + row % tokens  # this head's query row in its batch row
    lat = tl.arange(0, L)
    s = tl.arange(0, BLOCK_S)
    dtype = out_ptr.dtype.element_ty
    value_at = up_ptr + head.to(tl.int64) * up_head + v[:, None] * L + lat[None, :]
    if VALUE_FIRST:  # a weight: loaded before the wait for the kernel before, so the load overlaps its end
        value_up = tl.load(value_at, mask=v_ok[:, None], other=0.0)
    dependent_launch()
    # BLOCK_S splits a load (all of a short window's), merged into the running ones as flash-decoding merges
    top = tl.full([1], float("-inf"), tl.float32)
    total = tl.zeros([1], tl.float32)
    acc = tl.zeros([L], tl.float32)
    for start in range(0, splits, BLOCK_S):
        split = start + s
        ok = split < splits
        maxes = tl.load(max_ptr + split * split_stride + at, mask=ok, other=float("-inf"))
        sums = tl.load(sum_ptr + split * split_stride + at, mask=ok, other=0.0)
        parts = tl.load(part_ptr + (split * split_stride + at)[:, None].to(tl.int64) * L + lat[None, :],
                        mask=ok[:, None], other=0.0)  # fmt: skip
        new_top = tl.maximum(top, tl.max(maxes, axis=0))
        safe_top = tl.where(new_top == float("-inf"), 0.0, new_top)  # nothing seen yet
        rescale = tl.exp(top - safe_top)
        weight = tl.where(maxes == float("-inf"), 0.0, tl.exp(maxes - safe_top))
        total = total * rescale + tl.sum(weight * sums, axis=0)
        acc = acc * rescale + tl.sum(parts * weight[:, None], axis=0)
        top = new_top
    # rounded as the attention's output is before torch's batched matmul reads it
    attended = rounded(acc / tl.where(total > 0, total, 1.0), dtype)
    if not VALUE_FIRST:
        value_up = tl.load(value_at, mask=v_ok[:, None], other=0.0)
    out = tl.sum(value_up.to(tl.float32) * attended[None, :], axis=1)
    tl.store(out_ptr + (row * heads + head).to(tl.int64) * value_dim + v, out.to(dtype), mask=v_ok)


def _rows(x: torch.Tensor) -> int:
    """Row stride of a [B, T, ...] view whose (B, T) rows are evenly spaced."""
    if x.shape[0] > 1 and x.stride(0) != x.shape[1] * x.stride(1):
        raise ValueError("batch rows of the projection view are not evenly spaced")
    return x.stride(1)


def mla_query_entry(
    q: torch.Tensor,
    key_up: torch.Tensor,
    kv: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    flat_slots: torch.Tensor,
    cache: torch.Tensor,
    interleaved: bool,
) -> torch.Tensor:
    """q [B, T, H, nope + R] (a view), key_up [H, nope, L] (kv_b_proj's key half), kv [B, T, L + R] (a view)
    -> the query [B, T, H, L + R] = [q_nope @ key_up | rope(q_rope)]; [rms_norm(latent) | rope(key)] stored at
    `flat_slots` of cache [B * capacity, 1, L + R]."""
    batch, tokens, heads, width = q.shape
    nope, latent = key_up.shape[1:]
    rope = width - nope
    if q.stride(-1) != 1 or kv.stride(-1) != 1 or key_up.stride(-1) != 1 or key_up.stride(1) != latent:
        raise ValueError("the projection views must be contiguous in their last dimension")
    query = torch.empty(batch, tokens, heads, latent + rope, dtype=q.dtype, device=q.device)
    cos, sin = cos.contiguous(), sin.contiguous()
    block_l = min(64, latent)
    rows = batch * tokens
    _mla_query_entry_kernel[(heads * (latent // block_l) + rows * (heads + 1),)](
        q, key_up, kv, norm_weight, cos, sin, flat_slots, query, cache,
        _rows(q), q.stride(2), key_up.stride(0), _rows(kv), cos.stride(0) if cos.shape[0] > 1 else 0,
        tokens, rows, heads, nope, eps,
        NOPE=max(16, triton.next_power_of_2(nope)), L=latent, R=rope, INTERLEAVED=interleaved,
        BLOCK_T=16, BLOCK_L=block_l, IEEE=q.dtype == torch.float32, num_warps=4,
        **launch_options(),
    )  # fmt: skip
    return query


def combine_up(
    parts: torch.Tensor, maxes: torch.Tensor, sums: torch.Tensor, value_up: torch.Tensor, tokens: int
) -> torch.Tensor:
    """The attention's splits parts [S, B, H * T, L], maxes and sums [S, B, H * T] (MLA's one latent head,
    query rows head-major) and value_up [H, V, L] (kv_b_proj's value half) -> [B, T, H * V] in value_up's
    dtype: each head's attended latent, rounded to that dtype, times its value up-projection. One program per
    (head, block of value channels, row): for up to `COMBINE_UP_HEAD_ROWS` (head, row) pairs, as each re-reads
    its head's block."""
    splits, batch, head_rows, latent = parts.shape
    heads, value, _ = value_up.shape
    if value_up.stride(-1) != 1 or value_up.stride(1) != latent:
        raise ValueError("the value up-projection must be [H, V, L] with contiguous rows")
    out = torch.empty(batch, tokens, heads * value, dtype=value_up.dtype, device=parts.device)
    block_v = min(32, triton.next_power_of_2(value))
    _combine_up_kernel[(heads * triton.cdiv(value, block_v), batch * tokens)](
        parts, maxes, sums, value_up, out, splits, batch * head_rows, tokens, heads, value_up.stride(0), value,
        L=latent, BLOCK_S=min(COMBINE_UP.splits_per_load, triton.next_power_of_2(splits)), BLOCK_V=block_v,
        VALUE_FIRST=COMBINE_UP.value_first, num_warps=COMBINE_UP.warps,
        **launch_options(),
    )  # fmt: skip
    return out
