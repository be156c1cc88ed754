"""Triton kernels of the gated delta rule: `tree_rule`, `replay` and `chain_rule` of `gated_delta_rule` on CUDA.

Each tree program owns one (token, value head, block of value columns): the delta rule is independent per
value column, so a [Dk, BV] slice of the state stays in registers while the program walks the token's root
path from the committed state. No per-token state is ever written to memory, and the shapes are fixed, so a
verification with recurrent layers is captured in a CUDA graph. A prefill
chunk (`chain_rule`) has one program per (row, value head, block) walking the whole chain: each token's output
on the way, the final state at the end. The walks' arithmetic follows the torch reference step by step (L2
norms with eps inside the root, decay, recall, corrected write) in float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdeploy.engine.triton_launch import dependent_launch, launch_options
from specdeploy.engine.triton_rounding import rounded

EPS = 1e-6  # gated_delta_rule.l2norm's
# The tree rule's launch shape, (value columns per program, warps); None: `_blocks`' columns and TREE_WARPS. A
# module setting so that a benchmark can time or run a whole model with another (benchmarks/gdn_tree_rule_tiles.py).
TREE_TILES: tuple[int, int] | None = None
# One warp per walk: on one H100 it took Qwen3.6-27B's budget-16/64/128 trees in 22/66/137 us against 34/113/245
# at 4 warps, and tiny-hybrid's in 7.3/7.9/8.9 against 8.9/10.1/14.4 (32 columns a program; 16 as fast; results
# in benchmarks/results/h100-2026-12-05-gdn-tiles/)
TREE_WARPS = 1


@triton.jit
def _inputs(node, key_ptr, value_ptr, decay_ptr, beta_ptr, key_head, head, sk_t, sk_h, sv_t, sv_h, sd_t, offs_k,
            mask_k, offs_v, mask_v, eps):  # fmt: skip
    """The token at index `node`'s inputs to `gated_delta_rule.delta_step`: (its key L2-normalised, its value
    columns, its decay factor, beta). Independent of the state: a walk loads the next token's while it computes."""
    k = tl.load(key_ptr + node * sk_t + key_head * sk_h + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + eps)
    v = tl.load(value_ptr + node * sv_t + head * sv_h + offs_v, mask=mask_v, other=0.0).to(tl.float32)
    decay = tl.exp(tl.load(decay_ptr + node * sd_t + head))
    beta = tl.load(beta_ptr + node * sd_t + head)
    return k, v, decay, beta


@triton.jit
def _update(h, k, v, decay, beta):
    """h advanced by one token (`_inputs`): decayed, then the corrected write along the key."""
    decayed = h * decay
    recalled = tl.sum(decayed * k[:, None], axis=0)
    return decayed + k[:, None] * ((v - recalled) * beta)[None, :]


@triton.jit
def _walk(h, path_ptr, length, key_ptr, value_ptr, decay_ptr, beta_ptr, key_head, head, sk_t, sk_h, sv_t, sv_h,
          sd_t, offs_k, mask_k, offs_v, mask_v, eps):  # fmt: skip
    """h advanced along the first `length` token indices at path_ptr. Software-pipelined: each step's loads are
    issued before the step before it computes, and each index two steps ahead (a walk is a chain of dependent
    loads otherwise: index, then key; on one GPU warp each, the load latency dominated the walk)."""
    node = tl.load(path_ptr, mask=length > 0, other=0)
    k, v, decay, beta = _inputs(node, key_ptr, value_ptr, decay_ptr, beta_ptr, key_head, head, sk_t, sk_h, sv_t,
                                sv_h, sd_t, offs_k, mask_k, offs_v, mask_v, eps)  # fmt: skip
    following = tl.load(path_ptr + 1, mask=length > 1, other=0)
    for d in range(0, length):
        after = tl.load(path_ptr + d + 2, mask=d + 2 < length, other=0)
        k_next, v_next, decay_next, beta_next = _inputs(following, key_ptr, value_ptr, decay_ptr, beta_ptr,
                                                        key_head, head, sk_t, sk_h, sv_t, sv_h, sd_t, offs_k,
                                                        mask_k, offs_v, mask_v, eps)  # fmt: skip
        h = _update(h, k, v, decay, beta)
        k, v, decay, beta, following = k_next, v_next, decay_next, beta_next, after
    return h


@triton.jit
def _read(h, query_ptr, offs_k, mask_k, scale, eps):
    """The output h^T q of the query at query_ptr, L2-normalised and scaled as `rule_inputs` does."""
    q = tl.load(query_ptr + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + eps) * scale
    return tl.sum(h * q[:, None], axis=0)


