"""The CUDA fast path against its own eager and torch versions: Triton ops, CUDA graphs, sampling streams."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from decode_helpers import write_pair

from specdeploy.engine import ops
from specdeploy.engine.decode import Decoder, SamplingParams
from specdeploy.engine.loading import load_drafter, load_target
from specdeploy.engine.single_pass import target_pass

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
PROMPT = [3, 17, 9, 41, 5, 22, 8]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fastpath")
    return {family: write_pair(root, family, logit_scale=4.0) for family in ("qwen3", "deepseek_v3")}


def triton():
    kernels = ops._triton_kernels()
    assert kernels is not None, "Triton did not import on this CUDA machine"
    return kernels


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal up to the order of float32 sums: 1e-5 in float32, one rounding step in bf16."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(got.float(), want.float(), atol=1e-3, rtol=2**-7)


@contextmanager
def torch_paths() -> Iterator[None]:
    """Every Triton kernel off for the block: the torch code they replace."""
    ops._triton_kernels.cache_clear()
    ops._setting.cache_clear()
    os.environ["SPECDEPLOY_TRITON"] = "0"
    try:
        yield
    finally:
        os.environ.pop("SPECDEPLOY_TRITON")
        ops._triton_kernels.cache_clear()
        ops._setting.cache_clear()


def assert_same_routing(
    got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]
) -> None:
    """(weights, experts) of each token: the same experts, in any order, with the same weights."""
    (got_weights, got), (want_weights, want) = got, want
    (want, want_order), (got, got_order) = want.sort(dim=1), got.sort(dim=1)
    assert torch.equal(got, want)
    close(got_weights.gather(1, got_order), want_weights.gather(1, want_order))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_triton_rms_norm_equals_torch(dtype, zero_centered):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(3, 5, 4096, device="cuda", generator=gen).to(dtype)
    residual = torch.randn(3, 5, 4096, device="cuda", generator=gen).to(dtype)
    weight = (1 + 0.1 * torch.randn(4096, device="cuda", generator=gen)).to(dtype)
    close(
        triton().rms_norm(x, weight, 1e-6, None, zero_centered),
        ops.torch_rms_norm(x, weight, 1e-6, None, zero_centered),
    )
    got_out, got_sum = triton().rms_norm(x, weight, 1e-6, residual, zero_centered)
    want_out, want_sum = ops.torch_rms_norm(x, weight, 1e-6, residual, zero_centered)
    assert torch.equal(got_sum, want_sum)
    close(got_out, want_out)
    # per-head norms over a strided view into a wider projection, as q_norm sees them
    heads = torch.randn(2, 7, 48, 128, device="cuda", generator=gen).to(dtype)[:, :, 8:40]
    close(triton().rms_norm(heads, weight[:128], 1e-6, None, zero_centered),
          ops.torch_rms_norm(heads, weight[:128], 1e-6, None, zero_centered))  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_silu_mul_equals_torch(dtype):
    x = torch.randn(5, 2 * 12288, device="cuda").to(dtype)
    close(triton().silu_mul(x), ops.torch_silu_mul(x))


@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_cuda_graphs_replay_exactly_what_eager_runs(pairs, family, temperature):
    target = load_target(pairs[family][0], "cuda", torch.bfloat16)
    drafter = load_drafter(pairs[family][1], "cuda", torch.bfloat16)
    params = SamplingParams(temperature=temperature, max_new_tokens=40, ignore_eos=True, seed=3)
    for mode, budget in [("ar", None), ("dflash", None), ("ddtree", 6), ("ddtree", 32)]:
        graphed = Decoder(target, drafter if mode != "ar" else None, mode, budget)
        # the same shapes (prefill chunks padded as the graphs' are), run eagerly
        eager = Decoder(
            target, drafter if mode != "ar" else None, mode, budget, cuda_graphs=False, fixed_shapes=True
        )
        a, b = graphed.generate(PROMPT, params), eager.generate(PROMPT, params)
        assert a.token_ids == b.token_ids and a.accept_lengths == b.accept_lengths, (mode, budget)
        assert graphed.runner.graphs.graphs, "nothing was captured"
        assert not graphed.runner.graphs.eager_reasons, graphed.runner.graphs.eager_reasons


def test_seeded_ddtree_reproduces_the_ar_sample_on_cuda(pairs):
    torch.backends.cuda.matmul.allow_tf32 = False
    target = load_target(pairs["qwen3"][0], "cuda", torch.float32)
    drafter = load_drafter(pairs["qwen3"][1], "cuda", torch.float32)
    for seed in range(5):
        params = SamplingParams(temperature=1.0, max_new_tokens=32, ignore_eos=True, seed=seed)
        ar = Decoder(target, mode="ar").generate(PROMPT, params).token_ids
        assert Decoder(target, drafter, "ddtree", 8).generate(PROMPT, params).token_ids == ar


@pytest.mark.parametrize("budget", [1, 16, 64, 256])
def test_triton_tree_equals_the_torch_tree(budget):
    from specdeploy.engine.tree import TreeBatch, best_first_tree, expected_accept_lengths

    gen = torch.Generator(device="cuda").manual_seed(budget)
    logprobs = torch.log_softmax(3 * torch.randn(2, 15, 151936, device="cuda", generator=gen), dim=-1)
    root = torch.tensor([3, 4], device="cuda")
    got = best_first_tree(root, logprobs, budget)
    top_logp, top_tokens = torch.topk(logprobs, min(budget, logprobs.shape[-1]), dim=-1)
    kernel = TreeBatch.empty(2, budget, root.device)
    triton().best_first_tree(root, top_logp, top_tokens, budget, kernel)
    with torch.device("cpu"):
        reference = best_first_tree(root.cpu(), logprobs.cpu(), budget)  # the torch selection on the CPU
    for name in ("tokens", "parents", "depths", "valid", "ancestors"):
        assert torch.equal(getattr(got, name).cpu(), getattr(reference, name)), name
        assert torch.equal(getattr(kernel, name).cpu(), getattr(reference, name)), name
    budgets = sorted({1, 2, max(1, budget // 4), budget})
    with torch.device("cpu"):
        want = expected_accept_lengths(logprobs.cpu(), budgets)  # the torch selection on the CPU
    torch.testing.assert_close(expected_accept_lengths(logprobs, budgets).cpu(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("tokens", "window", "width", "value_width"),
    [
        (1, 1024, 128, 128),
        (65, 1024, 128, 128),
        (257, 768, 128, 128),
        (17, 512, 576, 512),
        (1, 1024, 256, 256),
        (65, 1024, 256, 256),
        (257, 768, 256, 256),
    ],
)
def test_triton_attention_equals_sdpa(tokens, window, width, value_width):
    from specdeploy.engine.forward_batch import ForwardBatch
    from specdeploy.engine.models import layers

    gen = torch.Generator(device="cuda").manual_seed(tokens)
    kv = 1 if width == 576 else 8
    group = 16 if width == 576 else 4
    q = torch.randn(1, kv, group, tokens, width, device="cuda", generator=gen).bfloat16()
    k_cache = torch.randn(1, window + 64, kv, width, device="cuda", generator=gen).bfloat16()
    v_cache = k_cache[..., :value_width] if width == 576 else torch.randn_like(k_cache)
    visible = torch.rand(1, tokens, window, device="cuda", generator=gen) < 0.5
    visible[:, :, 0] = True
    keys, values = k_cache[:, :window], v_cache[:, :window]
    batch = ForwardBatch(torch.zeros(1, tokens, dtype=torch.long), torch.zeros(1, tokens, dtype=torch.long),
                         visible, window + 64)  # fmt: skip
    got = triton().masked_attention(q, keys, values, visible, width**-0.5)
    with torch_paths():
        want = layers.attend_folded(q, keys, values, batch, width**-0.5)  # SDPA with an additive mask
    close(got, want)


@pytest.mark.parametrize("tokens", [1, 17, 65, 257, 600, 1000])
def test_fused_moe_equals_the_grouped_gemm(tokens):
    """384 experts top-8 plus a shared expert (Kimi's routing) at reduced widths, from decode to prefill (1000
    tokens: 9000 pairs, past the one-program plan): float32 equal to the torch path up to summation order;
    bfloat16 no further from a float32 oracle than the torch path is."""
    from specdeploy.engine.models.layers import SwiGLU
    from specdeploy.engine.models.moe import Experts
    from specdeploy.engine.triton_moe import fused_moe

    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    experts, k, hidden, inter = 384, 8, 1024, 256
    with torch.device("cuda"), torch.no_grad():
        block, shared = Experts(experts, hidden, inter), SwiGLU(hidden, inter)
        for param in (block.w13, block.w2, shared.gate_up_proj.weight, shared.down_proj.weight):
            param.normal_(0.0, 0.05, generator=gen)
        x = torch.randn(tokens, hidden, generator=gen)
        weights = torch.rand(tokens, k, generator=gen)
        indices = torch.rand(tokens, experts, generator=gen).topk(k, dim=-1).indices
        oracle = block.grouped(x, weights, indices) + shared(x)  # float32, one expert at a time
        got = fused_moe(x, block.w13, block.w2, weights, indices, shared.gate_up_proj.weight,
                        shared.down_proj.weight)  # fmt: skip
        torch.testing.assert_close(got, oracle, atol=1e-4, rtol=1e-4)  # K = 1024 sums in another order
        block.bfloat16(), shared.bfloat16()
        xb = x.bfloat16()
        torch_bf16 = block.grouped(xb, weights, indices) + shared(xb)
        got = fused_moe(xb, block.w13, block.w2, weights, indices, shared.gate_up_proj.weight,
                        shared.down_proj.weight)  # fmt: skip
    ours, theirs = (got.float() - oracle).abs().max(), (torch_bf16.float() - oracle).abs().max()
    assert ours <= 1.5 * theirs + 1e-3, (ours.item(), theirs.item())


@pytest.mark.parametrize(("tokens", "experts", "k", "shared"), [(1, 384, 8, 1), (257, 384, 8, 1), (900, 64, 8, 1),
                                                             (65, 128, 8, 0)])  # fmt: skip
def test_kernel_block_plan_equals_the_torch_plan(tokens, experts, k, shared):
    from specdeploy.engine.triton_moe import block_plan, kernel_plan

    gen = torch.Generator(device="cuda").manual_seed(tokens)
    indices = torch.rand(tokens, experts, device="cuda", generator=gen).topk(k, dim=-1).indices
    picks = torch.cat([indices.flatten(), torch.full((tokens * shared,), experts, device="cuda")])
    for block_m in (16, 64):
        want = block_plan(picks, experts + shared, block_m)
        got = kernel_plan(indices, picks.numel(), experts, experts + shared, block_m)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), block_m


def test_one_kernel_routing_equals_the_router_ops():
    """Kimi's routing (384 experts top-8, one group) on the GPU: the same experts and weights as the torch ops."""
    from specdeploy.engine.models.deepseek_v3 import GroupLimitedRouter

    gen = torch.Generator(device="cuda").manual_seed(0)
    config = {
        "n_routed_experts": 384,
        "num_experts_per_tok": 8,
        "hidden_size": 256,
        "n_group": 1,
        "topk_group": 1,
    }
    with torch.device("cuda"), torch.no_grad():
        router = GroupLimitedRouter({**config, "routed_scaling_factor": 2.827})
        router.weight.normal_(generator=gen)
        router.e_score_correction_bias.normal_(0.0, 0.1, generator=gen)
        x = torch.randn(300, 256, generator=gen)
        got = router(x)  # the kernel
        with torch_paths():
            want = router(x)
    assert_same_routing(got, want)


