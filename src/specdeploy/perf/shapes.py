"""Named shapes of real target + DFlash drafter pairs, for speed measurements with random weights.

Each shape is a pair of config.json dictionaries (the target's, in transformers' layout, and the drafter's,
in z-lab's), so the same shape builds this engine's models and transformers' alike. Speed depends on the
dimensions only; acceptance of random weights is meaningless (about one token per step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdeploy.engine.drafter_config import new_drafter_config
from specdeploy.errors import SpecdeployError


@dataclass(frozen=True)
class Shape:
    name: str
    description: str
    source: str  # where the dimensions come from
    target: dict[str, Any]
    drafter: dict[str, Any]


# Qwen/Qwen3-8B config.json; the drafter as recorded in recipes/pairs/qwen3-8b.toml (z-lab/Qwen3-8B-DFlash-b16:
# 5 Qwen3-8B-shaped layers, block 16).
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}

# A DeepSeek-V3-architecture model (MLA + sigmoid-routed MoE, Kimi K2's design) at the dimensions of
# Moonlight-16B-A3B as recorded here (not checked against its config.json): 16B parameters, 3B active.
MLA_MOE_16B = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 163840,
    "hidden_size": 2048,
    "intermediate_size": 11264,
    "moe_intermediate_size": 1408,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "num_experts_per_tok": 6,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.446,
    "norm_topk_prob": True,
    "scoring_func": "sigmoid",
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 50000.0,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "num_nextn_predict_layers": 0,
    "bos_token_id": 163584,
    "eos_token_id": 163585,
}


# Kimi K2.6's text model (DeepSeek-V3 architecture) at Kimi K2's config.json dimensions as recorded here (hidden,
# MLA ranks, 384 experts, vocab and context agree with the recipe; the rest is not checked against K2.6's
# config.json), cut to the layers one 141 GB H200 holds in bf16: Kimi's dense first layer
# and 3 MoE layers of 384 experts (33.8 GB each) are 108 GB with the embedding and LM head; a fourth MoE layer
# (142 GB) would not fit beside the drafter. The drafter is z-lab/Kimi-K2.6-DFlash's shape (6 layers, 64/8
# heads, block 8, 3.5B parameters); with 4 target layers its context layers all read layer 1.
KIMI_LIKE = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 163840,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 4,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "n_routed_experts": 384,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.827,
    "norm_topk_prob": True,
    "scoring_func": "sigmoid",
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "max_position_embeddings": 262144,
    "rope_theta": 50000.0,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 64.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "num_nextn_predict_layers": 0,
    "bos_token_id": 163584,
    "eos_token_id": 163585,
}


# The same dimensions cut to what one 80 GB H100 holds: Kimi's dense first layer and one MoE layer, about 40 GB of
# bf16 target with the embedding and LM head; a second MoE layer (another 33.8 GB) would not fit beside the drafter.
KIMI_LIKE_H100 = {**KIMI_LIKE, "num_hidden_layers": 2}


# Qwen3.6-27B's text model, whole (64 layers): 27B parameters are 54 GB in bf16, which one 141 GB H200 holds
# with the drafter and caches. Dimensions from the Qwen/Qwen3.6-27B model card ("Hidden Layout: 16 x (3 x (Gated
# DeltaNet -> FFN) -> 1 x (Gated Attention -> FFN))"; Gated DeltaNet 48 V heads and 16 QK heads of dim 128;
# gated attention 24 Q and 4 KV heads of dim 256, rotary dim 64; FFN 17408; vocab 248320 padded) and the
# Qwen3.5-27B text_config that Qwen3.6-27B reuses (model_type qwen3_5, architecture
# Qwen3_5ForConditionalGeneration): linear_conv_kernel_dim 4, attn_output_gate true, partial_rotary_factor 0.25,
# rope_theta 1e7, max_position_embeddings 262144, rms_norm_eps 1e-6, eos 248044, untied embeddings. The text
# model alone is `Qwen3_5ForCausalLM` (model_type qwen3_5_text), which this engine builds. M-RoPE's sections
# are left out: text positions are equal on every axis, so it is plain RoPE.
QWEN3_6_27B = {
    "architectures": ["Qwen3_5ForCausalLM"],
    "model_type": "qwen3_5_text",
    "vocab_size": 248320,
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_hidden_layers": 64,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 16,
    "full_attention_interval": 4,
    "num_attention_heads": 24,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "attn_output_gate": True,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "partial_rotary_factor": 0.25,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
    "eos_token_id": 248044,
}


def _drafter(target: dict[str, Any], layers: int, heads: int, kv_heads: int, inter: int, block: int) -> dict:
    return new_drafter_config(
        hidden_size=target["hidden_size"],
        num_target_layers=target["num_hidden_layers"],
        vocab_size=target["vocab_size"],
        mask_token_id=target["vocab_size"] - 1,
        block_size=block,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=128,
        intermediate_size=inter,
        max_position_embeddings=target["max_position_embeddings"],
        # transformers 5 configs (Qwen3.5) keep rope_theta inside rope_parameters
        rope_theta=target.get("rope_theta") or target["rope_parameters"]["rope_theta"],
    )


SHAPES = {
    shape.name: shape
    for shape in (
        Shape(
            "qwen3-8b",
            "Qwen3-8B with a block-16 DFlash drafter of 5 Qwen3-8B-shaped layers",
            "Qwen/Qwen3-8B config.json; drafter per z-lab/Qwen3-8B-DFlash-b16 (recipes/pairs/qwen3-8b.toml)",
            QWEN3_8B,
            _drafter(QWEN3_8B, layers=5, heads=32, kv_heads=8, inter=12288, block=16),
        ),
        Shape(
            "mla-moe-16b",
            "DeepSeek-V3 architecture (MLA, 64 routed experts top-6 + 2 shared) at 16B, block-8 drafter",
            "Moonlight-16B-A3B's dimensions as recorded in this file; drafter of 4 layers (Kimi-style block 8)",
            MLA_MOE_16B,
            _drafter(MLA_MOE_16B, layers=4, heads=16, kv_heads=4, inter=8192, block=8),
        ),
        Shape(
            "kimi-like",
            "Kimi K2.6's dimensions (MLA, 384 routed experts top-8 + 1 shared) in 4 layers (1 dense + 3 MoE), "
            "Kimi-K2.6-DFlash-shaped drafter",
            "Kimi K2.6 / K2 config.json dimensions and z-lab/Kimi-K2.6-DFlash's (DOMAIN.md); layers cut to fit "
            "one H200 in bf16",
            KIMI_LIKE,
            _drafter(KIMI_LIKE, layers=6, heads=64, kv_heads=8, inter=18432, block=8),
        ),
        Shape(
            "kimi-like-h100",
            "Kimi K2.6's dimensions in 2 layers (1 dense + 1 MoE of 384 experts), Kimi-K2.6-DFlash-shaped drafter",
            "as kimi-like, with layers cut to fit one 80 GB H100 in bf16",
            KIMI_LIKE_H100,
            _drafter(KIMI_LIKE_H100, layers=6, heads=64, kv_heads=8, inter=18432, block=8),
        ),
        Shape(
            "qwen3.6-27b",
            "Qwen3.6-27B (hybrid: 48 Gated DeltaNet + 16 gated attention layers, 64 in all) with a block-16 "
            "DFlash drafter of 5 layers",
            "Qwen/Qwen3.6-27B model card and its Qwen3.5-27B text_config; drafter as a DFlash config for this "
            "target found on the Hub (HyzeAI/Hyze1B: 5 layers, 32/8 heads of 128, FFN 17408, block 16, target "
            "layers 1, 16, 31, 46, 61), not checked against z-lab/Qwen3.6-27B-DFlash's config.json",
            QWEN3_6_27B,
            _drafter(QWEN3_6_27B, layers=5, heads=32, kv_heads=8, inter=17408, block=16),
        ),
    )
}


# Widths `tiny` gives every shape that has the key; layer counts, layer kinds and the block size are kept.
TINY_WIDTHS = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "q_lora_rank": 32,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "max_position_embeddings": 4096,
    "bos_token_id": 0,
    "eos_token_id": 510,  # the drafter's mask token is the last id
}


def tiny(shape: Shape) -> Shape:
    """`shape`'s layer pattern and drafter block at tiny widths: builds and steps in seconds on a CPU."""
    target = {**shape.target, **{k: v for k, v in TINY_WIDTHS.items() if shape.target.get(k) is not None}}
    drafter = shape.drafter
    draft = _drafter(
        target, drafter["num_hidden_layers"], heads=4, kv_heads=2, inter=128, block=drafter["block_size"]
    )
    return Shape(f"{shape.name}-tiny", f"{shape.description}, at tiny widths", shape.source, target, draft)


def get_shape(name: str) -> Shape:
    if name not in SHAPES:
        raise SpecdeployError(f"unknown shape {name!r}: choose one of {', '.join(SHAPES)}")
    return SHAPES[name]
