"""Triton kernels behind `ops` on CUDA: each replaces a chain of small torch kernels with one launch.

Rounding follows the torch versions in `ops` step by step (a residual add rounds to the model dtype before it
is normalised, the normalised value rounds before the weight scales it), so either path gives the same
bf16 values up to float32 arithmetic order.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from specdeploy.engine import triton_mla
from specdeploy.engine.triton_launch import dependent_launch, launch_options
from specdeploy.engine.triton_rounding import rounded, rounded_silu


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
    dependent_launch()
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
        **launch_options(),
    )
    return out if residual is None else (out, res_out)


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, inter, stride_xn, BLOCK: tl.constexpr):
    dependent_launch()
    row = tl.program_id(0)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = col < inter
    gate = tl.load(x_ptr + row * stride_xn + col, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_xn + inter + col, mask=mask, other=0.0).to(tl.float32)
    g = gate.to(tl.float32)
    silu = rounded_silu(g, gate.dtype)
    tl.store(out_ptr + row * inter + col, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    inter = gate_up.shape[-1] // 2
    rows = gate_up.reshape(-1, 2 * inter)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(*gate_up.shape[:-1], inter, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(rows.shape[0], triton.cdiv(inter, block))](
        rows, out, inter, rows.stride(0), BLOCK=block, num_warps=4, **launch_options()
    )
    return out


@triton.jit
def _qk_norm_rope_store_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    q_weight_ptr,
    k_weight_ptr,
    cos_ptr,
    sin_ptr,
    slot_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    q_row,  # row and head strides of each view; rows are (batch, token) pairs
    q_head,
    k_row,
    k_head,
    v_row,
    v_head,
    stride_cos_batch,
    tokens,
    heads,
    kv_heads,
    eps,
    D: tl.constexpr,
    R: tl.constexpr,
    ZERO_CENTERED: tl.constexpr,
):
    dependent_launch()
    row = tl.program_id(0)
    head = tl.program_id(1)  # query heads first, then key heads (each also stores its value head)
    b = row // tokens
    t = row % tokens
    dtype = q_out_ptr.dtype.element_ty
    offs = tl.arange(0, D)
    half: tl.constexpr = R // 2
    partner = tl.where(offs < half, offs + half, offs - half)  # where rotate_half takes each dim from
    rotated = offs < R
    is_query = head < heads
    if is_query:
        source = q_ptr + row * q_row + head * q_head
        weight_ptr = q_weight_ptr
    else:
        source = k_ptr + row * k_row + (head - heads) * k_head
        weight_ptr = k_weight_ptr
    x = tl.load(source + offs).to(tl.float32)
    x_partner = tl.load(source + partner, mask=rotated, other=0.0).to(tl.float32)
    w = tl.load(weight_ptr + offs).to(tl.float32)
    w_partner = tl.load(weight_ptr + partner, mask=rotated, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    if ZERO_CENTERED:
        normed = rounded(x * inv * (1.0 + w), dtype)
        normed_partner = rounded(x_partner * inv * (1.0 + w_partner), dtype)
    else:
        normed = rounded(rounded(x * inv, dtype) * w, dtype)
        normed_partner = rounded(rounded(x_partner * inv, dtype) * w_partner, dtype)
    cos = tl.load(cos_ptr + b * stride_cos_batch + t * R + offs, mask=rotated, other=1.0).to(tl.float32)
    sin = tl.load(sin_ptr + b * stride_cos_batch + t * R + offs, mask=rotated, other=0.0).to(tl.float32)
    sign = tl.where(offs < half, -1.0, 1.0)
    out = rounded(rounded(normed * cos, dtype) + rounded(sign * normed_partner * sin, dtype), dtype)
    out = tl.where(rotated, out, normed).to(dtype)
    if is_query:
        group = heads // kv_heads
        index = ((b * kv_heads + head // group) * group + head % group) * tokens + t
        tl.store(q_out_ptr + index * D + offs, out)
    else:
        kv_head = head - heads
        slot = tl.load(slot_ptr + row)
        tl.store(k_cache_ptr + (slot * kv_heads + kv_head) * D + offs, out)
        value = tl.load(v_ptr + row * v_row + kv_head * v_head + offs)
        tl.store(v_cache_ptr + (slot * kv_heads + kv_head) * D + offs, value)


def _row_head_strides(x: torch.Tensor) -> tuple[int, int]:
    """(row, head) strides of a [B, T, heads, D] view whose (B, T) rows are evenly spaced."""
    if (
        x.shape[1] == 1
    ):  # one token per row: rows are batch rows (a view's stride of a size-1 dim is arbitrary)
        return x.stride(0), x.stride(2)
    if x.shape[0] > 1 and x.stride(0) != x.shape[1] * x.stride(1):
        raise ValueError("batch rows of the projection view are not evenly spaced")
    return x.stride(1), x.stride(2)


def qk_norm_rope_store(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    flat_slots: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    zero_centered: bool,
) -> torch.Tensor:
    batch, tokens, heads, dim = q.shape
    kv_heads = k.shape[2]
    q_out = torch.empty(batch, kv_heads, heads // kv_heads, tokens, dim, dtype=q.dtype, device=q.device)
    cos, sin = cos.contiguous(), sin.contiguous()
    _qk_norm_rope_store_kernel[(batch * tokens, heads + kv_heads)](
        q,
        k,
        v,
        q_weight,
        k_weight,
        cos,
        sin,
        flat_slots,
        q_out,
        k_cache,
        v_cache,
        *_row_head_strides(q),
        *_row_head_strides(k),
        *_row_head_strides(v),
        cos.stride(0) if cos.shape[0] > 1 else 0,
        tokens,
        heads,
        kv_heads,
        eps,
        D=dim,
        R=cos.shape[-1],
        ZERO_CENTERED=zero_centered,
        num_warps=1 if dim <= 128 else 2,
        **launch_options(),
    )
    return q_out


# ------------------------------------------------------------------------------------- DDTree build


@triton.jit
def _sort_key(score, index, capacity: tl.constexpr):
    """int64 keys that sort like (score, then lower index first) when sorted in descending order."""
    bits = score.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # monotonic in the float's value
    return (ordered.to(tl.int64) << 32) | (capacity - 1 - index).to(tl.int64)


@triton.jit
def _best_first_tree_kernel(
    top_logp_ptr,  # [B, L, W] float32, sorted descending per depth
    top_token_ptr,  # [B, L, W] int64
    pair_parent_ptr,  # [PAIRS] int32: staircase pairs (i, j) with (i + 1) * (j + 1) <= budget
    pair_rank_ptr,  # [PAIRS] int32
    count_ptr,  # [L] int32: prefixes kept at each depth, min(budget, WIDTH ** depth)
    cand_score_ptr,  # [B, L, K] float32 scratch: each depth's best K prefixes, best first
    cand_parent_ptr,  # [B, L, K] int32 scratch: parent's slot at the previous depth
    cand_token_ptr,  # [B, L, K] int64 scratch
    chosen_ptr,  # [B, L*K] int32 scratch: node index of each chosen candidate, 0 if not chosen
    root_ptr,  # [B] int64
    tokens_ptr,  # [B, N+1] int64 out
    parents_ptr,  # [B, N+1] int64 out
    depths_ptr,  # [B, N+1] int64 out
    valid_ptr,  # [B, N+1] int8 out
    num_pairs,
    DEPTHS: tl.constexpr,
    WIDTH: tl.constexpr,  # tokens per depth, min(budget, vocab)
    K: tl.constexpr,  # prefixes kept per depth: the budget
    KP: tl.constexpr,  # power of two >= K
    PAIRS: tl.constexpr,  # power of two >= num_pairs
    CANDIDATES: tl.constexpr,  # power of two >= DEPTHS * K
    NODES: tl.constexpr,  # power of two >= budget + 1
):
    dependent_launch()
    row = tl.program_id(0)
    logp = top_logp_ptr + row * DEPTHS * WIDTH
    scores = cand_score_ptr + row * DEPTHS * K
    parent_slots = cand_parent_ptr + row * DEPTHS * K
    tokens = cand_token_ptr + row * DEPTHS * K
    slot = tl.arange(0, KP)
    # depth 1: the best tokens themselves
    first = slot < WIDTH
    tl.store(scores + slot, tl.load(logp + slot, mask=first, other=float("-inf")), mask=slot < K)
    tl.store(parent_slots + slot, tl.zeros([KP], dtype=tl.int32), mask=slot < K)
    tokens0 = tl.load(top_token_ptr + row * DEPTHS * WIDTH + slot, mask=first, other=0)
    tl.store(tokens + slot, tokens0, mask=slot < K)
    pair = tl.arange(0, PAIRS)
    pi = tl.load(pair_parent_ptr + pair, mask=pair < num_pairs, other=0)
    pj = tl.load(pair_rank_ptr + pair, mask=pair < num_pairs, other=0)
    for depth in range(1, DEPTHS):  # a loop, not unrolled: one sorting network to compile, not DEPTHS of them
        tl.debug_barrier()  # the previous depth's stores are visible to every thread
        available = tl.load(count_ptr + depth - 1)  # prefixes at the previous depth
        usable = (pair < num_pairs) & (pi < available) & (pj < WIDTH)
        parent_score = tl.load(scores + (depth - 1) * K + pi, mask=usable, other=0.0)
        token_score = tl.load(logp + depth * WIDTH + pj, mask=usable, other=0.0)
        key = _sort_key(parent_score + token_score, pair, PAIRS)
        key = tl.where(usable, key, -(2**63) + 1)
        best = tl.sort(key, descending=True)
        # the first K sorted keys are this depth's best extensions, best first
        best_pair = (PAIRS - 1 - (best & 0xFFFFFFFF)).to(tl.int32)
        keep = (tl.arange(0, PAIRS) < K) & (best > -(2**63) + 1)
        i = tl.load(pair_parent_ptr + best_pair, mask=keep, other=0)
        j = tl.load(pair_rank_ptr + best_pair, mask=keep, other=0)
        value = tl.load(scores + (depth - 1) * K + i, mask=keep, other=0.0) + tl.load(
            logp + depth * WIDTH + j, mask=keep, other=0.0
        )
        out = tl.arange(0, PAIRS)
        tl.store(scores + depth * K + out, tl.where(keep, value, float("-inf")), mask=out < K)
        tl.store(parent_slots + depth * K + out, i, mask=out < K)
        token = tl.load(top_token_ptr + row * DEPTHS * WIDTH + depth * WIDTH + j, mask=keep, other=0)
        tl.store(tokens + depth * K + out, token, mask=out < K)
    tl.debug_barrier()
    # the best `budget` prefixes of all depths; ties go to the shallower (lower candidate index)
    c = tl.arange(0, CANDIDATES)
    in_range = c < DEPTHS * K
    candidate_score = tl.load(scores + c, mask=in_range, other=float("-inf"))
    real = in_range & (candidate_score > float("-inf"))
    key = tl.where(real, _sort_key(candidate_score, c, CANDIDATES), -(2**63) + 1)
    best = tl.sort(key, descending=True)
    best_c = CANDIDATES - 1 - (best & 0xFFFFFFFF)
    taken = (tl.arange(0, CANDIDATES) < K) & (best > -(2**63) + 1)
    chosen = chosen_ptr + row * DEPTHS * K
    tl.store(chosen + c, tl.zeros([CANDIDATES], dtype=tl.int32), mask=in_range)
    tl.debug_barrier()
    tl.store(chosen + best_c, tl.full([CANDIDATES], 1, tl.int32), mask=taken)
    tl.debug_barrier()
    flags = tl.load(chosen + c, mask=in_range, other=0)
    node = tl.cumsum(flags, axis=0)  # depth order: a parent's node index is below its children's
    tl.debug_barrier()
    tl.store(chosen + c, node * flags, mask=in_range)
    # outputs: padding first, then every chosen candidate at its node index
    n = tl.arange(0, NODES)
    out_row = row * (K + 1)
    head = n < K + 1
    root = tl.load(root_ptr + row)
    tl.store(tokens_ptr + out_row + n, tl.where(n == 0, root, 0), mask=head)
    tl.store(parents_ptr + out_row + n, tl.zeros([NODES], dtype=tl.int64), mask=head)
    tl.store(depths_ptr + out_row + n, tl.zeros([NODES], dtype=tl.int64), mask=head)
    tl.store(valid_ptr + out_row + n, (n == 0).to(tl.int8), mask=head)
    tl.debug_barrier()
    picked = in_range & (flags > 0)
    depth_of = c // K
    parent_c = (depth_of - 1) * K + tl.load(parent_slots + c, mask=picked, other=0)
    parent_node = tl.where(
        depth_of == 0, 0, tl.load(chosen + parent_c, mask=picked & (depth_of > 0), other=0)
    )
    tl.store(tokens_ptr + out_row + node, tl.load(tokens + c, mask=picked, other=0), mask=picked)
    tl.store(parents_ptr + out_row + node, parent_node.to(tl.int64), mask=picked)
    tl.store(depths_ptr + out_row + node, (depth_of + 1).to(tl.int64), mask=picked)
    tl.store(valid_ptr + out_row + node, tl.full([CANDIDATES], 1, tl.int8), mask=picked)


@triton.jit
def _expected_lengths_kernel(
    top_logp_ptr,  # [B, L, W] float32, sorted descending per depth
    pair_parent_ptr,  # [PAIRS] int32: staircase pairs (i, j) with (i + 1) * (j + 1) <= K
    pair_rank_ptr,  # [PAIRS] int32
    count_ptr,  # [L] int32: prefixes kept at each depth, min(K, WIDTH ** depth)
    budgets_ptr,  # [NB] int32, each at most K
    scores_ptr,  # [B, L, K] float32 scratch: each depth's best K prefix scores, best first
    sums_ptr,  # [B, CANDIDATES] float32 scratch: running sums of the best path probabilities
    out_ptr,  # [B, NB] float32 out: 1 + the sum of the best `budget` path probabilities
    num_pairs,
    num_budgets,
    DEPTHS: tl.constexpr,
    WIDTH: tl.constexpr,
    K: tl.constexpr,  # the largest budget
    KP: tl.constexpr,
    PAIRS: tl.constexpr,
    CANDIDATES: tl.constexpr,  # power of two >= DEPTHS * K
):
    dependent_launch()
    row = tl.program_id(0)
    logp = top_logp_ptr + row * DEPTHS * WIDTH
    scores = scores_ptr + row * DEPTHS * K
    slot = tl.arange(0, KP)
    tl.store(scores + slot, tl.load(logp + slot, mask=slot < WIDTH, other=float("-inf")), mask=slot < K)
    pair = tl.arange(0, PAIRS)
    pi = tl.load(pair_parent_ptr + pair, mask=pair < num_pairs, other=0)
    pj = tl.load(pair_rank_ptr + pair, mask=pair < num_pairs, other=0)
    for depth in range(1, DEPTHS):  # the tree kernel's staircase, keeping scores only (ties need no order)
        tl.debug_barrier()
        available = tl.load(count_ptr + depth - 1)
        usable = (pair < num_pairs) & (pi < available) & (pj < WIDTH)
        parent_score = tl.load(scores + (depth - 1) * K + pi, mask=usable, other=0.0)
        token_score = tl.load(logp + depth * WIDTH + pj, mask=usable, other=0.0)
        best = tl.sort(tl.where(usable, parent_score + token_score, float("-inf")), descending=True)
        tl.store(scores + depth * K + pair, best, mask=pair < K)
    tl.debug_barrier()
    c = tl.arange(0, CANDIDATES)
    candidate = tl.load(scores + c, mask=c < DEPTHS * K, other=float("-inf"))
    sums = tl.cumsum(tl.exp(tl.sort(candidate, descending=True)), axis=0)
    tl.store(sums_ptr + row * CANDIDATES + c, sums)
    tl.debug_barrier()
    b = tl.arange(0, KP)
    budget = tl.load(budgets_ptr + b, mask=b < num_budgets, other=1)
    total = tl.load(sums_ptr + row * CANDIDATES + budget - 1, mask=b < num_budgets, other=0.0)
    tl.store(out_ptr + row * num_budgets + b, 1 + total, mask=b < num_budgets)


def expected_accept_lengths(top_logp: torch.Tensor, budgets: list[int]) -> torch.Tensor:
    """[B, len(budgets)]: 1 + the summed path probabilities of each budget's best-first tree, in one launch.

    top_logp [B, L, W]: each depth's best min(max(budgets), vocab) log-probabilities, descending."""
    batch, depths, width = top_logp.shape
    device = top_logp.device
    largest = max(budgets)
    pair_parent, pair_rank, counts = tree_constants(largest, width, depths, device)
    key = (tuple(budgets), device)
    if key not in _budget_tensors:  # made on the first call, a CUDA graph's warm-up: not inside a capture
        _budget_tensors[key] = torch.tensor(budgets, dtype=torch.int32, device=device)
    budgets_on_device = _budget_tensors[key]
    candidates = triton.next_power_of_2(depths * largest)
    scores = torch.empty(batch, depths, largest, device=device)
    sums = torch.empty(batch, candidates, device=device)
    out = torch.empty(batch, len(budgets), device=device)
    _expected_lengths_kernel[(batch,)](
        top_logp.contiguous(),
        pair_parent,
        pair_rank,
        counts,
        budgets_on_device,
        scores,
        sums,
        out,
        pair_parent.numel(),
        len(budgets),
        DEPTHS=depths,
        WIDTH=width,
        K=largest,
        KP=triton.next_power_of_2(max(largest, len(budgets))),
        PAIRS=triton.next_power_of_2(max(pair_parent.numel(), largest)),
        CANDIDATES=candidates,
        num_warps=8,
        **launch_options(),
    )
    return out