@triton.jit
def _tree_rule_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, paths_ptr, state_ptr, out_ptr,
    tokens, depths, groups,
    sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sd_b, sd_t, sp_b, sp_t, ss_b, ss_h, so_b, so_t, so_h,
    scale, eps,
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BD: tl.constexpr,
):  # fmt: skip
    dependent_launch()
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
    out = _read(h, q_ptr + b * sq_b + t * sq_t + key_head * sq_h, offs_k, mask_k, scale, eps)
    tl.store(out_ptr + b * so_b + t * so_t + head * so_h + offs_v, out, mask=mask_v)


@triton.jit
def _replay_kernel(
    k_ptr, v_ptr, g_ptr, beta_ptr, path_ptr, count_ptr, state_ptr, rows,
    groups, sk_l, sk_b, sk_t, sk_h, sv_l, sv_b, sv_t, sv_h, sd_l, sd_b, sd_t, sp_b, ss_l, ss_b, ss_h, eps,
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    dependent_launch()
    lb, head, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    layer, b = lb // rows, lb % rows  # every layer in one launch: rows share their path across layers
    offs_k, offs_v = tl.arange(0, BK), vb * BV + tl.arange(0, BV)
    mask_k, mask_v = offs_k < DK, offs_v < DV
    pointers = state_ptr + layer * ss_l + b * ss_b + head * ss_h + offs_k[:, None] * DV + offs_v[None, :]
    mask = mask_k[:, None] & mask_v[None, :]
    h = tl.load(pointers, mask=mask, other=0.0)
    length = tl.load(count_ptr + b).to(tl.int32)
    h = _walk(h, path_ptr + b * sp_b, length, k_ptr + layer * sk_l + b * sk_b, v_ptr + layer * sv_l + b * sv_b,
              g_ptr + layer * sd_l + b * sd_b, beta_ptr + layer * sd_l + b * sd_b, head // groups, head, sk_t, sk_h,
              sv_t, sv_h, sd_t, offs_k, mask_k, offs_v, mask_v, eps)  # fmt: skip
    tl.store(pointers, h, mask=mask)


@triton.jit
def _chain_rule_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, state_ptr, out_ptr,
    tokens, groups, sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sd_b, sd_t, ss_b, ss_h, so_b, so_t, so_h,
    scale, eps,
    DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    dependent_launch()
    b, head, vb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    key_head = head // groups
    offs_k, offs_v = tl.arange(0, BK), vb * BV + tl.arange(0, BV)
    mask_k, mask_v = offs_k < DK, offs_v < DV
    pointers = state_ptr + b * ss_b + head * ss_h + offs_k[:, None] * DV + offs_v[None, :]
    mask = mask_k[:, None] & mask_v[None, :]
    h = tl.load(pointers, mask=mask, other=0.0)
    k_ptr, v_ptr, g_ptr, beta_ptr = k_ptr + b * sk_b, v_ptr + b * sv_b, g_ptr + b * sd_b, beta_ptr + b * sd_b
    k, v, decay, beta = _inputs(0, k_ptr, v_ptr, g_ptr, beta_ptr, key_head, head, sk_t, sk_h, sv_t, sv_h, sd_t,
                                offs_k, mask_k, offs_v, mask_v, eps)  # fmt: skip
    for t in range(0, tokens):
        # the next token's inputs load while this one computes (the last step loads its own again, unused)
        k_next, v_next, decay_next, beta_next = _inputs(tl.minimum(t + 1, tokens - 1), k_ptr, v_ptr, g_ptr, beta_ptr,
                                                        key_head, head, sk_t, sk_h, sv_t, sv_h, sd_t, offs_k, mask_k,
                                                        offs_v, mask_v, eps)  # fmt: skip
        h = _update(h, k, v, decay, beta)
        k, v, decay, beta = k_next, v_next, decay_next, beta_next
        out = _read(h, q_ptr + b * sq_b + t * sq_t + key_head * sq_h, offs_k, mask_k, scale, eps)
        tl.store(out_ptr + b * so_b + t * so_t + head * so_h + offs_v, out, mask=mask_v)
    tl.store(pointers, h, mask=mask)


def _blocks(key_dim: int, value_dim: int) -> tuple[int, int]:
    """(BK, BV): the whole key dim, value columns in blocks of at most 32 (a [128, 32] float32 slice is 32
    registers per thread at 4 warps, 128 at the tree walk's one)."""
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
    Returns outputs [B, T, H, Dv] float32, walked (launched at `TREE_TILES` when set)."""
    batch, tokens, key_heads, key_dim = key.shape
    heads, value_dim = value.shape[2], value.shape[3]
    _check_state(initial)
    for t in (query, key, value):
        if t.stride(-1) != 1:
            raise ValueError("query, key and value need contiguous head dims")
    # decay/beta are the record's slices (strided when a step verifies fewer tokens than it holds): no copy
    if decay.stride(-1) != 1 or decay.stride() != beta.stride():
        raise ValueError("decay and beta need one layout with contiguous heads")
    paths = paths.contiguous()
    out = torch.empty(batch, tokens, heads, value_dim, device=value.device, dtype=torch.float32)
    bk, bv = _blocks(key_dim, value_dim)
    depths = paths.shape[-1]
    args = (
        query, key, value, decay, beta, paths, initial, out,
        tokens, depths, heads // key_heads,
        query.stride(0), query.stride(1), query.stride(2), key.stride(0), key.stride(1), key.stride(2),
        value.stride(0), value.stride(1), value.stride(2), decay.stride(0), decay.stride(1),
        paths.stride(0), paths.stride(1), initial.stride(0), initial.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        key_dim**-0.5, EPS,
    )  # fmt: skip
    bv, warps = TREE_TILES or (bv, TREE_WARPS)
    _tree_rule_kernel[(batch * tokens, heads, triton.cdiv(value_dim, bv))](
        *args,
        DK=key_dim,
        DV=value_dim,
        BK=bk,
        BV=bv,
        BD=triton.next_power_of_2(depths),
        num_warps=warps,
        **launch_options(),
    )
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
    """`gated_delta_rule.replay` in place: state [B, H, Dk, Dv] float32 along the first count[b] of path[b]. With
    a leading layer dim on state [L, B, ...], key, value [L, B, T, heads, dim] and decay/beta [L, B, T, H],
    every layer in one launch."""
    if state.dim() == 4:
        state, key, value, decay, beta = (t[None] for t in (state, key, value, decay, beta))
    layers, batch, _, key_heads, key_dim = key.shape
    heads, value_dim = value.shape[3], value.shape[4]
    _check_state(state)
    if (
        key.stride(-1) != 1
        or value.stride(-1) != 1
        or decay.stride(-1) != 1
        or decay.stride() != beta.stride()
    ):
        raise ValueError("key, value, decay and beta need contiguous last dims (decay and beta one layout)")
    path, count = path.contiguous(), count.contiguous()
    bk, bv = _blocks(key_dim, value_dim)
    _replay_kernel[(layers * batch, heads, triton.cdiv(value_dim, bv))](
        key, value, decay, beta, path, count, state, batch, heads // key_heads,
        *key.stride()[:4], *value.stride()[:4], *decay.stride()[:3], path.stride(0), *state.stride()[:3], EPS,
        DK=key_dim, DV=value_dim, BK=bk, BV=bv,
        **launch_options(),
    )  # fmt: skip


def chain_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> torch.Tensor:
    """`gated_delta_rule.chain_rule` (or `chunked_rule`) from the layer's tensors in one launch, the final state
    written into `state` [B, H, Dk, Dv] float32 in place: query/key [B, T, Hk, Dk] and value [B, T, H, Dv]
    (strided views are fine), decay/beta [B, T, H] float32. Returns outputs [B, T, H, Dv] float32.

    Each program walks the T tokens in order with its state slice in registers: O(T) work, no T x T terms.
    """
    batch, tokens, key_heads, key_dim = key.shape
    heads, value_dim = value.shape[2], value.shape[3]
    _check_state(state)
    if any(t.stride(-1) != 1 for t in (query, key, value, decay)) or decay.stride() != beta.stride():
        raise ValueError(
            "query, key, value, decay and beta need contiguous last dims (decay and beta one layout)"
        )
    out = torch.empty(batch, tokens, heads, value_dim, device=value.device, dtype=torch.float32)
    bk, bv = _blocks(key_dim, value_dim)
    _chain_rule_kernel[(batch, heads, triton.cdiv(value_dim, bv))](
        query, key, value, decay, beta, state, out, tokens, heads // key_heads,
        *query.stride()[:3], *key.stride()[:3], *value.stride()[:3], *decay.stride()[:2], *state.stride()[:2],
        *out.stride()[:3], key_dim**-0.5, EPS,
        DK=key_dim, DV=value_dim, BK=bk, BV=bv,
        **launch_options(),
    )  # fmt: skip
    return out


# --------------------------------------------------------------------------- the layer's elementwise work


@triton.jit
def _gates_kernel(
    a_ptr, b_ptr, a_log_ptr, dt_bias_ptr, decay_ptr, beta_ptr, tokens, heads,
    sa_b, sa_t, sb_b, sb_t, sd_b, sd_t, BH: tl.constexpr,
):  # fmt: skip
    dependent_launch()
    row = tl.program_id(0)
    bi, t = row // tokens, row % tokens
    offs = tl.arange(0, BH)
    mask = offs < heads
    a = tl.load(a_ptr + bi * sa_b + t * sa_t + offs, mask=mask, other=0.0).to(tl.float32)
    x = a + tl.load(dt_bias_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))  # torch's softplus, threshold 20
    decay = -tl.exp(tl.load(a_log_ptr + offs, mask=mask, other=0.0).to(tl.float32)) * softplus
    tl.store(decay_ptr + bi * sd_b + t * sd_t + offs, decay, mask=mask)
    b = tl.load(b_ptr + bi * sb_b + t * sb_t + offs, mask=mask, other=0.0)
    beta = (
        tl.sigmoid(b.to(tl.float32)).to(b.dtype).to(tl.float32)
    )  # sigmoid in the model dtype, as torch does
    tl.store(beta_ptr + bi * sd_b + t * sd_t + offs, beta, mask=mask)


def gates(
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
) -> None:
    """decay = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b), float32, into decay/beta [B, T, H]
    (their last dims contiguous) from a and b [B, T, H]."""
    batch, tokens, heads = a.shape
    a, b = (t if t.stride(-1) == 1 else t.contiguous() for t in (a, b))
    if decay.stride(-1) != 1 or decay.stride() != beta.stride():
        raise ValueError("gates need decay and beta of one layout, heads contiguous")
    _gates_kernel[(batch * tokens,)](
        a, b, a_log, dt_bias, decay, beta, tokens, heads, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        decay.stride(0), decay.stride(1), BH=triton.next_power_of_2(heads),
        **launch_options(),
    )  # fmt: skip


@triton.jit
def _conv_kernel(
    state_ptr, mixed_ptr, windows_ptr, weight_ptr, out_ptr, tokens, channels, history,
    ss_b, ss_t, sm_b, sm_t, sw_b, sw_t, so_b, so_t, WIDTH: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    dependent_launch()
    row, cb = tl.program_id(0), tl.program_id(1)
    bi, t = row // tokens, row % tokens
    offs = cb * BC + tl.arange(0, BC)
    mask = offs < channels
    acc = tl.zeros([BC], dtype=tl.float32)
    for tap in tl.static_range(WIDTH):
        column = tl.load(windows_ptr + bi * sw_b + t * sw_t + tap) + tl.zeros([BC], dtype=tl.int64)
        committed = column < history  # the committed conv inputs, then the new tokens'
        from_state = tl.load(state_ptr + bi * ss_b + column * ss_t + offs, mask=mask & committed, other=0.0)
        new = tl.load(
            mixed_ptr + bi * sm_b + (column - history) * sm_t + offs, mask=mask & ~committed, other=0.0
        )
        x = tl.where(committed, from_state, new).to(tl.float32)
        acc += x * tl.load(weight_ptr + offs * WIDTH + tap, mask=mask, other=0.0).to(tl.float32)
    out = acc * tl.sigmoid(acc)
    tl.store(out_ptr + bi * so_b + t * so_t + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def conv(
    state: torch.Tensor, mixed: torch.Tensor, windows: torch.Tensor, weight: torch.Tensor, out: torch.Tensor
) -> None:
    """`gated_deltanet.path_conv` over [state | mixed] without joining them: state [B, W-1, C], mixed
    [B, T, C], windows [B|1, T, W], weight [C, 1, W] -> out [B, T, C] (channels contiguous everywhere)."""
    batch, tokens, channels = mixed.shape
    width = windows.shape[-1]
    if any(t.stride(-1) != 1 for t in (state, mixed, out)) or not weight.is_contiguous():
        raise ValueError("conv needs contiguous channels and a contiguous weight")
    windows = windows.contiguous()
    block = min(1024, triton.next_power_of_2(channels))
    _conv_kernel[(batch * tokens, triton.cdiv(channels, block))](
        state, mixed, windows, weight, out, tokens, channels, state.shape[1], state.stride(0), state.stride(1),
        mixed.stride(0), mixed.stride(1), windows.stride(0) if windows.shape[0] > 1 else 0, windows.stride(1),
        out.stride(0), out.stride(1), WIDTH=width, BC=block,
        **launch_options(),
    )  # fmt: skip


@triton.jit
def _gated_norm_kernel(
    x_ptr, gate_ptr, weight_ptr, out_ptr, heads, sg_row, sg_h, eps,
    D: tl.constexpr, BD: tl.constexpr, WEIGHT_FP32: tl.constexpr,
):  # fmt: skip
    dependent_launch()
    row = tl.program_id(0)  # (token, head)
    token, head = row // heads, row % heads
    offs = tl.arange(0, BD)
    mask = offs < D
    dtype = out_ptr.dtype.element_ty
    # the rule's output, rounded
    x = rounded(tl.load(x_ptr + row * D + offs, mask=mask, other=0.0), dtype)
    normed = (x * tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)).to(dtype)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0)
    y = w.to(tl.float32) * normed.to(tl.float32)
    if not WEIGHT_FP32:
        y = rounded(y, dtype)  # the weight product rounds in the model dtype
    g = tl.load(gate_ptr + token * sg_row + head * sg_h + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * D + offs, (y * (g * tl.sigmoid(g))).to(dtype), mask=mask)


def gated_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype
) -> torch.Tensor:
    """`GatedRMSNorm` of the rule's float32 output x [B, T, H, D] (rounded to `dtype` first, as the layer does)
    with gate [B, T, H, D] (a strided view is fine): [B, T, H * D] in `dtype`."""
    batch, tokens, heads, dim = x.shape
    x = x.contiguous()
    if gate.stride(-1) != 1 or (batch > 1 and tokens > 1 and gate.stride(0) != tokens * gate.stride(1)):
        raise ValueError("the gate needs a contiguous head dim and evenly spaced tokens")
    out = torch.empty(batch, tokens, heads * dim, dtype=dtype, device=x.device)
    row_stride = gate.stride(0) if tokens == 1 else gate.stride(1)
    _gated_norm_kernel[(batch * tokens * heads,)](
        x, gate, weight, out, heads, row_stride, gate.stride(2), eps,
        D=dim, BD=triton.next_power_of_2(dim), WEIGHT_FP32=weight.dtype == torch.float32,
        **launch_options(),
    )  # fmt: skip
    return out


@triton.jit
def _conv_commit_kernel(
    conv_ptr, inputs_ptr, path_ptr, count_ptr, rows, channels, path_len,
    sc_l, sc_b, sc_t, si_l, si_b, si_t, sp_b, HISTORY: tl.constexpr, BC: tl.constexpr,
):  # fmt: skip
    dependent_launch()
    lb, cb = tl.program_id(0), tl.program_id(1)
    layer, bi = lb // rows, lb % rows
    conv_ptr += layer * sc_l + bi * sc_b
    inputs_ptr += layer * si_l + bi * si_b
    offs = cb * BC + tl.arange(0, BC)
    mask = offs < channels
    count = tl.load(count_ptr + bi)
    for j in tl.static_range(HISTORY):  # ascending: column j reads column count + j >= j, not yet written
        position = count + j + tl.zeros([BC], dtype=tl.int64)
        committed = position < HISTORY
        step = tl.minimum(tl.maximum(position - HISTORY, 0), path_len - 1)
        node = tl.load(path_ptr + bi * sp_b + step)
        old = tl.load(conv_ptr + position * sc_t + offs, mask=mask & committed, other=0.0)
        new = tl.load(inputs_ptr + node * si_t + offs, mask=mask & ~committed, other=0.0)
        tl.store(conv_ptr + j * sc_t + offs, tl.where(committed, old, new), mask=mask)


def conv_commit(conv: torch.Tensor, inputs: torch.Tensor, path: torch.Tensor, count: torch.Tensor) -> None:
    """conv [B, W-1, C] in place: the last W-1 inputs of [conv | inputs at the first count[b] of path[b]]. With a
    leading layer dim on conv and inputs [L, B, ...], every layer in one launch."""
    if conv.dim() == 3:
        conv, inputs = conv[None], inputs[None]
    layers, batch, history, channels = conv.shape
    path, count = path.contiguous(), count.contiguous()
    block = min(1024, triton.next_power_of_2(channels))
    _conv_commit_kernel[(layers * batch, triton.cdiv(channels, block))](
        conv, inputs, path, count, batch, channels, path.shape[1], *conv.stride()[:3], *inputs.stride()[:3],
        path.stride(0), HISTORY=history, BC=block,
        **launch_options(),
    )  # fmt: skip