@pytest.mark.parametrize(
    ("experts", "k", "hidden", "inter"),
    [(32, 8, 7168, 2048), (64, 6, 2048, 1408)],
    ids=["kimi", "mla-moe-16b"],
)
@pytest.mark.parametrize("tiles", [((16, 256, 4, 3), (8, 256, 4, 3)), ((4, 512, 8, 2), (32, 128, 2, 4))])
def test_one_token_moe_equals_the_grouped_gemm(experts, k, hidden, inter, tiles, monkeypatch):
    """One token's experts as the matrix-vector kernels (`triton_moe.ONE_TOKEN`) at Kimi's widths (32 of its
    experts, for memory) and mla-moe-16b's, a shared expert included: float32 equal to the torch path up to summation order; bfloat16 no further
    from the float32 oracle than the torch path is."""
    from specdeploy.engine import triton_moe
    from specdeploy.engine.models.layers import SwiGLU
    from specdeploy.engine.models.moe import Experts

    torch.backends.cuda.matmul.allow_tf32 = False
    monkeypatch.setattr(triton_moe, "ONE_TOKEN", tuple(triton_moe.GemvTiles(*t) for t in tiles))
    gen = torch.Generator(device="cuda").manual_seed(experts)
    with torch.device("cuda"), torch.no_grad():
        block, shared = Experts(experts, hidden, inter), SwiGLU(hidden, 2 * inter)
        for param in (block.w13, block.w2, shared.gate_up_proj.weight, shared.down_proj.weight):
            param.normal_(0.0, 0.02, generator=gen)
        x = torch.randn(1, hidden, generator=gen)
        weights = torch.rand(1, k, generator=gen)
        indices = torch.randperm(experts, generator=gen)[:k][None]
        oracle = block.grouped(x, weights, indices) + shared(x)
        args = (block.w13, block.w2, weights, indices, shared.gate_up_proj.weight, shared.down_proj.weight)
        got = triton_moe.fused_moe(x, *args)
        torch.testing.assert_close(got, oracle, atol=1e-4, rtol=1e-4)
        block.bfloat16(), shared.bfloat16()
        xb = x.bfloat16()
        torch_bf16 = block.grouped(xb, weights, indices) + shared(xb)
        args = (block.w13, block.w2, weights, indices, shared.gate_up_proj.weight, shared.down_proj.weight)
        got = triton_moe.fused_moe(xb, *args)
    ours, theirs = (got.float() - oracle).abs().max(), (torch_bf16.float() - oracle).abs().max()
    assert ours <= 1.5 * theirs + 1e-3, (ours.item(), theirs.item())


