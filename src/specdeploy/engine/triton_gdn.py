"""Triton kernels of the gated delta rule over draft trees: `tree_rule` and `replay` of `gated_delta_rule` on CUDA.

Each program owns one (token, value head, block of value columns): the delta rule is independent per value
column, so a [Dk, BV] slice of the state stays in registers while the program walks the token's root path
from the committed state. No per-token state is ever written to memory, and the shapes are fixed, so a
verification with recurrent layers is captured in a CUDA graph. Arithmetic follows the torch reference step
by step (L2 norms with eps inside the root, decay, recall, corrected write) in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

EPS = 1e-6  # gated_delta_rule.l2norm's


@triton.jit
def _walk(h, path_ptr, length, key_ptr, value_ptr, decay_ptr, beta_ptr, key_head, head, sk_t, sk_h, sv_t, sv_h,
          sd_t, offs_k, mask_k, offs_v, mask_v, eps):  # fmt: skip
    """h advanced along the first `length` token indices at path_ptr."""
    for d in range(0, length):
        node = tl.load(path_ptr + d)
        k = tl.load(key_ptr + node * sk_t + key_head * sk_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        k = k * tl.rsqrt(tl.sum(k * k, axis=0) + eps)
        v = tl.load(value_ptr + node * sv_t + head * sv_h + offs_v, mask=mask_v, other=0.0).to(tl.float32)
        g = tl.load(decay_ptr + node * sd_t + head)
        beta = tl.load(beta_ptr + node * sd_t + head)
        h = h * tl.exp(g)
        recalled = tl.sum(h * k[:, None], axis=0)
        h = h + k[:, None] * ((v - recalled) * beta)[None, :]
    return h


@triton.jit
def _tree_rule_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, paths_ptr, state_ptr, out_ptr,
    tokens, depths, groups,
    sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sd_b, sd_t, sp_b, sp_t, ss_b, ss_h, so_b, so_t, so_h,
    scale, eps,
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    bt, head, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, t = bt // tokens, bt % tokens
    key_head = head // groups
    offs_k, offs_v = tl.arange(0, BK), vb * BV + tl.arange(0, BV)
    mask_k, mask_v = offs_k < DK, offs_v < DV
    h = tl.load(
        state_ptr + b * ss_b + head * ss_h + offs_k[:, None] * DV + offs_v[None, :],
        mask=mask_k[:, None] & mask_v[None, :],
        other=0.0,
    )
    path_ptr = paths_ptr + b * sp_b + t * sp_t
    offs_d = tl.arange(0, BD)
    length = tl.sum((tl.load(path_ptr + offs_d, mask=offs_d < depths, other=-1) >= 0).to(tl.int32), axis=0)
    h = _walk(h, path_ptr, length, k_ptr + b * sk_b, v_ptr + b * sv_b, g_ptr + b * sd_b, beta_ptr + b * sd_b,
              key_head, head, sk_t, sk_h, sv_t, sv_h, sd_t, offs_k, mask_k, offs_v, mask_v, eps)  # fmt: skip
    q = tl.load(q_ptr + b * sq_b + t * sq_t + key_head * sq_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + eps) * scale
    out = tl.sum(h * q[:, None], axis=0)
    tl.store(out_ptr + b * so_b + t * so_t + head * so_h + offs_v, out, mask=mask_v)


@triton.jit
def _replay_kernel(
    k_ptr, v_ptr, g_ptr, beta_ptr, path_ptr, count_ptr, state_ptr,
    groups, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sd_b, sd_t, sp_b, ss_b, ss_h, eps,
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    b, head, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_k, offs_v = tl.arange(0, BK), vb * BV + tl.arange(0, BV)
    mask_k, mask_v = offs_k < DK, offs_v < DV
    pointers = state_ptr + b * ss_b + head * ss_h + offs_k[:, None] * DV + offs_v[None, :]
    mask = mask_k[:, None] & mask_v[None, :]
    h = tl.load(pointers, mask=mask, other=0.0)
    length = tl.load(count_ptr + b).to(tl.int32)
    h = _walk(h, path_ptr + b * sp_b, length, k_ptr + b * sk_b, v_ptr + b * sv_b, g_ptr + b * sd_b,
              beta_ptr + b * sd_b, head // groups, head, sk_t, sk_h, sv_t, sv_h, sd_t, offs_k, mask_k, offs_v,
              mask_v, eps)  # fmt: skip
    tl.store(pointers, h, mask=mask)


def _blocks(key_dim: int, value_dim: int) -> tuple[int, int]:
    """(BK, BV): the whole key dim, value columns in blocks of at most 32 (a [128, 32] float32 slice is 32
    registers per thread at 4 warps)."""
    return triton.next_power_of_2(key_dim), min(32, triton.next_power_of_2(value_dim))


def _check_state(state: torch.Tensor) -> None:
    if state.stride(-1) != 1 or state.stride(-2) != state.shape[-1] or state.dtype != torch.float32:
        raise ValueError("the recurrent state must be float32 with contiguous [Dk, Dv] matrices")


def tree_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    paths: torch.Tensor,
    initial: torch.Tensor,
) -> torch.Tensor:
    """`gated_delta_rule.tree_rule` from the layer's tensors: query/key [B, T, Hk, Dk] and value [B, T, H, Dv]
    (strided views are fine), decay/beta [B, T, H] float32, paths [B, T, D], initial [B, H, Dk, Dv] float32.
    Returns outputs [B, T, H, Dv] float32."""
    batch, tokens, key_heads, key_dim = key.shape
    heads, value_dim = value.shape[2], value.shape[3]
    _check_state(initial)
    for t in (query, key, value):
        if t.stride(-1) != 1:
            raise ValueError("query, key and value need contiguous head dims")
    decay, beta, paths = decay.contiguous(), beta.contiguous(), paths.contiguous()
    out = torch.empty(batch, tokens, heads, value_dim, device=value.device, dtype=torch.float32)
    bk, bv = _blocks(key_dim, value_dim)
    depths = paths.shape[-1]
    grid = (batch * tokens, heads, triton.cdiv(value_dim, bv))
    _tree_rule_kernel[grid](
        query, key, value, decay, beta, paths, initial, out,
        tokens, depths, heads // key_heads,
        query.stride(0), query.stride(1), query.stride(2), key.stride(0), key.stride(1), key.stride(2),
        value.stride(0), value.stride(1), value.stride(2), decay.stride(0), decay.stride(1),
        paths.stride(0), paths.stride(1), initial.stride(0), initial.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        key_dim**-0.5, EPS,
        DK=key_dim, DV=value_dim, BK=bk, BV=bv, BD=triton.next_power_of_2(depths),
    )  # fmt: skip
    return out


def replay(
    state: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    path: torch.Tensor,
    count: torch.Tensor,
) -> None:
    """`gated_delta_rule.replay` in place: state [B, H, Dk, Dv] float32 along the first count[b] of path[b]."""
    batch, _, key_heads, key_dim = key.shape
    heads, value_dim = value.shape[2], value.shape[3]
    _check_state(state)
    for t in (key, value):
        if t.stride(-1) != 1:
            raise ValueError("key and value need contiguous head dims")
    decay, beta, path, count = decay.contiguous(), beta.contiguous(), path.contiguous(), count.contiguous()
    bk, bv = _blocks(key_dim, value_dim)
    _replay_kernel[(batch, heads, triton.cdiv(value_dim, bv))](
        key, value, decay, beta, path, count, state,
        heads // key_heads, key.stride(0), key.stride(1), key.stride(2), value.stride(0), value.stride(1),
        value.stride(2), decay.stride(0), decay.stride(1), path.stride(0), state.stride(0), state.stride(1), EPS,
        DK=key_dim, DV=value_dim, BK=bk, BV=bv,
    )  # fmt: skip