@triton.jit
def _ancestors_kernel(
    parents_ptr,
    ancestors_ptr,
    paths_ptr,  # [B, SIZE, COLUMNS] int64 out when COLUMNS > 0: `tree.root_paths`
    NODES: tl.constexpr,
    SIZE: tl.constexpr,
    DEPTHS: tl.constexpr,
    COLUMNS: tl.constexpr,
    CP: tl.constexpr,  # power of two >= COLUMNS
):
    dependent_launch()
    row = tl.program_id(0)
    node = tl.program_id(1)
    n = tl.arange(0, NODES)
    seen = n == node
    current = node
    for _ in tl.static_range(DEPTHS):
        current = tl.load(parents_ptr + row * SIZE + current)
        seen = seen | (n == current)
    tl.store(ancestors_ptr + (row * SIZE + node) * SIZE + n, seen.to(tl.int8), mask=n < SIZE)
    if COLUMNS > 0:  # the node's root path: each ancestor at its depth, itself last, -1 after
        depth = tl.sum(seen.to(tl.int32), axis=0) - 1  # counted as root_paths counts it (padding: depth 1)
        c = tl.arange(0, CP)
        path = tl.full([CP], -1, tl.int64)
        current = node
        for step in tl.static_range(DEPTHS + 1):
            path = tl.where(c == depth - step, current, path)
            current = tl.load(parents_ptr + row * SIZE + current)
        tl.store(paths_ptr + (row * SIZE + node) * COLUMNS + c, path, mask=c < COLUMNS)


