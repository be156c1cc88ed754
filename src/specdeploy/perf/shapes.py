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
        rope_theta=target["rope_theta"],
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
    )
}


def get_shape(name: str) -> Shape:
    if name not in SHAPES:
        raise SpecdeployError(f"unknown shape {name!r}: choose one of {', '.join(SHAPES)}")
    return SHAPES[name]
