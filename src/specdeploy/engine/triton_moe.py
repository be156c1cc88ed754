"""The routed experts (and the shared ones) of an MoE layer as two grouped GEMM kernels on CUDA.

Each token's (token, expert) pairs are sorted by expert and each expert's run of pairs is padded to whole
row blocks, so a program of the first kernel multiplies one block of rows by one column tile of one
expert's fused gate|up weight (SiLU(gate) * up applied before the store), and a program of the second one
block by one tile of its down weight, scaled by the routing weight. An expert's weights are thus read once
per step for all of its tokens (when they fit one block, as in decode and tree verify), and experts no
token picked are never read. Shared experts are one more expert every token picks with weight 1, read from
their own tensors. Everything stays on the device (the block plan is built with torch ops of fixed
shapes), so the step remains capturable in a CUDA graph.

Rounding follows the torch path in `moe.Experts` (projection outputs, SiLU and the weighted product round
to the model dtype); the sum over a token's experts runs in float32 and rounds once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _round(x, dtype: tl.constexpr):
    return x.to(dtype).to(tl.float32)


@triton.jit
def _gate_up_kernel(
    x_ptr,  # [N, H] tokens
    w13_ptr,  # [E, 2I, H] routed experts' gate|up
    shared13_ptr,  # [2Is, H] shared experts' gate|up (unused without)
    sorted_ptr,  # [BLOCKS * BM] pair index (token * K + slot) in expert order; >= pairs marks padding
    block_expert_ptr,  # [BLOCKS] expert of each row block; >= experts (+1 with shared) marks unused blocks
    out_ptr,  # [BLOCKS * BM, max(I, Is)] SiLU(gate) * up of each sorted row
    pairs, top_k, hidden, inter, shared_inter, num_experts, total_experts, stride_we, stride_out,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block)
    if expert >= total_experts:
        return
    if expert < num_experts:
        w = w13_ptr + expert.to(tl.int64) * stride_we
        width = inter
    else:
        w = shared13_ptr
        width = shared_inter
    col = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    if tl.program_id(1) * BLOCK_N >= width:
        return
    dtype = out_ptr.dtype.element_ty
    slot = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + slot)
    row_ok = pair < pairs
    token = tl.where(row_ok, pair // top_k, 0).to(tl.int64)
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
    gate = _round(gate_acc, dtype)
    silu = _round(gate / (1.0 + tl.exp(-gate)), dtype)  # F.silu rounds before the product
    hidden_act = silu * _round(up_acc, dtype)
    out = out_ptr + slot[:, None].to(tl.int64) * stride_out + col[None, :]
    tl.store(out, hidden_act.to(dtype), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _down_kernel(
    act_ptr,  # [BLOCKS * BM, max(I, Is)] the first kernel's output
    w2_ptr,  # [E, H, I] routed experts' down
    shared2_ptr,  # [H, Is] shared experts' down
    sorted_ptr,
    block_expert_ptr,
    weight_ptr,  # [pairs] float32 routing weight of each pair
    out_ptr,  # [pairs, H] float32: each pair's weighted expert output
    pairs, hidden, inter, shared_inter, num_experts, total_experts, stride_we, stride_act,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr,
    DTYPE: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block)
    if expert >= total_experts:
        return
    if expert < num_experts:
        w = w2_ptr + expert.to(tl.int64) * stride_we
        width = inter
    else:
        w = shared2_ptr
        width = shared_inter
    slot = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + slot)
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
    scale = tl.load(weight_ptr + pair, mask=row_ok, other=0.0)
    result = _round(_round(acc, DTYPE) * scale[:, None], DTYPE)
    out = out_ptr + pair[:, None].to(tl.int64) * hidden + col[None, :]
    tl.store(out, result, mask=row_ok[:, None] & col_ok[None, :])


def block_plan(indices: torch.Tensor, total_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted pair indices padded per expert to whole blocks [BLOCKS * block_m], expert of each block
    [BLOCKS]) for indices [N, K]; padding slots hold N * K, unused blocks `total_experts`. BLOCKS is the
    most any routing of N * K pairs can need, so the shapes depend on N and K only."""
    picks = indices.flatten()
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
    # each used expert pads at most block_m - 1 slots, and at most min(experts, pairs) experts are used
    blocks = triton.cdiv(pairs + min(total_experts, pairs) * (block_m - 1), block_m)
    sorted_pairs = torch.full((blocks * block_m,), pairs, dtype=torch.int32, device=device)
    sorted_pairs.scatter_(0, position, order.to(torch.int32))
    block_expert = torch.searchsorted(block_end, torch.arange(blocks, device=device), right=True)
    return sorted_pairs, block_expert.to(torch.int32)


def fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    indices: torch.Tensor,
    shared13: torch.Tensor | None = None,
    shared2: torch.Tensor | None = None,
) -> torch.Tensor:
    """sum_k weights[n, k] * expert_{indices[n, k]}(x[n]) (+ the shared experts' SwiGLU) for x [N, H],
    w13 [E, 2I, H] (gate rows then up rows), w2 [E, H, I], shared13 [2Is, H], shared2 [H, Is] -> [N, H]."""
    tokens, hidden = x.shape
    num_experts, inter = w13.shape[0], w2.shape[2]
    weights = weights.float()
    has_shared = shared13 is not None
    if has_shared:
        indices = torch.cat([indices, indices.new_full((tokens, 1), num_experts)], dim=1)
        weights = torch.cat([weights, weights.new_ones(tokens, 1)], dim=1)
        shared_inter = shared2.shape[1]
    else:
        shared13, shared2, shared_inter = w13, w2, 0
    top_k = indices.shape[1]
    pairs = tokens * top_k
    total = num_experts + int(has_shared)
    # rows per expert: a few in decode and tree verify, many in prefill
    block_m = 16 if pairs <= 16 * total else 64
    sorted_pairs, block_expert = block_plan(indices, total, block_m)
    x = x.contiguous()
    widest = max(inter, shared_inter)
    act = torch.empty(sorted_pairs.numel(), widest, dtype=x.dtype, device=x.device)
    ieee = x.dtype == torch.float32  # float32 stays exact: Triton's default float32 dot rounds to TF32
    block_n, block_k = 64, 64
    _gate_up_kernel[(block_expert.numel(), triton.cdiv(widest, block_n))](
        x, w13, shared13, sorted_pairs, block_expert, act,
        pairs, top_k, hidden, inter, shared_inter, num_experts, total, w13.stride(0), act.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, IEEE=ieee, num_warps=4, num_stages=3,
    )  # fmt: skip
    out = torch.empty(pairs, hidden, dtype=torch.float32, device=x.device)
    _down_kernel[(block_expert.numel(), triton.cdiv(hidden, block_n))](
        act, w2, shared2, sorted_pairs, block_expert, weights.reshape(-1).contiguous(), out,
        pairs, hidden, inter, shared_inter, num_experts, total, w2.stride(0), act.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, IEEE=ieee, DTYPE=_tl_dtype(x.dtype),
        num_warps=4, num_stages=3,
    )  # fmt: skip
    return out.view(tokens, top_k, hidden).sum(dim=1).to(x.dtype)


def _tl_dtype(dtype: torch.dtype):
    return {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dtype]