_constants: dict[tuple[int, int, int, torch.device], tuple[torch.Tensor, ...]] = {}
_budget_tensors: dict[tuple[tuple[int, ...], torch.device], torch.Tensor] = {}


def tree_constants(budget: int, width: int, depths: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """(parent rank, token rank) of the staircase pairs, and the prefixes kept per depth.

    Only pairs with (i + 1) * (j + 1) <= budget can be among the `budget` largest sums of two descending
    lists (at least (i + 1) * (j + 1) sums are as large). Made once, outside any CUDA graph capture.
    """
    key = (budget, width, depths, device)
    if key not in _constants:
        pairs = [(i, j) for i in range(budget) for j in range(min(width, budget // (i + 1)))]
        parent, rank = (
            torch.tensor(col, dtype=torch.int32, device=device) for col in zip(*pairs, strict=True)
        )
        counts = torch.tensor([min(budget, width ** (d + 1)) for d in range(depths)], dtype=torch.int32)
        _constants[key] = (parent, rank, counts.to(device))
    return _constants[key]


def best_first_tree(
    root: torch.Tensor,
    top_logp: torch.Tensor,
    top_tokens: torch.Tensor,
    budget: int,
    out,
    paths: torch.Tensor | None = None,
) -> None:
    """The DDTree tree from each depth's best tokens, into `out` (a `TreeBatch` of `budget` nodes, contiguous
    rows): tokens, parents, depths and validity by one launch, the ancestor relation (and with `paths`
    [B, budget + 1, columns], contiguous, the root paths `tree.root_paths` gives) by another."""
    batch, depths, width = top_logp.shape
    device = top_logp.device
    pair_parent, pair_rank, counts = tree_constants(budget, width, depths, device)
    size = budget + 1
    scores = torch.empty(batch, depths, budget, device=device)
    parent_slots = torch.empty(batch, depths, budget, dtype=torch.int32, device=device)
    cand_tokens = torch.empty(batch, depths, budget, dtype=torch.long, device=device)
    chosen = torch.empty(batch, depths * budget, dtype=torch.int32, device=device)
    assert all(getattr(out, name).is_contiguous() for name in out.FIELDS)
    _best_first_tree_kernel[(batch,)](
        top_logp.contiguous(),
        top_tokens.contiguous(),
        pair_parent,
        pair_rank,
        counts,
        scores,
        parent_slots,
        cand_tokens,
        chosen,
        root,
        out.tokens,
        out.parents,
        out.depths,
        out.valid.view(torch.int8),
        pair_parent.numel(),
        DEPTHS=depths,
        WIDTH=width,
        K=budget,
        KP=triton.next_power_of_2(budget),
        PAIRS=triton.next_power_of_2(pair_parent.numel()),
        CANDIDATES=triton.next_power_of_2(depths * budget),
        NODES=triton.next_power_of_2(size),
        num_warps=8,
        **launch_options(),
    )
    columns = 0 if paths is None else paths.shape[-1]
    assert paths is None or (paths.is_contiguous() and paths.shape[:2] == out.parents.shape)
    _ancestors_kernel[(batch, size)](
        out.parents,
        out.ancestors.view(torch.int8),
        paths if paths is not None else out.parents,
        NODES=triton.next_power_of_2(size),
        SIZE=size,
        DEPTHS=depths,
        COLUMNS=columns,
        CP=max(2, triton.next_power_of_2(columns)),
        num_warps=1,
        **launch_options(),
    )


# -------------------------------------------------------------------------------------- attention


@triton.jit
def _masked_attention_kernel(
    q_ptr,  # [B, Hkv, M, D_MAIN + D_EXTRA]: queries folded by key head, row = group * T + token
    k_ptr,  # [B, C, Hkv, D_MAIN + D_EXTRA] key cache (slot-major)
    v_ptr,  # [B, C, Hkv, >= DV] value cache; MLA's values are the keys' first DV channels
    vis_ptr,  # [B|1, T, S] bool: who may see which slot
    out_ptr,  # one split: [B, T, Hkv * G * DV] in the model dtype; several: [SPLITS, B, Hkv, M, DV] fp32
    max_ptr,  # [SPLITS, B, Hkv, M] running max of each split (several splits only)
    sum_ptr,  # [SPLITS, B, Hkv, M] softmax denominator of each split
    k_batch, k_slot, k_head,
    v_batch, v_slot, v_head,
    vis_batch, vis_token,
    tokens, rows, window, kv_heads, split_len, scale,
    D_MAIN: tl.constexpr, D_EXTRA: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE: tl.constexpr, IEEE: tl.constexpr,
    KEYS_ARE_VALUES: tl.constexpr,
):  # fmt: skip
    dependent_launch()
    bh = tl.program_id(0)
    b = bh // kv_heads
    h = bh % kv_heads
    row = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    split = tl.program_id(2)
    row_ok = row < rows
    token = row % tokens
    width: tl.constexpr = D_MAIN + D_EXTRA
    dm = tl.arange(0, D_MAIN)
    q_rows = q_ptr + (bh * rows + row)[:, None] * width
    q = tl.load(q_rows + dm[None, :], mask=row_ok[:, None], other=0.0)
    if D_EXTRA > 0:
        de = tl.arange(0, D_EXTRA)
        q_extra = tl.load(q_rows + D_MAIN + de[None, :], mask=row_ok[:, None], other=0.0)
    dv = tl.arange(0, DV)
    running_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV], tl.float32)
    start = split * split_len
    end = tl.minimum(start + split_len, window)
    for n0 in range(start, end, BLOCK_N):
        col = n0 + tl.arange(0, BLOCK_N)
        col_ok = col < end
        keys = k_ptr + b * k_batch + col[:, None] * k_slot + h * k_head
        k = tl.load(keys + dm[None, :], mask=col_ok[:, None], other=0.0)
        if IEEE:
            scores = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            scores = tl.dot(q, tl.trans(k))
        if D_EXTRA > 0:
            k_extra = tl.load(keys + D_MAIN + de[None, :], mask=col_ok[:, None], other=0.0)
            if IEEE:
                scores += tl.dot(q_extra, tl.trans(k_extra), input_precision="ieee")
            else:
                scores += tl.dot(q_extra, tl.trans(k_extra))
        visible = tl.load(
            vis_ptr + b * vis_batch + token[:, None] * vis_token + col[None, :],
            mask=row_ok[:, None] & col_ok[None, :],
            other=0,
        )
        scores = tl.where(visible != 0, scores * scale, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)  # a row that saw nothing yet
        p = tl.exp(scores - safe_max[:, None])
        alpha = tl.exp(running_max - safe_max)
        running_sum = running_sum * alpha + tl.sum(p, axis=1)
        if KEYS_ARE_VALUES:  # MLA: the values are the keys' latent part, already loaded
            v = k
        else:
            v = tl.load(v_ptr + b * v_batch + col[:, None] * v_slot + h * v_head + dv[None, :],
                        mask=col_ok[:, None], other=0.0)  # fmt: skip
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        running_max = new_max
    if SINGLE:
        group = rows // tokens
        head = h * group + row // tokens
        out = out_ptr + ((b * tokens + token) * kv_heads * group + head)[:, None] * DV + dv[None, :]
        result = acc / tl.where(running_sum > 0, running_sum, 1.0)[:, None]
        tl.store(out, result.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        at = (split * tl.num_programs(0) + bh) * rows + row
        tl.store(out_ptr + at[:, None] * DV + dv[None, :], acc, mask=row_ok[:, None])
        tl.store(max_ptr + at, running_max, mask=row_ok)
        tl.store(sum_ptr + at, running_sum, mask=row_ok)


@triton.jit
def _combine_splits_kernel(
    part_ptr, max_ptr, sum_ptr, out_ptr, heads_rows, rows, tokens, kv_heads, splits,
    SPLITS: tl.constexpr, DV: tl.constexpr,
):  # fmt: skip
    dependent_launch()
    index = tl.program_id(0)  # (batch * key head) * rows + row
    bh = index // rows
    row = index % rows
    b = bh // kv_heads
    h = bh % kv_heads
    split = tl.arange(0, SPLITS)
    used = split < splits
    maxes = tl.load(max_ptr + split * heads_rows + index, mask=used, other=float("-inf"))
    top = tl.max(maxes, axis=0)
    weight = tl.where(maxes == float("-inf"), 0.0, tl.exp(maxes - top))
    total = tl.sum(weight * tl.load(sum_ptr + split * heads_rows + index, mask=used, other=0.0), axis=0)
    dv = tl.arange(0, DV)
    parts = tl.load(
        part_ptr + (split * heads_rows + index)[:, None] * DV + dv[None, :], mask=used[:, None], other=0.0
    )
    result = tl.sum(parts * weight[:, None], axis=0) / total
    group = rows // tokens
    token = row % tokens
    head = h * group + row // tokens
    tl.store(
        out_ptr + ((b * tokens + token) * kv_heads * group + head) * DV + dv,
        result.to(out_ptr.dtype.element_ty),
    )


def masked_attention_fits(width: int, value_dim: int) -> bool:
    """Head widths the kernel takes: matrix-unit tiles need 16+, and powers of two (or one plus a smaller one)."""
    extra = width - (1 << (width.bit_length() - 1))
    extra_fits = extra == 0 or (extra >= 16 and not extra & (extra - 1))
    return width >= 16 and value_dim >= 16 and extra_fits and not value_dim & (value_dim - 1)


class AttentionTiles(NamedTuple):
    """The masked-attention kernel's launch shape: query rows and keys per tile, warps, pipeline stages."""

    block_m: int
    block_n: int
    warps: int
    stages: int


# Query rows from which MLA's latent head (576 wide) takes 64-row tiles of 8 warps: from 4112 rows on (a 257-token
# tree of 16 heads, 65 tokens of 64) they took 0.63-0.70x the 16-row tiles' time on one H100, at 1040-1088 rows
# 1.03-1.06x (benchmarks/results/h100-2026-12-06-attention-tiles/); in between not measured
MLA_WIDE_TILE_ROWS = 2048


def default_attention_tiles(rows: int, width: int, element_bytes: int) -> AttentionTiles:
    """The tiles `benchmarks/attention_tile_sweep.py` found fastest, or within 25% of it, on one H100 for a DFlash
    block and DDTree trees (17, 65 and 257 tokens over 768 slots; benchmarks/results/h100-2026-12-06-attention-tiles/):
    MLA's 576-wide latent head 16-row tiles of 32 keys, 4 warps, 2 stages, and from MLA_WIDE_TILE_ROWS rows 64 x 64
    in 8 warps (64-row tiles in 3 stages need more shared memory than the 227 KiB of an H100 or H200); 256-wide
    heads 64 x 32, 4 warps, 2 stages; 128-wide 64 x 32, 4 warps, 3 stages. Up to 16 rows (one query row block:
    decode), at other widths, and for float32 queries and keys (`element_bytes` 4: twice the shared memory; MLA's
    64-row tiles do not fit), the tiles before that sweep, which ran in bfloat16."""
    wide, broad = width > 256, width == 256
    if rows > 16 and element_bytes <= 2:
        if wide:
            return (
                AttentionTiles(64, 64, 8, 2) if rows >= MLA_WIDE_TILE_ROWS else AttentionTiles(16, 32, 4, 2)
            )
        if broad:
            return AttentionTiles(64, 32, 4, 2)
        if width == 128:
            return AttentionTiles(64, 32, 4, 3)
    # the tiles before that sweep
    block_m = 16 if rows <= 16 or wide else 32 if broad else 64
    return AttentionTiles(block_m, 32 if wide or broad else 64, 4, 2 if wide or broad else 3)


def masked_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    visible: torch.Tensor,
    scale: float,
    tiles: AttentionTiles | None = None,
    value_up: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of folded queries q [B, Hkv, G, T, D] over the cache window keys [B, S, Hkv, D] and values
    [B, S, Hkv, Dv] where visible [B|1, T, S] allows -> [B, T, Hkv * G * Dv]. Long windows are split over
    several programs (flash-decoding) so that one query still keeps the GPU busy. `tiles` overrides
    `default_attention_tiles` (benchmarks/attention_tile_sweep.py measures the choices).

    MLA (one latent head, Hkv = 1) may pass its value up-projection value_up [G, V, Dv]: each head's output is
    mapped out through it -> [B, T, G * V], for up to `triton_mla.COMBINE_UP_HEAD_ROWS` (head, row) pairs in the
    splits' combine (`triton_mla.combine_up`), for more by a batched matmul after it."""
    batch, kv_heads, group, tokens, width = q.shape
    window, value_dim = keys.shape[1], values.shape[-1]
    rows = group * tokens
    main = 1 << (width.bit_length() - 1)  # MLA's 576 = 512 + 64: two power-of-two parts
    extra = width - main
    block_m, block_n, warps, stages = tiles or default_attention_tiles(rows, width, q.element_size())
    row_tiles = triton.cdiv(rows, block_m)
    programs = batch * kv_heads * row_tiles
    splits = max(1, min(triton.cdiv(264, programs), triton.cdiv(window, block_n)))
    split_len = triton.cdiv(triton.cdiv(window, splits), block_n) * block_n
    splits = triton.cdiv(window, split_len)
    if value_up is not None and kv_heads != 1:
        raise ValueError("a value up-projection follows MLA's single latent head only")
    q = q.reshape(batch, kv_heads, rows, width)
    if q.stride(-1) != 1 or not q.is_contiguous():
        q = q.contiguous()
    # up to COMBINE_UP_HEAD_ROWS (head, row) pairs map their output out through value_up in the splits' combine;
    # more take a matmul
    up_in_combine = value_up is not None and batch * tokens * group <= triton_mla.COMBINE_UP_HEAD_ROWS
    single = splits == 1 and not up_in_combine
    if single:
        out = torch.empty(batch, tokens, kv_heads * group * value_dim, dtype=q.dtype, device=q.device)
        parts = maxes = sums = out
    else:
        parts = torch.empty(splits, batch * kv_heads, rows, value_dim, device=q.device)
        maxes = torch.empty(splits, batch * kv_heads, rows, device=q.device)
        sums = torch.empty(splits, batch * kv_heads, rows, device=q.device)
    vis_batch = visible.stride(0) if visible.shape[0] > 1 else 0
    # MLA attends over the latent with itself as values: one load of each key block serves both products
    keys_are_values = (
        value_dim == main and values.data_ptr() == keys.data_ptr() and values.stride() == keys.stride()
    )
    _masked_attention_kernel[(batch * kv_heads, row_tiles, splits)](
        q, keys, values, visible, parts, maxes, sums,
        keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2),
        vis_batch, visible.stride(1),
        tokens, rows, window, kv_heads, split_len, scale,
        D_MAIN=main, D_EXTRA=extra, DV=value_dim, BLOCK_M=block_m, BLOCK_N=block_n, SINGLE=single,
        IEEE=q.dtype == torch.float32,  # float32 stays exact: Triton's default float32 dot rounds to TF32
        KEYS_ARE_VALUES=keys_are_values, num_warps=warps, num_stages=stages,
        **launch_options(),
    )  # fmt: skip
    if up_in_combine:
        return triton_mla.combine_up(parts, maxes, sums, value_up, tokens)
    if not single:
        out = torch.empty(batch, tokens, kv_heads * group * value_dim, dtype=q.dtype, device=q.device)
        _combine_splits_kernel[(batch * kv_heads * rows,)](
            parts, maxes, sums, out, batch * kv_heads * rows, rows, tokens, kv_heads, splits,
            SPLITS=1 << (splits - 1).bit_length(), DV=value_dim, num_warps=4,
            **launch_options(),
        )  # fmt: skip
    if value_up is not None:
        out = torch.einsum("btgr,gvr->btgv", out.view(batch, tokens, group, value_dim), value_up)
        return out.reshape(batch, tokens, -1)
    return out