def one_group_router(experts: int, k: int, hidden: int, gen: torch.Generator):
    """DeepSeek-V3's router without group limits (Kimi's), random weights from `gen`, on the current device."""
    from specdeploy.engine.models.deepseek_v3 import GroupLimitedRouter

    config = {"n_routed_experts": experts, "num_experts_per_tok": k, "hidden_size": hidden, "n_group": 1,
              "topk_group": 1, "routed_scaling_factor": 2.827}  # fmt: skip
    router = GroupLimitedRouter(config)
    router.weight.normal_(0.0, hidden**-0.5, generator=gen)
    router.e_score_correction_bias.normal_(0.0, 0.1, generator=gen)
    return router


@pytest.mark.parametrize(
    ("experts", "k", "hidden"), [(384, 8, 7168), (64, 6, 2048)], ids=["kimi", "mla-moe-16b"]
)
@pytest.mark.parametrize("block_e", [1, 4, 16])
def test_routing_in_one_kernel_replayed_from_a_cuda_graph_equals_the_router_ops(experts, k, hidden, block_e):
    """`triton_moe.route` captured once in a CUDA graph and replayed for new tokens (1 and 16 at a time): the
    same experts and weights as the router's torch ops every time, so the done-counts went back to zero."""
    from specdeploy.engine import triton_moe

    torch.backends.cuda.matmul.allow_tf32 = False  # the torch router's float32 product, exactly
    gen = torch.Generator(device="cuda").manual_seed(block_e)
    with torch.device("cuda"), torch.no_grad():
        router = one_group_router(experts, k, hidden, gen)
        for tokens in (1, 16):
            x = torch.randn(tokens, hidden, generator=gen).bfloat16()
            args = (router.e_score_correction_bias, k, True, 2.827, block_e)
            triton_moe.route(x, router.weight, *args)  # eager first: compiles, allocates the done-counts
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                got = triton_moe.route(x, router.weight, *args)
            for _ in range(3):
                x.copy_(torch.randn(tokens, hidden, generator=gen))
                graph.replay()
                with torch_paths():
                    assert_same_routing(got, router(x))


