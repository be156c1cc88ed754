"""Triton kernels of a decoding step's bookkeeping: the accept walk and the commit, a few launches instead of ~50.

On a GPU a small model's step is bound by its launches (the zoo's pairs: about 2 us each on an H200), and the
torch versions of these stages (`tree.walk`, `StepRunner._commit`) are chains of small index operations. Each
kernel here does one of those chains for every row at once, with the same results, and nothing synchronises
with the host, so the stages stay capturable as CUDA graphs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specdeploy.engine.triton_launch import dependent_launch, launch_options


def _width(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


@triton.jit
def _walk_kernel(
    tokens_ptr,  # [B, S] int64, S = N + 1 tree indices, the root first
    parents_ptr,  # [B, S] int64
    depths_ptr,  # [B, S] int64
    valid_ptr,  # [B, S] int8
    ancestors_ptr,  # [B, S, S] int8
    target_ptr,  # [B, S] int64: the target's token after each index
    path_ptr,  # [B, P] int64 out, P = depth limit + 1 (rows `path_stride` apart)
    length_ptr,  # [B] int64 out
    bonus_ptr,  # [B] int64 out
    size,  # S
    path_width,  # P
    path_stride,
    NODES: tl.constexpr,  # power of two >= S
    BLOCK: tl.constexpr,  # tree indices whose ancestors one pass of the loop reads
    PATH: tl.constexpr,  # power of two >= P
):
    dependent_launch()
    row = tl.program_id(0)
    base = row * size
    n = tl.arange(0, NODES)
    inside = n < size
    tokens = tl.load(tokens_ptr + base + n, mask=inside, other=0)
    parents = tl.load(parents_ptr + base + n, mask=inside, other=0)
    expected = tl.load(target_ptr + base + parents, mask=inside, other=0)
    valid = tl.load(valid_ptr + base + n, mask=inside, other=0) != 0
    matches = ((tokens == expected) | (n == 0)) & valid
    # the accepted index of greatest depth (the first such, as argmax takes): an index is accepted when it and
    # every ancestor match
    best_depth = tl.zeros((), dtype=tl.int64) - 1
    best_node = tl.zeros((), dtype=tl.int32)
    for start in range(0, NODES, BLOCK):
        i = start + tl.arange(0, BLOCK)
        real = i < size
        ancestors = tl.load(
            ancestors_ptr + (base + i)[:, None] * size + n[None, :],
            mask=real[:, None] & inside[None, :],
            other=0,
        )
        failing = (ancestors != 0) & ~matches[None, :]
        accepted = (tl.max(failing.to(tl.int32), axis=1) == 0) & real
        depth = tl.load(depths_ptr + base + i, mask=real, other=0)
        score = tl.where(accepted, depth, -1)
        top = tl.max(score, axis=0)
        first = tl.min(tl.where(score == top, i, NODES), axis=0)
        better = top > best_depth
        best_node = tl.where(better, first, best_node)
        best_depth = tl.where(better, top, best_depth)
    on_path = tl.load(ancestors_ptr + (base + best_node) * size + n, mask=inside, other=0) != 0
    depths = tl.load(depths_ptr + base + n, mask=inside, other=-1)
    d = tl.arange(0, PATH)
    # path[d]: the one index on the leaf's path at depth d (0 past the leaf)
    hit = on_path[None, :] & (depths[None, :] == d[:, None])
    path = tl.sum(tl.where(hit, n[None, :], 0), axis=1)
    tl.store(path_ptr + row * path_stride + d, path.to(tl.int64), mask=d < path_width)
    tl.store(length_ptr + row, best_depth + 1)
    tl.store(bonus_ptr + row, tl.load(target_ptr + base + best_node))


def walk(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depths: torch.Tensor,
    valid: torch.Tensor,
    ancestors: torch.Tensor,
    target_tokens: torch.Tensor,
    path: torch.Tensor,
    length: torch.Tensor,
    bonus: torch.Tensor,
) -> None:
    """`tree.walk` for every row in one launch, into `path` [B, P], `length` [B] and `bonus` [B]."""
    batch, size = tokens.shape
    assert path.stride(1) == 1 and length.is_contiguous() and bonus.is_contiguous()
    _walk_kernel[(batch,)](
        tokens.contiguous(),
        parents.contiguous(),
        depths.contiguous(),
        valid.contiguous().view(torch.int8),
        ancestors.contiguous().view(torch.int8),
        target_tokens.contiguous(),
        path,
        length,
        bonus,
        size,
        path.shape[1],
        path.stride(0),
        NODES=_width(size),
        BLOCK=min(32, _width(size)),
        PATH=_width(path.shape[1]),
        num_warps=4,
        **launch_options(),
    )


@triton.jit
def _move_kernel(
    cache_ptr,  # [layers, rows, capacity, entry] (strides given)
    path_ptr,  # [B, P] int64: accepted tree indices by depth
    length_ptr,  # [B] int64: indices kept (0: the row keeps nothing)
    prefix_ptr,  # [B] int64: the slot of tree index 0
    entry,
    layer_stride,
    row_stride,
    slot_stride,
    path_width,
    PATH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    dependent_launch()
    row, layer, block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    length = tl.load(length_ptr + row)
    prefix = tl.load(prefix_ptr + row)
    d = tl.arange(0, PATH)
    path = tl.load(path_ptr + row * path_width + d, mask=d < path_width, other=0)
    moving = (d < length) & (path != d)
    e = block * BLOCK + tl.arange(0, BLOCK)
    mask = moving[:, None] & (e < entry)[None, :]
    base = cache_ptr + layer * layer_stride + row * row_stride + e[None, :]
    values = tl.load(base + (prefix + path)[:, None] * slot_stride, mask=mask)
    tl.debug_barrier()  # every read before any write: a kept index may sit where another one lands
    tl.store(base + (prefix + d)[:, None] * slot_stride, values, mask=mask)


def move_accepted(
    tensors: list[torch.Tensor], path: torch.Tensor, length: torch.Tensor, prefix: torch.Tensor
) -> None:
    """Each row's first length[b] path entries, from slot prefix + path[b, d] to slot prefix + d, in every
    tensor [layers, rows, capacity, *entry] (rows 0..B-1 of it): one launch per tensor."""
    batch, width = path.shape
    path = path.contiguous()
    for tensor in tensors:
        flat = tensor.view(tensor.shape[0], tensor.shape[1], tensor.shape[2], -1)
        entry = flat.shape[3]
        block = min(triton.next_power_of_2(entry), max(16, 4096 // _width(width)))
        _move_kernel[(batch, flat.shape[0], triton.cdiv(entry, block))](
            flat,
            path,
            length,
            prefix,
            entry,
            flat.stride(0),
            flat.stride(1),
            flat.stride(2),
            width,
            PATH=_width(width),
            BLOCK=block,
            num_warps=4,
            **launch_options(),
        )


@triton.jit
def _keep_features_kernel(
    features_ptr,  # [B, S, F]: the verified indices' target features (strides given)
    ctx_ptr,  # [B, pending limit, F]: features the drafter has not taken in (strides given)
    ctx_count_ptr,  # [B] int64: how many it holds
    path_ptr,  # [B, >= P] int64 (rows `path_stride` apart)
    path_stride,
    features_row,
    features_node,
    ctx_row,
    ctx_slot,
    dim,
    pending_limit,
    TAKEN_IN: tl.constexpr,  # the pending features were taken in this step: the kept ones replace them
    BLOCK: tl.constexpr,
):
    dependent_launch()
    row, e, block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if TAKEN_IN:
        start = 0
    else:
        start = tl.load(ctx_count_ptr + row)
    node = tl.load(path_ptr + row * path_stride + e)
    dest = tl.minimum(start + e, pending_limit - 1)  # past a dead row's stale count: the last slot
    f = block * BLOCK + tl.arange(0, BLOCK)
    values = tl.load(features_ptr + row * features_row + node * features_node + f, mask=f < dim)
    tl.store(ctx_ptr + row * ctx_row + dest * ctx_slot + f, values, mask=f < dim)


def keep_features(
    features: torch.Tensor, ctx: torch.Tensor, ctx_count: torch.Tensor, path: torch.Tensor, taken_in: bool
) -> None:
    """ctx[b, start + d] = features[b, path[b, d]] for the path's P entries (start 0 when `taken_in`, else
    ctx_count[b]; clamped to the buffer): the drafter's pending features after a step. ctx_count is left as
    it was (`commit_rows` sets it)."""
    batch, width = path.shape
    dim = features.shape[2]
    assert features.stride(2) == 1 and ctx.stride(2) == 1 and path.stride(1) == 1
    block = min(triton.next_power_of_2(dim), 1024)
    _keep_features_kernel[(batch, width, triton.cdiv(dim, block))](
        features,
        ctx,
        ctx_count,
        path,
        path.stride(0),
        features.stride(0),
        features.stride(1),
        ctx.stride(0),
        ctx.stride(1),
        dim,
        ctx.shape[1],
        TAKEN_IN=taken_in,
        BLOCK=block,
        num_warps=4,
        **launch_options(),
    )


@triton.jit
def _commit_rows_kernel(
    path_ptr,  # [B, P] int64
    length_ptr,  # [B] int64
    bonus_ptr,  # [B] int64
    tokens_ptr,  # [B, S] int64: the tree's tokens
    prefix_ptr,  # [B] int64, advanced by length
    root_ptr,  # [B] int64 out: the bonus token, the next step's root
    out_ptr,  # [B, P + 1] int64 out: [length, kept tokens but the root..., 0...] with the bonus at `length`
    ctx_count_ptr,  # [B] int64, or unused
    size,
    path_width,
    HAS_CONTEXT: tl.constexpr,
    TAKEN_IN: tl.constexpr,
    OUT: tl.constexpr,  # power of two >= P + 1
):
    dependent_launch()
    row = tl.program_id(0)
    length = tl.load(length_ptr + row)
    bonus = tl.load(bonus_ptr + row)
    c = tl.arange(0, OUT)
    along = (c >= 1) & (c < path_width)
    node = tl.load(path_ptr + row * path_width + c, mask=along, other=0)
    token = tl.load(tokens_ptr + row * size + node, mask=along, other=0)
    line = tl.where(c == length, bonus, tl.where(c == 0, length, tl.where(along, token, 0)))
    tl.store(out_ptr + row * (path_width + 1) + c, line, mask=c < path_width + 1)
    if HAS_CONTEXT:
        if TAKEN_IN:
            tl.store(ctx_count_ptr + row, length)
        else:
            tl.store(ctx_count_ptr + row, tl.load(ctx_count_ptr + row) + length)
    tl.store(prefix_ptr + row, tl.load(prefix_ptr + row) + length)
    tl.store(root_ptr + row, bonus)


def commit_rows(
    path: torch.Tensor,
    length: torch.Tensor,
    bonus: torch.Tensor,
    tokens: torch.Tensor,
    prefix: torch.Tensor,
    root: torch.Tensor,
    out: torch.Tensor,
    ctx_count: torch.Tensor | None,
    taken_in: bool,
) -> None:
    """Each row's step output line into `out` [B, P + 1] (count, tokens, bonus at the count), its prefix advanced
    by `length`, its root set to the bonus, and (with `ctx_count`) its pending feature count: one launch."""
    batch, width = path.shape
    assert out.is_contiguous() and out.shape[1] == width + 1
    _commit_rows_kernel[(batch,)](
        path.contiguous(),
        length,
        bonus,
        tokens.contiguous(),
        prefix,
        root,
        out,
        ctx_count if ctx_count is not None else prefix,
        tokens.shape[1],
        width,
        HAS_CONTEXT=ctx_count is not None,
        TAKEN_IN=taken_in,
        OUT=_width(width + 1),
        num_warps=1,
        **launch_options(),
    )
