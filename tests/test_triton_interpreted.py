"""The CUDA Triton kernels, run by Triton's interpreter on the CPU, against the torch code they replace.

float32 only: the interpreter emulates the arithmetic but not bf16 rounding; bf16 and speed are checked on a
GPU (test_gpu_fastpath.py). The interpreter must be switched on before Triton is imported, hence a fresh
interpreter process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PREAMBLE = """
    import copy
    import sys
    import torch
    sys.path.insert(0, "tests")
    from specdeploy.engine import ops, triton_kernels as tk
    from specdeploy.engine.models.rope import RotaryEmbedding
    from specdeploy.engine.tree import TreeBatch, best_first_tree, expected_accept_lengths, root_paths
    from tree_oracle import certify_best_first, tree_from_batch

    torch.manual_seed(0)

    def close(a, b):
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
"""

# the kernels of attention, MoE, MLA and the projections
KERNEL_CHECKS = """

    for zero_centered in (False, True):
        x, r, w = torch.randn(3, 5, 96), torch.randn(3, 5, 96), 1 + 0.1 * torch.randn(96)
        close(tk.rms_norm(x, w, 1e-6, None, zero_centered), ops.torch_rms_norm(x, w, 1e-6, None, zero_centered))
        for got, want in zip(tk.rms_norm(x, w, 1e-6, r, zero_centered),
                             ops.torch_rms_norm(x, w, 1e-6, r, zero_centered)):
            close(got, want)
    gate_up = torch.randn(4, 2 * 300)
    close(tk.silu_mul(gate_up), ops.torch_silu_mul(gate_up))

    # Qwen3 layout (q|k|v heads) and Qwen3-Next's (query and gate per head, partial rotary, zero-centred norms)
    B, T, H, HKV, D, C = 2, 3, 8, 2, 64, 16
    for query_width, rotary, zero_centered in ((D, D, False), (2 * D, 16, True)):
        proj = torch.randn(B, T, H * query_width + 2 * HKV * D)
        queries, k, v = proj.split([H * query_width, HKV * D, HKV * D], -1)
        q = queries.view(B, T, H, query_width)[..., :D]
        k, v = k.view(B, T, HKV, D), v.view(B, T, HKV, D)
        qw, kw = 1 + 0.1 * torch.randn(D), 1 + 0.1 * torch.randn(D)
        rope = RotaryEmbedding({"rope_type": "default", "rope_theta": 1e4}, rotary, 512)(
            torch.randint(0, 100, (1, T)), torch.float32
        )
        slots = torch.randperm(B * C)[: B * T]
        caches = [torch.zeros(B * C, HKV, D) for _ in range(4)]
        got = tk.qk_norm_rope_store(q, k, v, qw, kw, 1e-6, *rope, slots, caches[0], caches[1], zero_centered)
        want = ops.qk_norm_rope_store(q, k, v, qw, kw, 1e-6, zero_centered, rope, slots, caches[2], caches[3])
        close(got, want)
        close(caches[0], caches[2])
        close(caches[1], caches[3])

    for depths, vocab, budget in ((3, 5, 7), (2, 3, 20), (7, 50, 16), (15, 300, 32), (6, 100, 64)):
        logprobs = torch.log_softmax(3 * torch.randn(2, depths, vocab), dim=-1)
        root = torch.tensor([5, 9])
        top = torch.topk(logprobs, min(budget, vocab), dim=-1)
        got = TreeBatch.empty(2, budget, torch.device("cpu"))
        paths = torch.empty(2, budget + 1, min(budget, depths) + 1, dtype=torch.long)
        tk.best_first_tree(root, top.values, top.indices, budget, got, paths)
        assert torch.equal(paths, root_paths(got.ancestors, paths.shape[-1])), (depths, vocab, budget)
        want = best_first_tree(root, logprobs, budget)
        for name in ("tokens", "parents", "depths", "valid", "ancestors"):
            assert torch.equal(getattr(got, name), getattr(want, name)), (depths, vocab, budget, name)
        certify_best_first(tree_from_batch(got), logprobs[0], budget)
        budgets = sorted({1, 2, max(1, budget // 2), budget})
        top = torch.topk(logprobs, min(budget, vocab), dim=-1).values
        close(tk.expected_accept_lengths(top, budgets), expected_accept_lengths(logprobs, budgets))
    from specdeploy.engine.forward_batch import ForwardBatch
    from specdeploy.engine.models.layers import attend_folded

    # masked attention: GQA decode (split over the window), a tree verify, MLA's 48 = 32 + 16 key width
    for b, kv, group, tokens, width, value_width, window, latent in (
        (1, 2, 4, 1, 64, 64, 256, False), (2, 2, 2, 5, 32, 32, 128, False), (1, 1, 4, 3, 48, 32, 640, True),
    ):
        q = torch.randn(b, kv, group, tokens, width)
        k_cache = torch.randn(b, window + 64, kv, width)
        v_cache = k_cache[..., :value_width] if latent else torch.randn(b, window + 64, kv, value_width)
        visible = torch.rand(b, tokens, window) < 0.6
        visible[:, :, 0] = True
        keys, values = k_cache[:, :window], v_cache[:, :window]
        batch = ForwardBatch(torch.zeros(1, tokens, dtype=torch.long), torch.zeros(b, tokens, dtype=torch.long),
                             visible, window + 64)
        close(tk.masked_attention(q, keys, values, visible, 0.1), attend_folded(q, keys, values, batch, 0.1))
        if latent:  # other tiles than the default: more query rows per program, fewer keys, one split
            for tiles in (tk.AttentionTiles(32, 16, 8, 3), tk.AttentionTiles(64, 64, 4, 2)):
                close(tk.masked_attention(q, keys, values, visible, 0.1, tiles),
                      attend_folded(q, keys, values, batch, 0.1))
            # each head's output mapped out through its value up-projection (a view into kv_b_proj's weight),
            # in the splits' combine and (no rows allowed there) by a matmul after it: one split, 10, and 40 (two
            # loads of 32); value widths in one block and in two, the second partial
            from specdeploy.engine import triton_mla

            kept = triton_mla.COMBINE_UP_HEAD_ROWS
            for head_rows in (b * tokens * group, 0):
                triton_mla.COMBINE_UP_HEAD_ROWS = head_rows
                for value_dim, tiles in ((24, None), (48, tk.AttentionTiles(64, 1024, 4, 2)),
                                         (16, tk.AttentionTiles(16, 16, 4, 2))):
                    value_up = torch.randn(group, 8 + value_dim, value_width)[:, 8:] / value_width**0.5
                    close(tk.masked_attention(q, keys, values, visible, 0.1, tiles, value_up),
                          attend_folded(q, keys, values, batch, 0.1, value_up))
            # the value block loaded before the splits, 8 splits a load (5 loads of the 40)
            triton_mla.COMBINE_UP_HEAD_ROWS, kept_tiles = b * tokens * group, triton_mla.COMBINE_UP
            triton_mla.COMBINE_UP = triton_mla.CombineUpTiles(8, 4, True)
            close(tk.masked_attention(q, keys, values, visible, 0.1, tk.AttentionTiles(16, 16, 4, 2), value_up),
                  attend_folded(q, keys, values, batch, 0.1, value_up))
            triton_mla.COMBINE_UP_HEAD_ROWS, triton_mla.COMBINE_UP = kept, kept_tiles

    # fused MoE against the torch grouped GEMM: decode with shared experts (DeepSeek-V3), a verify of 5
    # tokens without (Qwen3-MoE; widths not multiples of the tiles), and 40 tokens (64-row blocks)
    from specdeploy.engine.models.layers import SwiGLU
    from specdeploy.engine.models.moe import Experts
    from specdeploy.engine.triton_moe import MoeTiling, Tiles, block_plan, fused_moe, kernel_plan

    # the one-program block plan equals the torch one (with and without a shared expert, 16- and 64-row blocks)
    for tokens, experts, k, shared, block_m in ((1, 8, 2, 1, 16), (17, 384, 8, 1, 16), (300, 16, 4, 0, 16),
                                                (40, 4, 2, 1, 64)):
        indices = torch.stack([torch.randperm(experts)[:k] for _ in range(tokens)])
        picks = torch.cat([indices.flatten(), torch.full((tokens * shared,), experts)])
        want = block_plan(picks, experts + shared, block_m)
        got = kernel_plan(indices, picks.numel(), experts, experts + shared, block_m)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), (tokens, experts, k, shared)

    for tokens, experts, k, hidden, inter, shared_inter in (
        (1, 8, 2, 64, 32, 64), (5, 8, 3, 48, 40, 0), (40, 4, 2, 32, 16, 16),
    ):
        block = Experts(experts, hidden, inter)
        block.w13.data.normal_(0, 0.2)
        block.w2.data.normal_(0, 0.2)
        shared = SwiGLU(hidden, shared_inter) if shared_inter else None
        x, weights = torch.randn(tokens, hidden), torch.rand(tokens, k)
        indices = torch.stack([torch.randperm(experts)[:k] for _ in range(tokens)])
        shared_weights = (shared.gate_up_proj.weight, shared.down_proj.weight) if shared else ()
        with torch.no_grad():
            want = block(x, weights, indices, shared)
            close(fused_moe(x, block.w13, block.w2, weights, indices, *shared_weights), want)
            # tiles other than the default (as benchmarks/moe_tile_sweep.py tries them) give the same sums
            tiling = MoeTiling(32, Tiles(16, 128, 2, 4), Tiles(32, 16, 8, 3))
            close(fused_moe(x, block.w13, block.w2, weights, indices, *shared_weights, tiling=tiling), want)

    # one token's experts as the matrix-vector kernels (their default tiles, and others), and as the grouped
    # kernels: with and without shared experts, widths that are no multiple of the tiles, several reduction tiles
    from specdeploy.engine import triton_moe
    from specdeploy.engine.triton_gemv import GemvTiles

    default_tiles = triton_moe.ONE_TOKEN

    for experts, k, hidden, inter, shared_inter in ((8, 2, 64, 32, 64), (8, 3, 48, 40, 0), (16, 4, 300, 72, 144)):
        block = Experts(experts, hidden, inter)
        block.w13.data.normal_(0, hidden**-0.5)  # outputs of order 1, as a model's, so float32 sums agree to 1e-5
        block.w2.data.normal_(0, inter**-0.5)
        shared = SwiGLU(hidden, shared_inter) if shared_inter else None
        x, weights, indices = torch.randn(1, hidden), torch.rand(1, k), torch.randperm(experts)[:k][None]
        shared_weights = (shared.gate_up_proj.weight, shared.down_proj.weight) if shared else ()
        with torch.no_grad():
            want = block(x, weights, indices, shared)
            for tiles in (default_tiles, (GemvTiles(16, 32, 4, 3), GemvTiles(8, 64, 2, 2)),
                          (GemvTiles(4, 128, 4, 3), GemvTiles(32, 16, 4, 1)), None):
                triton_moe.ONE_TOKEN = tiles
                close(fused_moe(x, block.w13, block.w2, weights, indices, *shared_weights), want)
    triton_moe.ONE_TOKEN = default_tiles

    # one row's projection as the matrix-vector kernel: with and without a bias, widths no multiple of the tiles,
    # one reduction tile and several (the first loaded before the kernel waits for the one before)
    from specdeploy.engine.triton_gemv import ONE_ROW_LINEAR, linear_one_row

    linear_cases = ((64, 40, False, ONE_ROW_LINEAR), (100, 37, True, GemvTiles(4, 32, 4, 2)),
                    (96, 8, False, GemvTiles(8, 32, 2, 1)))
    for in_features, out_features, bias, tiles in linear_cases:
        layer = torch.nn.Linear(in_features, out_features, bias=bias)
        x = torch.randn(1, 1, in_features)
        with torch.no_grad():
            close(linear_one_row(x, layer.weight, layer.bias, tiles), layer(x))
            close(ops.linear(x, layer), layer(x))

    # one row's projection of RMSNorm(x + residual), the norm made in the projection's kernel (`norm_linear_row`):
    # the standard and the zero-centred norm, a bias, one reduction tile and several, widths no multiple of the
    # tiles; and a decoder layer whose mixer and MLP take it, against the same layer without it
    from specdeploy.engine.models.layers import DecoderLayer, RMSNorm, SwiGLU, ZeroCenteredRMSNorm
    from specdeploy.engine.triton_gemv import norm_linear_row

    for norm_type, in_features, out_features, bias, tiles in (
        (RMSNorm, 64, 40, False, ONE_ROW_LINEAR), (ZeroCenteredRMSNorm, 100, 37, True, GemvTiles(4, 32, 4, 2)),
    ):
        norm, layer = norm_type(in_features, 1e-6), torch.nn.Linear(in_features, out_features, bias=bias)
        norm.weight.data.normal_(1.0 if norm_type is RMSNorm else 0.0, 0.1)
        x, residual = torch.randn(1, 1, in_features), torch.randn(1, 1, in_features)
        with torch.no_grad():
            want_normed, want_sum = ops.torch_rms_norm(x, norm.weight, 1e-6, residual, norm.zero_centered)
            got, total = norm_linear_row(x, residual, norm.weight, 1e-6, norm.zero_centered, layer.weight,
                                         layer.bias, tiles)  # fmt: skip
            close(got, layer(want_normed))
            close(total, want_sum)

    class Projects(torch.nn.Module):  # a mixer whose first step is one projection, as attention's
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(48, 48)

        first_projection = property(lambda self: self.proj)

        def after_first_projection(self, projected, batch, cache):
            return projected.tanh()

        def forward(self, x, batch, cache):
            return self.after_first_projection(self.proj(x), batch, cache)

    class Plain(Projects):  # the same mixer without the fusion, and an MLP without it
        first_projection = None

    class PlainSwiGLU(SwiGLU):
        first_projection = None

    block = DecoderLayer(Projects(), SwiGLU(48, 72), 48, 1e-6)
    plain = DecoderLayer(Plain(), PlainSwiGLU(48, 72), 48, 1e-6)
    for mine, theirs in zip(plain.parameters(), block.parameters(), strict=True):
        mine.data.copy_(theirs)
    x, residual = torch.randn(1, 1, 48), torch.randn(1, 1, 48)
    with torch.no_grad():
        for got, want in zip(block(x, residual, None, None), plain(x, residual, None, None), strict=True):
            close(got, want)

    # SwiGLU's down projection of one row in one kernel (`swiglu_down_row`): its activations made tile by tile,
    # with and without a bias, a width no multiple of the tiles; and the route SwiGLU takes
    from specdeploy.engine.models.layers import SwiGLU
    from specdeploy.engine.triton_gemv import swiglu_down_row

    for inter, out_features, bias, tiles in ((64, 40, False, ONE_ROW_LINEAR), (100, 37, True, GemvTiles(4, 32, 4, 2))):
        down = torch.nn.Linear(inter, out_features, bias=bias)
        gate_up = torch.randn(1, 1, 2 * inter)
        with torch.no_grad():
            close(swiglu_down_row(gate_up, down.weight, down.bias, tiles), down(ops.torch_silu_mul(gate_up)))
    mlp = SwiGLU(48, 72)
    x = torch.randn(1, 1, 48)
    with torch.no_grad():
        close(mlp(x), mlp.down_proj(ops.torch_silu_mul(mlp.gate_up_proj(x))))

    # a few rows' projection (`linear_rows`): one 16-row tile and a larger one, with and without a bias, widths no
    # multiple of the tiles, one reduction tile and several, rows not next to each other (a view of wider rows)
    from specdeploy.engine.triton_gemv import ROWS_LINEAR, RowsLinear, linear_rows, takes_rows

    rows_cases = ((3, 64, 40, False, ROWS_LINEAR), (17, 100, 37, True, RowsLinear(128, 1 << 20, 32, 32, 4, 2)),
                  (65, 96, 8, False, RowsLinear(128, 1 << 20, 16, 16, 2, 1)))
    for rows, in_features, out_features, bias, tiles in rows_cases:
        layer = torch.nn.Linear(in_features, out_features, bias=bias)
        x = torch.randn(1, rows, in_features + 5)[..., :in_features]
        with torch.no_grad():
            close(linear_rows(x, layer.weight, layer.bias, tiles), layer(x))
            assert takes_rows(rows, layer.weight, ROWS_LINEAR)
            close(ops.linear(x, layer), layer(x))
            strided = layer.weight.t().contiguous().t()  # the same values, columns contiguous: F.linear's
            close(ops.project(x, strided, layer.bias), layer(x))


    # MLA's query (the nope part mapped into the latent by kv_b_proj's key half, the rope part rotated) and
    # cache entry: DeepSeek's interleaved rope pairs and not, nope widths padded for the product and not, more
    # (batch row, token) rows than one block of 16
    from specdeploy.engine.models.rope import apply_rope
    from specdeploy.engine.triton_mla import mla_query_entry

    H, L, R, V, C = 4, 32, 16, 8, 16
    for (B, T, NOPE), interleaved in (((2, 3, 8), True), ((2, 3, 16), False), ((3, 7, 24), True)):
        proj = torch.randn(B, T, H * (NOPE + R) + L + R + 5)  # query | latent | rope key | (another part)
        q, kv = proj[..., : H * (NOPE + R)].view(B, T, H, NOPE + R), proj[..., H * (NOPE + R) : -5]
        key_up = torch.randn(H, NOPE + V, L)[:, :NOPE] / NOPE**0.5
        weight = 1 + 0.1 * torch.randn(L)
        rope = RotaryEmbedding({"rope_type": "default", "rope_theta": 1e4}, R, 512)(
            torch.randint(0, 100, (B, T)), torch.float32
        )
        slots = torch.randperm(B * C)[: B * T]
        caches = [torch.zeros(B * C, 1, L + R) for _ in range(2)]
        got = mla_query_entry(q, key_up, kv, weight, 1e-6, *rope, slots, caches[0], interleaved)
        absorbed = torch.einsum("bthn,hnr->bthr", q[..., :NOPE], key_up)
        want = torch.cat([absorbed, apply_rope(q[..., NOPE:], rope, interleaved)], dim=-1)
        entry = torch.cat([ops.torch_rms_norm(kv[..., :L], weight, 1e-6)[:, :, None],
                           apply_rope(kv[..., None, L:], rope, interleaved)], dim=-1)
        caches[1].index_copy_(0, slots, entry.reshape(B * T, 1, L + R))
        close(got, want)
        close(caches[0], caches[1])

    # DeepSeek-V3 routing without group limits (Kimi's) in one kernel against the router's torch ops
    from specdeploy.engine.models.deepseek_v3 import GroupLimitedRouter
    from specdeploy.engine.triton_moe import sigmoid_top_k

    for experts, k, tokens in ((8, 2, 3), (384, 8, 5)):
        router = GroupLimitedRouter({"n_routed_experts": experts, "num_experts_per_tok": k, "hidden_size": 16,
                                     "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5})
        router.weight.data.normal_()
        router.e_score_correction_bias.normal_(0, 0.1)
        x = torch.randn(tokens, 16)
        with torch.no_grad():
            want_weights, want = router(x)
            got_weights, got = sigmoid_top_k(x @ router.weight.t(), router.e_score_correction_bias, k, True, 2.5)
        (want, want_order), (got, got_order) = want.sort(dim=1), got.sort(dim=1)
        assert torch.equal(got, want), (experts, got, want)
        close(got_weights.gather(1, got_order), want_weights.gather(1, want_order))

    # the router's product and the routing in one kernel, each program a few experts' logits and the token's
    # last one the top-k: every call leaves the done-counts at zero for the next (a CUDA graph replays them)
    from specdeploy.engine.triton_moe import route

    for experts, k, tokens, hidden, block_e in ((8, 2, 3, 16, 1), (384, 8, 5, 300, 4), (64, 6, 1, 700, 16)):
        router = GroupLimitedRouter({"n_routed_experts": experts, "num_experts_per_tok": k, "hidden_size": hidden,
                                     "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5})
        router.weight.data.normal_(0, hidden**-0.5)
        router.e_score_correction_bias.normal_(0, 0.1)
        for _ in range(2):
            x = torch.randn(tokens, hidden)
            with torch.no_grad():
                want_weights, want = router(x)
                got_weights, got = route(x, router.weight, router.e_score_correction_bias, k, True, 2.5, block_e)
            (want, want_order), (got, got_order) = want.sort(dim=1), got.sort(dim=1)
            assert torch.equal(got, want), (experts, got, want)
            close(got_weights.gather(1, got_order), want_weights.gather(1, want_order))
            assert not any(counts.any() for counts in triton_moe._done_counts[x.device])
    # RMSNorm(x + residual) made in the router's kernel: the routing, the normed tokens and the sum equal the norm's
    # torch version then the router's (the standard and the zero-centred norm; one reduction tile and three)
    from specdeploy.engine.triton_moe import norm_route

    for experts, k, tokens, hidden, zero_centered in ((8, 2, 3, 16, False), (64, 6, 1, 4100, True)):
        router = GroupLimitedRouter({"n_routed_experts": experts, "num_experts_per_tok": k, "hidden_size": hidden,
                                     "n_group": 1, "topk_group": 1, "routed_scaling_factor": 2.5})
        router.weight.data.normal_(0, hidden**-0.5)
        router.e_score_correction_bias.normal_(0, 0.1)
        x, residual = torch.randn(tokens, hidden), torch.randn(tokens, hidden)
        norm_weight = 0.1 * torch.randn(hidden) + (0.0 if zero_centered else 1.0)
        with torch.no_grad():
            want_normed, want_sum = ops.torch_rms_norm(x, norm_weight, 1e-6, residual, zero_centered)
            want_weights, want = router(want_normed)
            got_weights, got, got_normed, got_sum = norm_route(
                x, residual, (norm_weight, 1e-6, zero_centered), router.weight, router.e_score_correction_bias,
                k, True, 2.5)
        close(got_normed, want_normed)
        close(got_sum, want_sum)
        (want, want_order), (got, got_order) = want.sort(dim=1), got.sort(dim=1)
        assert torch.equal(got, want), (experts, got, want)
        close(got_weights.gather(1, got_order), want_weights.gather(1, want_order))
        assert not any(counts.any() for counts in triton_moe._done_counts[x.device])
    # more tokens than the counters held: larger ones are added and the first stay (a CUDA graph may use them)
    first = triton_moe.done_counts(x.device, 1)
    assert triton_moe.done_counts(x.device, first.numel() + 1) is not first
    assert triton_moe._done_counts[x.device][0] is first
"""

# the Gated DeltaNet kernels
GDN_CHECKS = """
    # Gated DeltaNet over draft trees: every token along its own root path, then the accepted path replayed
    import random
    from specdeploy.engine import triton_gdn
    from specdeploy.engine.models.gated_delta_rule import replay, rule_inputs, tree_rule
    from specdeploy.engine.tree import ancestor_matrix, root_paths
    random.seed(0)
    B, T, HK, HV, DK, DV = 3, 9, 2, 4, 16, 40  # DV spans two column blocks, the second one partial
    parents = torch.tensor([[0] + [random.randrange(0, i) for i in range(1, T)] for _ in range(B)])
    paths = root_paths(ancestor_matrix(parents, T), T)
    mixed = torch.randn(B, T, 2 * HK * DK)  # q and k as strided views of one projection, as the layer has them
    q, k = mixed[..., : HK * DK].view(B, T, HK, DK), mixed[..., HK * DK :].view(B, T, HK, DK)
    v, g, beta = torch.randn(B, T, HV, DV), -torch.rand(B, T, HV), torch.rand(B, T, HV)
    initial = torch.randn(B, HV, DK, DV)
    close(triton_gdn.tree_rule(q, k, v, g, beta, paths, initial), tree_rule(rule_inputs(q, k, v, g, beta), paths, initial))
    path, count = paths[:, T - 1].clamp(min=0), torch.tensor([2, 0, 1])
    want, got = initial.clone(), initial.clone()
    replay(want, k, v, g, beta, path, count)
    triton_gdn.replay(got, k, v, g, beta, path, count)
    close(got, want)
    assert torch.equal(got[1], initial[1])  # a row that keeps nothing keeps its state

    # The walk against the torch tree rule (the CPU's UT form) on wide, chain and deep trees, a key head shared by
    # two value heads, key dims over two blocks and value columns over two (both partial); keys close to one
    # another and decays near 1, so that a path's every step weighs on its last token
    def walk_against_torch(size: int, chain: float) -> None:
        rng = random.Random(size)
        parents = torch.tensor([[0] + [i - 1 if rng.random() < chain else rng.randrange(0, i) for i in range(1, size)]
                                for _ in range(2)])
        paths = root_paths(ancestor_matrix(parents, size), size)
        q, k = torch.randn(2, size, HK, 40), torch.randn(2, 1, HK, 40) + 0.2 * torch.randn(2, size, HK, 40)
        v, g, beta = torch.randn(2, size, HV, DV), -0.1 * torch.rand(2, size, HV), 1 - 0.2 * torch.rand(2, size, HV)
        initial = torch.randn(2, HV, 40, DV)
        close(triton_gdn.tree_rule(q, k, v, g, beta, paths, initial),
              tree_rule(rule_inputs(q, k, v, g, beta), paths, initial))

    for size, chain in ((6, 0.0), (17, 1.0), (65, 0.85)):
        walk_against_torch(size, chain)

    # A prefill chunk in one launch against the token-by-token rule, and past a 64-token chunk the chunked one
    from specdeploy.engine.models.gated_delta_rule import chain_rule, chunked_rule
    for tokens, key_heads, value_dim in ((1, 2, 40), (3, 2, 40), (70, 1, 8)):  # 40: a partial column block
        mixed = torch.randn(2, tokens, 2 * key_heads * DK)
        q, k = (t.view(2, tokens, key_heads, DK) for t in mixed.split(key_heads * DK, dim=-1))
        v = torch.randn(2, tokens, 2 * key_heads, value_dim)  # two value heads per key head
        g, beta = -torch.rand(2, tokens, 2 * key_heads), torch.rand(2, tokens, 2 * key_heads)
        initial = torch.randn(2, 2 * key_heads, DK, value_dim)
        state = initial.clone()
        out = triton_gdn.chain_rule(q, k, v, g, beta, state)
        inputs = rule_inputs(q, k, v, g, beta)
        for rule in (chain_rule, chunked_rule) if tokens > 64 else (chain_rule,):
            want, final = rule(inputs, initial)
            close(out, want)
            close(state, final)

    # The layer's elementwise work: gates, the path convolution (without joining state and new inputs), the norm
    import torch.nn.functional as F
    from specdeploy.engine.models.gated_deltanet import GatedRMSNorm, path_conv
    from specdeploy.engine.recurrent_state import conv_windows
    a, b = torch.randn(B, T, 2 * HV)[..., ::2], torch.randn(B, T, HV)  # a strided
    a_log, dt_bias = torch.randn(HV), torch.randn(HV)
    a[0, 0, 0] = 30.0  # past softplus's threshold
    decay, beta = torch.empty(B, T, HV), torch.empty(B, T, HV)
    triton_gdn.gates(a, b, a_log, dt_bias, decay, beta)
    close(decay, -a_log.exp() * F.softplus(a + dt_bias))
    close(beta, b.sigmoid())
    C, W = 24, 4
    state, new = torch.randn(B, W - 1, C), torch.randn(B, T, C)
    weight = torch.randn(C, 1, W)
    windows = conv_windows(paths, W)
    got = torch.empty(B, T, C)
    triton_gdn.conv(state, new, windows, weight, got)
    close(got, path_conv(torch.cat([state, new], dim=1), windows, weight))
    norm = GatedRMSNorm(DV, 1e-6)
    norm.weight.data = 1 + 0.1 * torch.randn(DV)
    out, gate = torch.randn(B, T, HV, DV), torch.randn(B, T, HV, 2 * DV)[..., :DV]
    close(triton_gdn.gated_norm(out, gate, norm.weight, 1e-6, torch.float32), norm(out, gate).reshape(B, T, HV * DV))

    # Committing the conv inputs of the kept path: against the torch commit of a recurrent cache
    from specdeploy.engine.recurrent_state import RecurrentCache
    cache = RecurrentCache([0], B, W, (1, 2), (4, 4), T, torch.float32, torch.device("cpu"))
    cache.conv.normal_()
    cache.inputs.normal_()
    count = torch.tensor([0, 2, 5])
    want = cache.conv.clone()
    got = want.clone()
    joined = torch.cat([want[0], cache.inputs[0]], dim=1)
    want[0].copy_(joined.gather(1, cache._conv_sources(path, count)[..., None].expand(-1, -1, joined.shape[-1])))
    triton_gdn.conv_commit(got[0], cache.inputs[0], path, count)
    close(got, want)

    # The whole commit, every layer in one launch per kernel, against the torch commit layer by layer
    layered = RecurrentCache([0, 1], B, W, (1, 2), (4, 4), T, torch.float32, torch.device("cpu"))
    for tensor in (layered.conv, layered.state, layered.inputs, layered.conved, layered.beta):
        tensor.normal_()
    layered.decay.uniform_(-1, 0)
    reference = copy.deepcopy(layered)
    count = torch.tensor([3, 0, 1])
    reference.commit(path[:2], count[:2])  # CPU tensors: the torch commit; rows 0..1, the third row untouched
    _, key, value = layered.split(layered.conved[:, :2])
    triton_gdn.conv_commit(layered.conv[:, :2], layered.inputs[:, :2], path[:2], count[:2])
    triton_gdn.replay(layered.state[:, :2], key, value, layered.decay[:, :2], layered.beta[:, :2], path[:2], count[:2])
    close(layered.conv, reference.conv)
    close(layered.state, reference.state)

    # A hybrid model's prefill in two chunks with every Gated DeltaNet kernel (as CUDA dispatches them) against
    # the torch path: logits, recurrent states and conv inputs
    from specdeploy.engine.loading import resolve_family, target_config
    from specdeploy.engine.single_pass import target_pass
    raw = {"architectures": ["Qwen3_5ForCausalLM"], "vocab_size": 32, "hidden_size": 32, "intermediate_size": 32,
           "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
           "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
           "linear_value_head_dim": 8, "layer_types": ["linear_attention", "full_attention"],
           "max_position_embeddings": 64}
    family, text, _ = resolve_family(raw)
    torch.manual_seed(0)  # this check's inputs do not depend on how many numbers the checks above drew
    model = family(target_config(raw, text, None)).eval().requires_grad_(False)
    for p in model.parameters():
        p.data.normal_(0, 0.3)  # a fresh layer's norm weights and gates are exactly 0 or 1
    ids = torch.randint(0, 32, (2, 8))
    results = {}
    for kernels in (None, triton_gdn):
        ops.gdn_kernels_for = lambda x, kernels=kernels: kernels
        cache = model.new_cache(2, 16)
        # 6 tokens, then 2: fewer than the conv history (3), whose state then keeps older inputs
        results[kernels] = [target_pass(model, ids[:, a:b], torch.arange(a, b)[None], cache, cached=a)[0]
                            for a, b in ((0, 6), (6, 8))] + [cache.recurrent.state, cache.recurrent.conv]
    for got, want in zip(results[triton_gdn], results[None]):
        close(got, want)
"""


def test_triton_kernels_equal_their_torch_versions_under_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    # the two groups of checks at once, a process each: the interpreter is slow, and a CI machine has two cores
    running = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(PREAMBLE + checks + '    print("ok")\n')], cwd=ROOT, env=env,
            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        for checks in (KERNEL_CHECKS, GDN_CHECKS)
    ]  # fmt: skip
    for process in running:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0 and out.strip().endswith("ok"), err[-3000:]


LAYER_CHECKS = textwrap.dedent(
    """
    import sys
    import tempfile
    from pathlib import Path
    import torch
    sys.path.insert(0, "tests")
    from decode_helpers import write_pair
    from specdeploy.engine.loading import load_target
    from specdeploy.engine.models.layers import normed_into

    target = load_target(write_pair(Path(tempfile.mkdtemp()), "kimi")[0])
    for layer in target.layers[1:]:  # the first is dense
        norm, moe = layer.post_attention_layernorm, layer.mlp
        for tokens in (1, 3):
            x, residual = torch.randn(2, tokens, norm.weight.numel()), torch.randn(2, tokens, norm.weight.numel())
            with torch.no_grad():  # the router's kernel, interpreted
                assert moe.normed_forward(norm, x, residual) is not None
                got, got_sum = normed_into(norm, x, residual, moe)
            with torch.enable_grad():  # autograd on: every op's torch version
                normed, want_sum = norm(x, residual)
                want = moe(normed)
            torch.testing.assert_close(got, want.detach(), atol=1e-5, rtol=1e-5)
            assert torch.equal(got_sum, want_sum.detach())
    print("ok")
    """
)


def test_a_kimi_moe_layer_with_the_norm_in_its_routers_kernel_equals_its_torch_version() -> None:
    """`normed_into` of a Kimi MoE layer (no group limit) on CPU tensors through the CUDA path's kernels,
    interpreted (`SPECDEPLOY_TRITON=interpret`): the post-attention norm made in the router's kernel, then the
    experts; the same output and residual sum as the norm's and the MoE's torch versions, for 1 and 3 tokens."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "SPECDEPLOY_TRITON": "interpret"}
    done = subprocess.run(
        [sys.executable, "-c", LAYER_CHECKS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


STEP_CHECKS = textwrap.dedent(
    """
    import sys
    import tempfile
    from pathlib import Path
    import torch
    sys.path.insert(0, "tests")
    from decode_helpers import write_pair
    from hybrid_helpers import write_drafter, write_target
    from test_batch import CYCLE, LENGTHS, PROMPTS, run, scripted_policy
    from specdeploy.engine import ops, triton_step
    from specdeploy.engine.batch import BatchEngine
    from specdeploy.engine.loading import load_drafter, load_target
    from specdeploy.engine.sampling import SamplingParams

    root = Path(tempfile.mkdtemp())
    pairs = {"qwen3": write_pair(root, "qwen3"),
             "qwen3_next": (write_target("qwen3_next", root / "hybrid"), write_drafter(root / "hybrid-draft"))}
    # greedy and seeded-sampled rows side by side, joining and leaving; budgets change every step, AR ones among them
    params = [SamplingParams(temperature=0.9, top_k=20, max_new_tokens=n, ignore_eos=True, seed=i) if i % 2
              else SamplingParams(max_new_tokens=n, ignore_eos=True) for i, n in enumerate(LENGTHS)]
    for family, (target_dir, draft_dir) in pairs.items():
        target, drafter = load_target(target_dir), load_drafter(draft_dir)
        for mode, budget in (("ddtree", "changing"), ("ddtree", 64), ("dflash", None)):
            results = []
            for kernels in (None, triton_step):  # the torch operations, then the kernels (interpreted)
                ops.step_kernels_for = lambda x, kernels=kernels: kernels
                policy = scripted_policy(CYCLE) if budget == "changing" else None
                engine = BatchEngine(target, drafter, mode, 24 if policy else budget, max_running=4,
                                     max_context=160, prefill_tokens=4, policy=policy, fixed_shapes=True)
                got = run(engine, [(i * 2, p, q) for i, (p, q) in enumerate(zip(PROMPTS, params))])
                runner = engine.runner
                state = [t.clone() for group in runner.cache.groups for t in group]
                if runner.cache.recurrent is not None:
                    state += [t.clone() for t in runner.cache.recurrent.tensors]
                results.append((got, state, runner.ctx.clone(), runner.prefix.clone(), runner.root.clone()))
            (want, *want_state), (got, *got_state) = results
            assert got == want, (family, mode, budget)
            for a, b in zip(want_state[0] + want_state[1:], got_state[0] + got_state[1:]):
                assert torch.equal(a, b), (family, mode, budget)
    print("ok")
    """
)


def test_step_kernels_keep_every_output_and_state_under_the_interpreter() -> None:
    """The accept walk, the kept path's cache move and the rows' commit as Triton kernels (`triton_step`):
    batched greedy and seeded-sampled requests give the same tokens, caches, recurrent states and drafter
    features as the torch operations, with trees of 64 nodes and budgets changing every step."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", STEP_CHECKS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
