"""The bytes a step must read and the expert union, on a tiny DeepSeek-V3 shape whose sizes are counted by hand."""

from __future__ import annotations

import pytest
import torch

from specdeploy.perf.profile import profile_decoding, random_prompt
from specdeploy.perf.random_models import random_pair
from specdeploy.perf.roofline import expert_union, independent_union, step_bytes, weight_bytes
from specdeploy.perf.shapes import MLA_MOE_16B, Shape, _drafter

# 3 layers (1 dense + 2 MoE of 8 experts top-2, expert width 16), hidden 32; MLA latent 16 + rope 4
TINY = {
    **MLA_MOE_16B,
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 8,
    "max_position_embeddings": 512,
    "bos_token_id": 0,
    "eos_token_id": 1,
}
# drafter: 2 layers of 2 key/value heads of width 128 (the shapes module's head_dim)
SHAPE = Shape(
    "tiny", "tiny", "by hand", TINY, _drafter(TINY, layers=2, heads=2, kv_heads=2, inter=48, block=4)
)
FP32 = 4


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    return random_pair(SHAPE, torch.device("cpu"), torch.float32)


def test_bytes_counted_by_hand(pair) -> None:
    target, drafter = pair
    routed = 2 * 8 * 3 * 32 * 16 * FP32  # 2 MoE layers x 8 experts x gate, up, down of 32 x 16
    weights = weight_bytes(target)
    assert weights["routed"] == routed
    every = sum(p.numel() * p.element_size() for p in target.parameters())
    assert weights["dense"] == every - routed - 64 * 32 * FP32  # all but the routed experts and embedding
    ar = step_bytes(target, None, tokens=1, context=100, union=0.25)
    assert ar["routed_experts"] == routed // 4
    assert ar["target_cache"] == 100 * 3 * (16 + 4) * FP32  # a latent and a rope key per layer
    assert ar["total"] == weights["dense"] + routed // 4 + 100 * 3 * 20 * FP32
    spec = step_bytes(target, drafter, tokens=5, context=100, union=0.5)
    own = sum(p.numel() for p in drafter.parameters()) * FP32
    assert spec["drafter_weights"] == own + 64 * 32 * FP32  # plus the LM head it borrows
    assert spec["drafter_cache"] == 100 * 2 * 2 * 2 * 128 * FP32  # layers x (K, V) x heads x 128


def test_expert_union_is_measured(pair) -> None:
    target, _ = pair
    union = expert_union(target, random_prompt(64, 96), [1, 4, 16, 96, 200])
    assert union[1] == pytest.approx(2 / 8)  # one token picks exactly its top 2 of 8
    assert union[1] < union[4] <= union[16] <= union[96] <= 1.0
    assert union[4] <= 4 * 2 / 8
    assert 200 not in union  # the prompt holds no run of 200 tokens


def test_independent_union_is_the_recorded_arithmetic() -> None:
    # DOMAIN.md: Kimi K2.6 (E=384, k=8): 16 tokens touch 29% of the experts, 65 tokens 75%
    assert round(independent_union(8, 384, 16), 2) == 0.29
    assert round(independent_union(8, 384, 65), 2) == 0.75


def test_profile_reports_the_roofline_of_its_own_step(pair) -> None:
    target, drafter = pair
    prompt = random_prompt(64, 40)
    result = profile_decoding(target, drafter, "ddtree", 3, prompt, 8, bandwidth=1e9)
    assert result.verify_tokens == 4
    assert result.expert_union == pytest.approx(expert_union(target, prompt, [4])[4])
    context = 40 + result.new_tokens // 2
    assert result.bytes_per_step == step_bytes(target, drafter, 4, context, result.expert_union)
    assert result.roofline_ms == pytest.approx(1e3 * result.bytes_per_step["total"] / 1e9)
    assert result.fraction_of_roofline == pytest.approx(result.roofline_ms / result.ms_per_step)


# Qwen3.5 layout, hidden 32: 3 Gated DeltaNet layers (2 key heads and 4 value heads of 8, conv width 4), then one
# gated attention layer (2 query heads, 1 key/value head of 16)
HYBRID = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "model_type": "qwen3_5_text",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "max_position_embeddings": 512,
    "eos_token_id": 1,
}
HYBRID_SHAPE = Shape(
    "tiny-hybrid",
    "tiny",
    "by hand",
    HYBRID,
    _drafter(HYBRID, layers=1, heads=2, kv_heads=2, inter=48, block=4),
)


@pytest.mark.parametrize(("dtype", "element"), [(torch.float32, 4), (torch.bfloat16, 2)])
def test_hybrid_state_is_read_and_written_once_per_step_and_keeps_no_kv(dtype, element) -> None:
    target, drafter = random_pair(HYBRID_SHAPE, torch.device("cpu"), dtype)
    state = 4 * 8 * 8 * FP32  # v_heads x k_dim x v_dim, float32 in any model dtype
    conv = 3 * (16 + 16 + 32) * element  # width - 1 inputs of q (2x8), k (2x8) and v (4x8)
    ar = step_bytes(target, None, tokens=1, context=100, union=None)
    assert ar["target_state"] == 2 * 3 * (state + conv)  # 3 recurrent layers, each read and written back
    assert ar["target_cache"] == 100 * 2 * 16 * element  # only the attention layer: K and V of 1 head of 16
    tree = step_bytes(target, drafter, tokens=65, context=400, union=None)
    assert tree["target_state"] == ar["target_state"]  # whatever the tokens and the context
    every = sum(p.numel() * p.element_size() for p in target.parameters())
    assert ar["total"] == every - 64 * 32 * element + ar["target_cache"] + ar["target_state"]