@pytest.mark.parametrize(
    ("experts", "k", "hidden"), [(384, 8, 7168), (64, 6, 2048)], ids=["kimi", "mla-moe-16b"]
)
@pytest.mark.parametrize("zero_centered", [False, True])
def test_the_norm_made_in_the_routers_kernel_equals_the_norm_then_the_router(
    experts, k, hidden, zero_centered
):
    """`triton_moe.norm_route` in bf16, captured in a CUDA graph and replayed for new tokens (1 and 16 at a
    time): x + residual as the norm's kernel sums it, the normed tokens within one bf16 rounding of its (the two
    sum the squares in other orders), and the router's experts and weights for those normed tokens."""
    from specdeploy.engine import triton_moe

    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(hidden)
    with torch.device("cuda"), torch.no_grad():
        router = one_group_router(experts, k, hidden, gen)
        weight = (0.1 * torch.randn(hidden, generator=gen) + (0.0 if zero_centered else 1.0)).bfloat16()
        for tokens in (1, 16):
            x, residual = (torch.randn(tokens, hidden, generator=gen).bfloat16() for _ in range(2))
            args = (residual, (weight, 1e-6, zero_centered), router.weight, router.e_score_correction_bias, k,
                    True, 2.827)  # fmt: skip
            triton_moe.norm_route(x, *args)  # eager first: compiles, allocates the done-counts
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                *routing, normed, total = triton_moe.norm_route(x, *args)
            for _ in range(3):
                x.copy_(torch.randn(tokens, hidden, generator=gen))
                residual.copy_(torch.randn(tokens, hidden, generator=gen))
                graph.replay()
                want_normed, want_total = triton().rms_norm(x, weight, 1e-6, residual, zero_centered)
                assert torch.equal(total, want_total)
                torch.testing.assert_close(normed, want_normed, atol=0, rtol=2**-7)
                with torch_paths():
                    assert_same_routing(tuple(routing), router(normed))


