"""The routed experts (and the shared ones) of an MoE layer as two grouped GEMM kernels on CUDA.

Each token's (token, expert) pairs are sorted by expert and each expert's run of pairs is padded to whole
row blocks, so a program of the first kernel multiplies one block of rows by one column tile of one
expert's fused gate|up weight (SiLU(gate) * up applied before the store), and a program of the second one
block by one tile of its down weight, scaled by the routing weight; a last kernel sums each token's pairs.
An expert's weights are thus read once per step for all of its tokens (when they fit one block, as in decode
and tree verify), and experts no token picked are never read. Shared experts are one more expert every
token picks with weight 1, read from their own tensors. Pairs are numbered routed first (token * k + slot),
then one shared pair per token (N * k + token). Everything stays on the device (the block plan is one
program sorting the pairs, or torch ops of fixed shapes for large prefills), so the step remains capturable
in a CUDA graph. A single token (batch-1 decode) needs no plan and no tensor cores (`ONE_TOKEN`): two
matrix-vector kernels read its experts from the routing, gate|up per (expert, column tile), then down with the
sum over the token's experts in the same program.

Rounding follows the torch path in `moe.Experts` (projection outputs, SiLU and the weighted product round
to the model dtype); the sum over a token's experts runs in float32 and rounds once.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from specdeploy.engine.triton_gemv import (
    GemvTiles,
    _gemv_tile,
    _gemv_tile_waiting,
    _normed_gemv_tile_waiting,
    _normed_tile,
    _two_gemv_tiles_waiting,
)
from specdeploy.engine.triton_launch import dependent_launch, launch_options
from specdeploy.engine.triton_rounding import rounded, rounded_silu


class Tiles(NamedTuple):
    """One grouped-GEMM kernel's launch shape: column tile, reduction tile, warps, pipeline stages."""

    block_n: int
    block_k: int
    warps: int
    stages: int


class MoeTiling(NamedTuple):
    """Rows per block of the plan, and each of the two kernels' tiles."""

    block_m: int
    gate_up: Tiles
    down: Tiles


# One token's experts as matrix-vector kernels, (gate|up tiles, down tiles); None: the grouped-GEMM kernels, with
# a plan. The fastest of `benchmarks/moe_tile_sweep.py --one-token` on one H200 at mla-moe-16b's widths, at 2284ef7:
# 0.0416 ms a layer (78% of the copy bandwidth's roofline) against 0.0479 at the tiles before (4x2048x4x2 /
# 4x2048x4x1) and the grouped kernels' 0.0474, and mla-moe-16b's AR step 2.12 ms against 2.30 twice in turn; an
# H100's sweep also put gate|up at 2x1024 first (benchmarks/results/gpu-2026-12-06-h200-head/,
# gpu-2026-12-06-down-route/).
ONE_TOKEN: tuple[GemvTiles, GemvTiles] | None = (GemvTiles(2, 1024, 4, 2), GemvTiles(4, 2048, 4, 3))


def default_tiling(pairs: int, total_experts: int, hidden: int) -> MoeTiling:
    """Rows per expert are a few in decode and tree verify (16-row blocks), many in prefill (64). The tiles are
    what `benchmarks/moe_tile_sweep.py` found best or within 2% of it on one H200 for the widths of
    mla-moe-16b (hidden 2048, experts of 1408) and Kimi K2.6 (7168, 2048) at 17 to 257 tokens
    (`benchmarks/results/h200-2026-12-04-moe/moe_sweep.json`): 128-deep reductions for few rows, and 128-wide
    down-projection tiles for Kimi's wide hidden state once there are more pairs than experts (at 1 and 17
    tokens 64-wide ones were as fast or faster). At one token no gate|up tile came within 2% of the best on
    both shapes (128-wide was best for mla-moe-16b, 32-wide for Kimi); this one is 3-6% behind either."""
    if pairs <= 16 * total_experts:
        wide = 128 if hidden >= 4096 and pairs >= total_experts else 64
        return MoeTiling(16, Tiles(64, 128, 4, 3), Tiles(wide, 128, 4, 3))
    return MoeTiling(64, Tiles(64, 64, 4, 3), Tiles(128, 64, 4, 3))