@pytest.mark.parametrize(("tokens", "window"), [(1, 640), (4, 640), (65, 1024), (257, 768)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mla_attention_with_the_value_up_projection_equals_sdpa_and_einsum(tokens, window, dtype):
    """Kimi's widths (64 heads, latent 512 + 64, values 128): each head's output mapped out through kv_b_proj's
    value half (in the splits' combine up to COMBINE_UP_HEAD_ROWS (head, row) pairs, by a matmul after it beyond),
    against SDPA and torch's batched matmul. In bf16 both round at different points: the kernels' result must be
    as close to the float32 result as twice torch's bf16 path is."""
    from specdeploy.engine.forward_batch import ForwardBatch
    from specdeploy.engine.models import layers

    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    heads, latent, width = 64, 512, 576
    with torch.device("cuda"):
        q = torch.randn(1, 1, heads, tokens, width, generator=gen).to(dtype)
        k_cache = torch.randn(1, window + 64, 1, width, generator=gen).to(dtype)
        up = (torch.randn(heads, 256, latent, generator=gen) / latent**0.5).to(dtype)
        visible = torch.rand(1, tokens, window, generator=gen) < 0.5
    visible[:, :, 0] = True
    batch = ForwardBatch(torch.zeros(1, tokens, dtype=torch.long), torch.zeros(1, tokens, dtype=torch.long),
                         visible, window + 64)  # fmt: skip

    def torch_path(cast: torch.dtype) -> torch.Tensor:
        keys = k_cache[:, :window].to(cast)
        with torch_paths():
            return layers.attend_folded(
                q.to(cast), keys, keys[..., :latent], batch, width**-0.5, up[:, 128:].to(cast)
            )

    keys = k_cache[:, :window]
    got = triton().masked_attention(q, keys, keys[..., :latent], visible, width**-0.5, value_up=up[:, 128:])
    want = torch_path(dtype)
    if dtype == torch.float32:
        close(got, want)
    else:
        exact = torch_path(torch.float32)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert (got.float() - exact).abs().max() <= 2 * (want.float() - exact).abs().max()


@pytest.mark.parametrize(
    ("out_features", "in_features"), [(3648, 2048), (2048, 2048), (2112, 7168), (12288, 1536), (7168, 8192)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_one_row_linear_equals_f_linear(out_features, in_features, dtype, bias):
    """mla-moe-16b's and Kimi's one-row projections (q|kv_a, o_proj; Kimi's q_a|kv_a, q_b and o_proj), launched
    as every engine kernel is (with PDL on Hopper), the first weight tile loaded before the wait."""
    from specdeploy.engine.triton_gemv import ONE_ROW_LINEAR, linear_one_row

    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(in_features)
    with torch.device("cuda"):
        weight = (torch.randn(out_features, in_features, generator=gen) / in_features**0.5).to(dtype)
        b = torch.randn(out_features, generator=gen).to(dtype) if bias else None
        x = torch.randn(1, 1, in_features, generator=gen).to(dtype)
    close(linear_one_row(x, weight, b, ONE_ROW_LINEAR), torch.nn.functional.linear(x, weight, b))


@pytest.mark.parametrize(
    ("out_features", "in_features"), [(3648, 2048), (12288, 4096), (2112, 7168), (1536, 256)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_norm_linear_row_equals_the_norm_then_the_projection(out_features, in_features, dtype, zero_centered):
    """One row's projection of RMSNorm(x + residual) in one kernel against `ops.rms_norm` then the one-row
    projection (mla-moe-16b's, Qwen3-8B's, Kimi's and the zoo's first projections): the sum exactly, the output up
    to the order of the squares' float32 sum (one rounding step in bf16)."""
    from specdeploy.engine import ops
    from specdeploy.engine.triton_gemv import ONE_ROW_LINEAR, linear_one_row, norm_linear_row

    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(in_features)
    with torch.device("cuda"):
        weight = (torch.randn(out_features, in_features, generator=gen) / in_features**0.5).to(dtype)
        norm = (torch.randn(in_features, generator=gen) * 0.1 + (0.0 if zero_centered else 1.0)).to(dtype)
        x, residual = (torch.randn(1, 1, in_features, generator=gen).to(dtype) for _ in range(2))
    normed, total = ops.rms_norm(x, norm, 1e-6, residual, zero_centered)
    got, got_total = norm_linear_row(x, residual, norm, 1e-6, zero_centered, weight, None, ONE_ROW_LINEAR)
    assert torch.equal(got_total, total)
    close(got, linear_one_row(normed, weight, None, ONE_ROW_LINEAR))


@pytest.mark.parametrize(("out_features", "inter"), [(4096, 12288), (5120, 17408), (256, 768)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_down_row_equals_its_two_kernels(out_features, inter, dtype):
    """One row's SwiGLU down projection in one kernel gives what `silu_mul` then the one-row projection give
    (Qwen3-8B's, Qwen3.6-27B's and the zoo's widths): exactly in bf16 (the same roundings, the same sums in the same
    order); in float32 up to its last bits (on one H100 the two differed there, cause not traced)."""
    from specdeploy.engine import ops
    from specdeploy.engine.triton_gemv import ONE_ROW_LINEAR, linear_one_row, swiglu_down_row

    gen = torch.Generator(device="cuda").manual_seed(inter)
    with torch.device("cuda"):
        weight = (torch.randn(out_features, inter, generator=gen) / inter**0.5).to(dtype)
        gate_up = torch.randn(1, 1, 2 * inter, generator=gen).to(dtype)
    want = linear_one_row(ops.silu_mul(gate_up), weight, None, ONE_ROW_LINEAR)
    got = swiglu_down_row(gate_up, weight, None, ONE_ROW_LINEAR)
    if dtype == torch.bfloat16:
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows", [2, 16, 17, 65, 128])
@pytest.mark.parametrize("out_features,in_features", [(1536, 256), (2048, 256), (256, 768), (600, 1000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_few_rows_linear_equals_f_linear(rows, out_features, in_features, dtype):
    """The zoo's projections (q|k|v and gate|up of 256-wide rows, the LM head, down) and widths no multiple of the
    tiles, at a DFlash block's and DDTree verifies' row counts, launched as every engine kernel is; float32
    multiplied in full float32 (the tolerance of `close` would not hold TF32's 10-bit mantissas)."""
    from specdeploy.engine.triton_gemv import ROWS_LINEAR, linear_rows

    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(rows * in_features)
    with torch.device("cuda"):
        weight = (torch.randn(out_features, in_features, generator=gen) / in_features**0.5).to(dtype)
        b = torch.randn(out_features, generator=gen).to(dtype) if rows % 2 else None
        x = torch.randn(1, rows, in_features, generator=gen).to(dtype)
    close(linear_rows(x, weight, b, ROWS_LINEAR), torch.nn.functional.linear(x, weight, b))


@pytest.mark.parametrize("family", ["deepseek_v3"])
def test_mla_moe_kernels_give_the_torch_paths_logits(pairs, family):
    """The whole DeepSeek-V3 forward (routing, fused MoE, MLA query/entry, latent attention) in fp32 with the
    Triton kernels against the same model with every kernel off: prefill, a 5-token verify over it, then one token
    (its projections through the one-row kernel)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    target = load_target(pairs[family][0], "cuda", torch.float32)
    sequence = torch.tensor([PROMPT + [11, 4, 30, 2, 19, 23]], device="cuda")

    def logits() -> tuple[torch.Tensor, ...]:
        cache = target.new_cache(1, 32)
        with torch.inference_mode():
            first, _ = target_pass(target, sequence[:, :7], torch.arange(7, device="cuda")[None], cache)
            second, _ = target_pass(
                target, sequence[:, 7:12], torch.arange(7, 12, device="cuda")[None], cache, 7
            )
            third, _ = target_pass(
                target, sequence[:, 12:], torch.arange(12, 13, device="cuda")[None], cache, 12
            )
        return first, second, third

    got = logits()
    with torch_paths():
        want = logits()
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tokens", [1, 65])
def test_mla_query_entry_equals_torch_at_kimi_widths(tokens):
    from specdeploy.engine.models.rope import RotaryEmbedding, apply_rope
    from specdeploy.engine.triton_mla import mla_query_entry

    gen = torch.Generator(device="cuda").manual_seed(tokens)
    heads, nope, latent, rope_dim, capacity = 64, 128, 512, 64, 256
    with torch.device("cuda"):
        proj = torch.randn(1, tokens, 1536 + latent + rope_dim, generator=gen).bfloat16()
        q = torch.randn(1, tokens, heads, nope + rope_dim, generator=gen).bfloat16()
        key_up = (torch.randn(heads, nope + 128, latent, generator=gen) / nope**0.5).bfloat16()[:, :nope]
        weight = (1 + 0.1 * torch.randn(latent, generator=gen)).bfloat16()
        # the module computes its frequencies on the CPU (as at load time); moved like a model's buffers
        rope = RotaryEmbedding({"rope_type": "default", "rope_theta": 5e4}, rope_dim, 4096).to("cuda")(
            torch.arange(100, 100 + tokens)[None], torch.bfloat16
        )
        slots = torch.randperm(capacity, generator=gen)[:tokens]
        cache = torch.zeros(capacity, 1, latent + rope_dim, dtype=torch.bfloat16)
    kv = proj[..., 1536:]
    got = mla_query_entry(q, key_up, kv, weight, 1e-6, *rope, slots, cache, True)

    def torch_path(cast: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [t.to(cast) for t in (q, key_up, kv, weight, *rope)]
        q_c, key_up_c, kv_c, weight_c, cos, sin = parts
        absorbed = torch.einsum("bthn,hnr->bthr", q_c[..., :nope], key_up_c)
        query = torch.cat([absorbed, apply_rope(q_c[..., nope:], (cos, sin), True)], dim=-1)
        entry = torch.cat([ops.torch_rms_norm(kv_c[..., :latent], weight_c, 1e-6)[:, :, None],
                           apply_rope(kv_c[..., None, latent:], (cos, sin), True)], dim=-1)  # fmt: skip
        cache = torch.zeros(capacity, 1, latent + rope_dim, dtype=cast, device="cuda")
        return query, cache.index_copy_(0, slots, entry.reshape(tokens, 1, -1))

    # The kernel rotates in float32 and rounds once; the bf16 torch path rounds each product, so near a
    # cancellation the two differ by more than a rounding step: each must be as close to float32 as torch's.
    (want, want_cache), (exact, exact_cache) = torch_path(torch.bfloat16), torch_path(torch.float32)
    for kernel, torch_bf16, reference in ((got, want, exact), (cache, want_cache, exact_cache)):
        assert kernel.dtype == torch_bf16.dtype and kernel.shape == torch_bf16.shape
        kernel_error = (kernel.float() - reference).abs().max().item()
        assert kernel_error <= (torch_bf16.float() - reference).abs().max().item() + 1e-6