@triton.jit
def _block_rows(block, sorted_ptr, block_expert_ptr, BLOCK_M: tl.constexpr):
    """(expert, slots, pairs) of row block `block`, from the block plan."""
    slot = block * BLOCK_M + tl.arange(0, BLOCK_M)
    return tl.load(block_expert_ptr + block), slot, tl.load(sorted_ptr + slot)


@triton.jit
def _expert_weights(expert, num_experts, routed_ptr, shared_ptr, stride_we, inter, shared_inter):
    """(weights, width) of `expert`: a routed expert's slice of `routed_ptr`, or the shared experts past them."""
    if expert < num_experts:
        w = routed_ptr + expert.to(tl.int64) * stride_we
        width = inter
    else:
        w = shared_ptr
        width = shared_inter
    return w, width


@triton.jit
def _gate_up_kernel(
    x_ptr,  # [N, H] tokens
    w13_ptr,  # [E, 2I, H] routed experts' gate|up
    shared13_ptr,  # [2Is, H] shared experts' gate|up (unused without)
    sorted_ptr,  # [BLOCKS * BM] pair index in expert order; >= pairs marks padding
    block_expert_ptr,  # [BLOCKS] expert of each row block; >= experts (+1 with shared) marks unused blocks
    out_ptr,  # [BLOCKS * BM, max(I, Is)] SiLU(gate) * up of each sorted row
    pairs, routed_pairs, top_k, hidden, inter, shared_inter, num_experts, total_experts, stride_we, stride_out,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    dependent_launch()
    block = tl.program_id(0)
    expert, slot, pair = _block_rows(block, sorted_ptr, block_expert_ptr, BLOCK_M)
    if expert >= total_experts:
        return
    w, width = _expert_weights(expert, num_experts, w13_ptr, shared13_ptr, stride_we, inter, shared_inter)
    col = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    if tl.program_id(1) * BLOCK_N >= width:
        return
    dtype = out_ptr.dtype.element_ty
    row_ok = pair < pairs
    token = tl.where(pair < routed_pairs, pair // top_k, pair - routed_pairs)
    token = tl.where(row_ok, token, 0).to(tl.int64)
    col_ok = col < width
    gate_acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    up_acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < hidden
        a = tl.load(
            x_ptr + token[:, None] * hidden + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0
        )
        w_mask = k_ok[:, None] & col_ok[None, :]
        gate_w = tl.load(w + col[None, :].to(tl.int64) * hidden + kk[:, None], mask=w_mask, other=0.0)
        up_w = tl.load(w + (width + col[None, :]).to(tl.int64) * hidden + kk[:, None], mask=w_mask, other=0.0)
        if IEEE:
            gate_acc += tl.dot(a, gate_w, input_precision="ieee")
            up_acc += tl.dot(a, up_w, input_precision="ieee")
        else:
            gate_acc += tl.dot(a, gate_w)
            up_acc += tl.dot(a, up_w)
    gate = rounded(gate_acc, dtype)
    silu = rounded_silu(gate, dtype)
    hidden_act = silu * rounded(up_acc, dtype)
    out = out_ptr + slot[:, None].to(tl.int64) * stride_out + col[None, :]
    tl.store(out, hidden_act.to(dtype), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _down_kernel(
    act_ptr,  # [BLOCKS * BM, max(I, Is)] the first kernel's output
    w2_ptr,  # [E, H, I] routed experts' down
    shared2_ptr,  # [H, Is] shared experts' down
    sorted_ptr,
    block_expert_ptr,
    weight_ptr,  # [N, k] routing weight of each routed pair (shared pairs weigh 1)
    out_ptr,  # [pairs, H] float32: each pair's weighted expert output
    pairs, routed_pairs, hidden, inter, shared_inter, num_experts, total_experts, stride_we, stride_act,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    dependent_launch()
    block = tl.program_id(0)
    expert, slot, pair = _block_rows(block, sorted_ptr, block_expert_ptr, BLOCK_M)
    if expert >= total_experts:
        return
    w, width = _expert_weights(expert, num_experts, w2_ptr, shared2_ptr, stride_we, inter, shared_inter)
    row_ok = pair < pairs
    col = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = col < hidden
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, width, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < width
        a = tl.load(
            act_ptr + slot[:, None].to(tl.int64) * stride_act + kk[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        b = tl.load(
            w + col[None, :].to(tl.int64) * width + kk[:, None],
            mask=k_ok[:, None] & col_ok[None, :],
            other=0.0,
        )
        if IEEE:
            acc += tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a, b)
    dtype = act_ptr.dtype.element_ty  # the model dtype
    scale = tl.load(weight_ptr + pair, mask=pair < routed_pairs, other=1.0).to(tl.float32)
    result = rounded(rounded(acc, dtype) * scale[:, None], dtype)
    out = out_ptr + pair[:, None].to(tl.int64) * hidden + col[None, :]
    tl.store(out, result, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _gate_up_gemv_kernel(
    x_ptr,  # [1, H] the token
    w13_ptr, shared13_ptr,  # as _gate_up_kernel's
    indices_ptr,  # [k] the token's routed experts
    out_ptr,  # [k + 1, max(I, Is)] SiLU(gate) * up of each pair (the shared expert's last)
    top_k, hidden, inter, shared_inter, stride_we, stride_out,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # The shared expert's column blocks first, then each routed pair's: the shared expert's weights depend on no
    # kernel, so its programs, the first to start, load their first tiles while the router's kernel still runs.
    program = tl.program_id(0)
    shared_blocks = tl.cdiv(shared_inter, BLOCK_N)
    if program < shared_blocks:
        pair = top_k
        width = shared_inter
        col = program * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = col < width
        gate, up = _two_gemv_tiles_waiting(
            shared13_ptr,
            shared13_ptr + width.to(tl.int64) * hidden,
            hidden,
            col,
            col_ok,
            x_ptr,
            BLOCK_N,
            BLOCK_K,
        )
    else:
        dependent_launch()
        routed_blocks = tl.cdiv(inter, BLOCK_N)
        pair = (program - shared_blocks) // routed_blocks
        width = inter
        col = ((program - shared_blocks) % routed_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = col < width
        w = w13_ptr + tl.load(indices_ptr + pair) * stride_we
        gate = _gemv_tile(w, hidden, col, col_ok, x_ptr, BLOCK_N, BLOCK_K)
        up = _gemv_tile(w + width.to(tl.int64) * hidden, hidden, col, col_ok, x_ptr, BLOCK_N, BLOCK_K)
    dtype = out_ptr.dtype.element_ty
    gate = rounded(gate, dtype)
    up = rounded(up, dtype)
    silu = rounded_silu(gate, dtype)
    tl.store(out_ptr + pair * stride_out + col, (silu * up).to(dtype), mask=col_ok)


@triton.jit
def _down_gemv_kernel(
    act_ptr,  # [k + 1, max(I, Is)] the first kernel's output
    w2_ptr, shared2_ptr,  # as _down_kernel's
    indices_ptr,  # [k] the token's routed experts
    weight_ptr,  # [k] their routing weights
    out_ptr,  # [1, H] the token's MoE output
    top_k, hidden, inter, shared_inter, stride_we, stride_act,
    SHARED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    col = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = col < hidden
    dtype = out_ptr.dtype.element_ty
    if SHARED:  # first, its first tile loaded before the wait (no kernel writes it); added last, as ever
        shared = _gemv_tile_waiting(shared2_ptr, shared_inter, col, col_ok, act_ptr + top_k * stride_act,
                                    BLOCK_N, BLOCK_K)  # fmt: skip
    else:
        dependent_launch()
    total = tl.zeros([BLOCK_N], tl.float32)  # the pairs' sum in float32, rounded once, as _sum_pairs_kernel's
    for pair in range(0, top_k):
        w = w2_ptr + tl.load(indices_ptr + pair) * stride_we
        expert = _gemv_tile(w, inter, col, col_ok, act_ptr + pair * stride_act, BLOCK_N, BLOCK_K)
        total += rounded(rounded(expert, dtype) * tl.load(weight_ptr + pair).to(tl.float32), dtype)
    if SHARED:  # weight 1
        total += rounded(shared, dtype)
    tl.store(out_ptr + col, total.to(dtype), mask=col_ok)


@triton.jit
def _plan_kernel(
    indices_ptr,  # [N * k] routed experts of each routed pair
    scratch_ptr,  # [2 * PB] int32
    sorted_ptr,  # [BLOCKS * BM] out
    block_expert_ptr,  # [BLOCKS] out
    routed_pairs, pairs, num_experts, total_experts, slots, blocks,
    PB: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    dependent_launch()
    i = tl.arange(0, PB)
    expert = tl.load(indices_ptr + i, mask=i < routed_pairs, other=num_experts).to(tl.int32)  # shared: E
    expert = tl.where(i < pairs, expert, total_experts)  # lanes past the pairs sort last
    key = tl.sort(expert * PB + i)  # by expert, then by pair
    sorted_expert = key // PB
    tl.store(scratch_ptr + i, sorted_expert)
    for start in range(0, slots, PB):
        tl.store(sorted_ptr + start + i, tl.full([PB], 0, tl.int32) + pairs, mask=start + i < slots)
    for start in range(0, blocks, PB):
        tl.store(
            block_expert_ptr + start + i, tl.full([PB], 0, tl.int32) + total_experts, mask=start + i < blocks
        )
    tl.debug_barrier()  # the sorted experts and the initialised outputs are visible to every thread
    previous = tl.load(scratch_ptr + i - 1, mask=i > 0, other=-1)
    following = tl.load(scratch_ptr + i + 1, mask=i + 1 < PB, other=-1)
    real = sorted_expert < total_experts
    first = real & (sorted_expert != previous)
    last = real & (sorted_expert != following)
    run = tl.cumsum(first.to(tl.int32), axis=0) - 1  # which expert's run each sorted pair is in
    tl.store(scratch_ptr + PB + run, i, mask=first)
    tl.debug_barrier()
    rank = i - tl.load(scratch_ptr + PB + run, mask=real, other=0)  # place within its expert's run
    padding = tl.where(last, (BLOCK_M - (rank + 1) % BLOCK_M) % BLOCK_M, 0)  # after a run, to a whole block
    position = i + tl.cumsum(padding, axis=0) - padding
    tl.store(sorted_ptr + position, key % PB, mask=real)
    tl.store(block_expert_ptr + position // BLOCK_M, sorted_expert, mask=real)


@triton.jit
def _sum_pairs_kernel(
    pair_ptr, out_ptr, routed_pairs, hidden, TOP_K: tl.constexpr, SHARED: tl.constexpr, BLOCK: tl.constexpr
):
    dependent_launch()
    token = tl.program_id(0)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = col < hidden
    total = tl.zeros([BLOCK], tl.float32)
    for slot in tl.static_range(TOP_K):
        total += tl.load(pair_ptr + (token * TOP_K + slot).to(tl.int64) * hidden + col, mask=ok, other=0.0)
    if SHARED:
        total += tl.load(pair_ptr + (routed_pairs + token).to(tl.int64) * hidden + col, mask=ok, other=0.0)
    tl.store(out_ptr + token.to(tl.int64) * hidden + col, total.to(out_ptr.dtype.element_ty), mask=ok)


PLAN_PAIRS = 8192  # the most pairs one program sorts; larger prefills take the torch plan


def plan_blocks(pairs: int, total_experts: int, block_m: int) -> int:
    """Row blocks the most uneven routing of `pairs` pairs needs: every used expert pads at most
    block_m - 1 slots, and at most min(experts, pairs) experts are used."""
    return triton.cdiv(pairs + min(total_experts, pairs) * (block_m - 1), block_m)


def block_plan(picks: torch.Tensor, total_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(pair indices sorted by expert, each expert's run padded to whole blocks [BLOCKS * block_m]; expert of
    each block [BLOCKS]) for the experts `picks` [pairs] of each pair, in torch ops; padding slots hold
    `pairs`, unused blocks `total_experts`. The kernel plan's order within an expert's run is the same."""
    pairs = picks.numel()
    device = picks.device
    counts = torch.zeros(total_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, picks, torch.ones_like(picks))
    blocks_per_expert = (counts + block_m - 1) // block_m
    block_end = torch.cumsum(blocks_per_expert, 0)
    padded_start = (block_end - blocks_per_expert) * block_m
    pair_start = torch.cumsum(counts, 0) - counts
    order = torch.argsort(picks, stable=True)
    expert_sorted = picks[order]
    position = padded_start[expert_sorted] + torch.arange(pairs, device=device) - pair_start[expert_sorted]
    blocks = plan_blocks(pairs, total_experts, block_m)
    sorted_pairs = torch.full((blocks * block_m,), pairs, dtype=torch.int32, device=device)
    sorted_pairs.scatter_(0, position, order.to(torch.int32))
    block_expert = torch.searchsorted(block_end, torch.arange(blocks, device=device), right=True)
    return sorted_pairs, block_expert.to(torch.int32)


def kernel_plan(
    indices: torch.Tensor, pairs: int, num_experts: int, total_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`block_plan` in one program for the routed pairs of indices [N, k] followed by (pairs - N * k) pairs
    of the shared expert (number `num_experts`)."""
    routed = indices.numel()
    power = triton.next_power_of_2(pairs)
    blocks = plan_blocks(pairs, total_experts, block_m)
    sorted_pairs = torch.empty(blocks * block_m, dtype=torch.int32, device=indices.device)
    block_expert = torch.empty(blocks, dtype=torch.int32, device=indices.device)
    scratch = torch.empty(2 * power, dtype=torch.int32, device=indices.device)
    _plan_kernel[(1,)](
        indices.reshape(-1), scratch, sorted_pairs, block_expert,
        routed, pairs, num_experts, total_experts, sorted_pairs.numel(), blocks,
        PB=power, BLOCK_M=block_m, num_warps=8 if power >= 2048 else 4,
        **launch_options(),
    )  # fmt: skip
    return sorted_pairs, block_expert


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    indices: torch.Tensor,
    shared13: torch.Tensor | None = None,
    shared2: torch.Tensor | None = None,
    tiling: MoeTiling | None = None,
) -> torch.Tensor:
    """sum_k weights[n, k] * expert_{indices[n, k]}(x[n]) (+ the shared experts' SwiGLU) for x [N, H],
    w13 [E, 2I, H] (gate rows then up rows), w2 [E, H, I], shared13 [2Is, H], shared2 [H, Is] -> [N, H].
    `tiling` overrides `default_tiling` (benchmarks/moe_tile_sweep.py measures the choices); one token takes
    the `ONE_TOKEN` kernels instead when that is set."""
    tokens, hidden = x.shape
    num_experts, inter = w13.shape[0], w2.shape[2]
    top_k = indices.shape[1]
    has_shared = shared13 is not None
    if has_shared:
        shared_inter = shared2.shape[1]
    else:
        shared13, shared2, shared_inter = w13, w2, 0
    indices = indices.contiguous()
    if tokens == 1 and ONE_TOKEN is not None:
        return _one_token_moe(x, w13, w2, weights, indices, shared13, shared2, has_shared, ONE_TOKEN)
    routed_pairs = tokens * top_k
    pairs = routed_pairs + tokens * has_shared
    total = num_experts + int(has_shared)
    block_m, gate_up, down = tiling or default_tiling(pairs, total, hidden)
    if pairs <= PLAN_PAIRS:
        sorted_pairs, block_expert = kernel_plan(indices, pairs, num_experts, total, block_m)
    else:
        picks = indices.flatten()
        if has_shared:
            picks = torch.cat([picks, picks.new_full((tokens,), num_experts)])
        sorted_pairs, block_expert = block_plan(picks, total, block_m)
    blocks = block_expert.numel()
    x = x.contiguous()
    weights = weights.contiguous()
    widest = max(inter, shared_inter)
    act = torch.empty(blocks * block_m, widest, dtype=x.dtype, device=x.device)
    ieee = x.dtype == torch.float32  # float32 stays exact: Triton's default float32 dot rounds to TF32
    _gate_up_kernel[(blocks, triton.cdiv(widest, gate_up.block_n))](
        x, w13, shared13, sorted_pairs, block_expert, act,
        pairs, routed_pairs, top_k, hidden, inter, shared_inter, num_experts, total, w13.stride(0),
        act.stride(0),
        BLOCK_M=block_m, BLOCK_N=gate_up.block_n, BLOCK_K=gate_up.block_k, IEEE=ieee,
        num_warps=gate_up.warps, num_stages=gate_up.stages,
        **launch_options(),
    )  # fmt: skip
    per_pair = torch.empty(pairs, hidden, dtype=torch.float32, device=x.device)
    _down_kernel[(blocks, triton.cdiv(hidden, down.block_n))](
        act, w2, shared2, sorted_pairs, block_expert, weights, per_pair,
        pairs, routed_pairs, hidden, inter, shared_inter, num_experts, total, w2.stride(0), act.stride(0),
        BLOCK_M=block_m, BLOCK_N=down.block_n, BLOCK_K=down.block_k, IEEE=ieee,
        num_warps=down.warps, num_stages=down.stages,
        **launch_options(),
    )  # fmt: skip
    out = torch.empty_like(x)
    _sum_pairs_kernel[(tokens, triton.cdiv(hidden, 1024))](
        per_pair,
        out,
        routed_pairs,
        hidden,
        TOP_K=top_k,
        SHARED=has_shared,
        BLOCK=1024,
        num_warps=4,
        **launch_options(),
    )
    return out


def _one_token_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    indices: torch.Tensor,
    shared13: torch.Tensor,
    shared2: torch.Tensor,
    has_shared: bool,
    tiles: tuple[GemvTiles, GemvTiles],
) -> torch.Tensor:
    """`fused_moe` of one token [1, H] in two matrix-vector kernels (`ONE_TOKEN`)."""
    gate_up, down = tiles
    hidden = x.shape[1]
    top_k, inter = indices.shape[1], w2.shape[2]
    shared_inter = shared2.shape[1] if has_shared else 0
    widest = max(inter, shared_inter)
    act = torch.empty(top_k + 1, widest, dtype=x.dtype, device=x.device)
    x = x.contiguous()
    blocks = top_k * triton.cdiv(inter, gate_up.block_n) + triton.cdiv(shared_inter, gate_up.block_n)
    _gate_up_gemv_kernel[(blocks,)](
        x, w13, shared13, indices, act, top_k, hidden, inter, shared_inter, w13.stride(0), act.stride(0),
        BLOCK_N=gate_up.block_n, BLOCK_K=gate_up.block_k, num_warps=gate_up.warps, num_stages=gate_up.stages,
        **launch_options(),
    )  # fmt: skip
    out = torch.empty_like(x)
    _down_gemv_kernel[(triton.cdiv(hidden, down.block_n),)](
        act, w2, shared2, indices, weights.contiguous(), out, top_k, hidden, inter, shared_inter, w2.stride(0),
        act.stride(0),
        SHARED=has_shared, BLOCK_N=down.block_n, BLOCK_K=down.block_k, num_warps=down.warps,
        num_stages=down.stages,
        **launch_options(),
    )  # fmt: skip
    return out


@triton.jit
def _pick_top_k(
    logits_ptr, bias_ptr, weights_ptr, indices_ptr, token, experts, scale,
    TOP_K: tl.constexpr, E: tl.constexpr, K: tl.constexpr, NORMALIZE: tl.constexpr,
):  # fmt: skip
    """Token `token`'s routing from its float32 logits: sigmoid scores, the top_k of scores + bias, their
    scores (normalised when asked) times scale."""
    e = tl.arange(0, E)
    ok = e < experts
    logits = tl.load(logits_ptr + token * experts + e, mask=ok, other=0.0, cache_modifier=".cg")
    scores = tl.sigmoid(logits)
    choice = tl.where(ok, scores + tl.load(bias_ptr + e, mask=ok, other=0.0), float("-inf"))
    slot = tl.arange(0, K)
    picked = tl.zeros([K], tl.int32)
    weight = tl.zeros([K], tl.float32)
    for j in tl.static_range(TOP_K):
        best = tl.argmax(choice, axis=0)
        picked = tl.where(slot == j, best, picked)
        weight = tl.where(slot == j, tl.sum(tl.where(e == best, scores, 0.0), axis=0), weight)
        choice = tl.where(e == best, float("-inf"), choice)
    if NORMALIZE:
        weight = weight / (tl.sum(weight, axis=0) + 1e-20)
    tl.store(weights_ptr + token * TOP_K + slot, weight * scale, mask=slot < TOP_K)
    tl.store(indices_ptr + token * TOP_K + slot, picked.to(tl.int64), mask=slot < TOP_K)


@triton.jit
def _sigmoid_top_k_kernel(
    logits_ptr, bias_ptr, weights_ptr, indices_ptr, experts, scale,
    TOP_K: tl.constexpr, E: tl.constexpr, K: tl.constexpr, NORMALIZE: tl.constexpr,
):  # fmt: skip
    dependent_launch()
    _pick_top_k(logits_ptr, bias_ptr, weights_ptr, indices_ptr, tl.program_id(0), experts, scale,
                TOP_K, E, K, NORMALIZE)  # fmt: skip


@triton.jit
def _route_kernel(
    x_ptr,  # [N, H] tokens (model dtype); with NORM a layer's output, normed here with the residual stream
    res_ptr, norm_ptr,  # with NORM: [N, H] the residual stream before x, [H] the norm's weight
    normed_ptr, sum_ptr,  # with NORM, out: [N, H] RMSNorm(x + residual) and x + residual (expert block 0 writes them)
    router_ptr,  # [E, H] float32 router weight
    bias_ptr, logits_ptr, weights_ptr, indices_ptr,
    count_ptr,  # [N] int32 zeros: programs done per token (the last one sets it back to 0)
    experts, hidden, scale, eps,
    TOP_K: tl.constexpr, E: tl.constexpr, K: tl.constexpr, NORMALIZE: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr, NORM: tl.constexpr, ZERO_CENTERED: tl.constexpr, ROW: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0)
    e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    e_ok = e < experts
    row = token.to(tl.int64) * hidden
    if NORM:  # each program makes the token's norm itself
        dtype = normed_ptr.dtype.element_ty
        logits, total, rstd = _normed_gemv_tile_waiting(
            router_ptr, hidden, e, e_ok, x_ptr + row, res_ptr + row, norm_ptr, eps, dtype, ZERO_CENTERED, ROW,
            BLOCK_K,
        )  # fmt: skip
        if tl.program_id(1) == 0:
            d = tl.arange(0, ROW)
            d_ok = d < hidden
            tl.store(sum_ptr + row + d, total.to(dtype), mask=d_ok)
            normed = _normed_tile(x_ptr + row, res_ptr + row, norm_ptr, d, d_ok, rstd, dtype, ZERO_CENTERED)
            tl.store(normed_ptr + row + d, normed.to(dtype), mask=d_ok)
    else:  # waits for the kernel before once the router's first weights are loaded
        logits = _gemv_tile_waiting(router_ptr, hidden, e, e_ok, x_ptr + row, BLOCK_E, BLOCK_K)
    tl.store(logits_ptr + token * experts + e, logits, mask=e_ok)
    tl.debug_barrier()  # every thread's logits are written before the program counts itself done
    done = tl.atomic_add(count_ptr + token, 1, sem="acq_rel")
    if done == tl.num_programs(1) - 1:  # the token's last program: all its logits are in
        tl.store(count_ptr + token, 0)
        _pick_top_k(
            logits_ptr, bias_ptr, weights_ptr, indices_ptr, token, experts, scale, TOP_K, E, K, NORMALIZE
        )


def sigmoid_top_k(
    logits: torch.Tensor, bias: torch.Tensor, top_k: int, normalize: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's routing without group limits in one kernel: sigmoid scores of logits [N, E] float32,
    the top_k of scores + bias, their scores (normalised to sum 1 when asked) times scale ->
    (weights float32 [N, top_k], indices int64 [N, top_k])."""
    tokens, experts = logits.shape
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=logits.device)
    indices = torch.empty(tokens, top_k, dtype=torch.int64, device=logits.device)
    _sigmoid_top_k_kernel[(tokens,)](
        logits.contiguous(), bias, weights, indices, experts, scale,
        TOP_K=top_k, E=triton.next_power_of_2(experts), K=triton.next_power_of_2(top_k), NORMALIZE=normalize,
        num_warps=4,
        **launch_options(),
    )  # fmt: skip
    return weights, indices


# The most tokens the router runs as `route` (one kernel; each token reads the router's weight, from L2 after the
# first, where a matrix product reads it once for all); 0: always the matrix product and `sigmoid_top_k`. On one
# H100 at mla-moe-16b's widths `route` took 4.8 us against their 9.1 at one token (one expert a program; 6.9 us at
# two, 8.4 at four), and the shape's DFlash step (8-token verify) fell from 7.17 to 6.91 ms with both one-token
# changes (benchmarks/results/h100-2026-12-05-one-token-moe/); 16 and fewer: a DFlash block's verify.
ROUTE_TOKENS = 16
ROUTE_BLOCK_E = 1  # experts per program
# Each device's done-counts, the largest last: a larger one is added when more tokens come, and the smaller
# ones stay, since CUDA graphs captured with them go on using their memory.
_done_counts: dict[torch.device, list[torch.Tensor]] = {}


def done_counts(device: torch.device, tokens: int) -> torch.Tensor:
    """Zeroed int32 counters for `tokens` tokens on `device` (each kernel call leaves them at zero)."""
    kept = _done_counts.setdefault(device, [])
    if not kept or kept[-1].numel() < tokens:
        # under capture the memory would be the graph's: graphs.py then runs the stage eagerly
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("route: the done-counts are allocated in an eager call, not under capture")
        kept.append(torch.zeros(max(tokens, ROUTE_TOKENS, 1), dtype=torch.int32, device=device))
    return kept[-1]


def route(
    x: torch.Tensor,
    router: torch.Tensor,
    bias: torch.Tensor,
    top_k: int,
    normalize: bool,
    scale: float,
    block_e: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`sigmoid_top_k` of the float32 logits x [N, H] @ router[E, H].T in one kernel: each program computes
    `block_e` experts' logits (default ROUTE_BLOCK_E), and the last of a token's programs to finish picks its
    experts. In a CUDA graph the done-counts are the tensor allocated on the first (eager) call."""
    return _route(x, None, router, bias, top_k, normalize, scale, block_e)[:2]


def norm_route(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm: tuple[torch.Tensor, float, bool],
    router: torch.Tensor,
    bias: torch.Tensor,
    top_k: int,
    normalize: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`route` of RMSNorm(x + residual) (norm: its weight, in x's dtype, eps, zero-centred), the norm made in the
    router's kernel with `ops.rms_norm`'s roundings: (weights, indices, the normed tokens, x + residual). One
    kernel fewer than the norm's then the router's."""
    return _route(x, (residual, *norm), router, bias, top_k, normalize, scale)


def _route(
    x: torch.Tensor,
    norm: tuple[torch.Tensor, torch.Tensor, float, bool] | None,
    router: torch.Tensor,
    bias: torch.Tensor,
    top_k: int,
    normalize: bool,
    scale: float,
    block_e: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    tokens, hidden = x.shape
    experts = router.shape[0]
    counts = done_counts(x.device, tokens)
    logits = torch.empty(tokens, experts, dtype=torch.float32, device=x.device)
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=x.device)
    indices = torch.empty(tokens, top_k, dtype=torch.int64, device=x.device)
    x = x.contiguous()
    if norm is None:
        residual, norm_weight, eps, zero_centered = x, x, 0.0, False
        normed = total = x
    else:
        residual, norm_weight, eps, zero_centered = norm
        residual = residual.reshape(x.shape).contiguous()
        normed, total = torch.empty_like(x), torch.empty_like(x)
    block_e = block_e or ROUTE_BLOCK_E
    # up to 2048 router values a load: a program's loads are a chain of round trips to memory, so fewer is faster
    block_k = max(256, min(triton.next_power_of_2(hidden), 2048 // block_e))
    _route_kernel[(tokens, triton.cdiv(experts, block_e))](
        x, residual, norm_weight, normed, total, router, bias, logits, weights, indices, counts, experts, hidden,
        scale, eps,
        TOP_K=top_k, E=triton.next_power_of_2(experts), K=triton.next_power_of_2(top_k), NORMALIZE=normalize,
        BLOCK_E=block_e, BLOCK_K=block_k, NORM=norm is not None, ZERO_CENTERED=zero_centered,
        ROW=triton.next_power_of_2(hidden), num_warps=4,
        **launch_options(),
    )  # fmt: skip
    return weights, indices, normed, total
