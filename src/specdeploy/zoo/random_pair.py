"""Tiny random target + DFlash drafter pairs: real checkpoint directories that every loader accepts.

The target is written by transformers' own classes (config.json + model.safetensors + the byte-level
tokenizer), the drafter in z-lab's format, matched to the target (hidden size, target layers, mask id).
Untrained, so acceptance is meaningless; they exist to exercise loading, serving and decoding paths in
milliseconds on a CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from specdeploy.engine.drafter import DFlashDrafter
from specdeploy.engine.drafter_config import new_drafter_config
from specdeploy.engine.loading import save_drafter
from specdeploy.errors import SpecdeployError
from specdeploy.zoo.byte_tokenizer import EOS_TOKEN_ID, MASK_TOKEN_ID, VOCAB_SIZE, write_byte_tokenizer

FAMILIES = ("qwen3", "qwen3_moe", "deepseek_v3")
BLOCK_SIZES = (8, 16)  # the block sizes of z-lab's published drafters

HIDDEN_SIZE = 64
NUM_TARGET_LAYERS = 6
NUM_DRAFT_LAYERS = 2
MAX_POSITIONS = 2048

# Attention and MLP sizes shared by the dense and MoE Qwen3 targets.
QWEN3_SHAPE: dict[str, Any] = {
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
# A Kimi K2 in miniature: MLA, routed + shared experts, a dense first layer, and Kimi's YaRN settings
# (mscale = mscale_all_dim = 1.0) at a small scale.
DEEPSEEK_V3_SHAPE: dict[str, Any] = {
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "num_nextn_predict_layers": 0,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 50000.0,
        "factor": 4.0,
        "original_max_position_embeddings": MAX_POSITIONS // 4,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    },
}
DRAFT_SHAPE: dict[str, int] = {"num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "intermediate_size": 128}


def target_config(family: str) -> PretrainedConfig:
    common: dict[str, Any] = {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN_SIZE,
        "num_hidden_layers": NUM_TARGET_LAYERS,
        "max_position_embeddings": MAX_POSITIONS,
        "eos_token_id": EOS_TOKEN_ID,
        "pad_token_id": EOS_TOKEN_ID,
        "bos_token_id": None,
        "tie_word_embeddings": False,
    }
    if family == "qwen3":
        return Qwen3Config(**common, **QWEN3_SHAPE)
    if family == "qwen3_moe":
        moe = {
            "moe_intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
        }
        return Qwen3MoeConfig(**common, **QWEN3_SHAPE, **moe)
    if family == "deepseek_v3":
        return DeepseekV3Config(**common, **DEEPSEEK_V3_SHAPE)
    raise SpecdeployError(f"unknown model family {family!r}: choose one of {', '.join(FAMILIES)}")


def target_model(config: PretrainedConfig) -> PreTrainedModel:
    classes = {
        "qwen3": Qwen3ForCausalLM,
        "qwen3_moe": Qwen3MoeForCausalLM,
        "deepseek_v3": DeepseekV3ForCausalLM,
    }
    return classes[config.model_type](config)


def drafter_config_for(target: PretrainedConfig, block_size: int) -> dict[str, Any]:
    """A drafter config matched to `target`, with the target's RoPE (z-lab drafters copy it)."""
    rope = dict(target.rope_parameters)
    rope_theta = rope.pop("rope_theta")
    return new_drafter_config(
        hidden_size=target.hidden_size,
        num_target_layers=target.num_hidden_layers,
        vocab_size=target.vocab_size,
        mask_token_id=MASK_TOKEN_ID,
        block_size=block_size,
        num_layers=NUM_DRAFT_LAYERS,
        max_position_embeddings=target.max_position_embeddings,
        rope_theta=rope_theta,
        rope_scaling=rope if rope["rope_type"] != "default" else None,
        **DRAFT_SHAPE,
    )


def empty_directory(path: Path) -> Path:
    if path.exists() and any(path.iterdir()):
        raise SpecdeployError(f"{path} already exists and is not empty: choose another output directory")
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_random_pair(
    out_dir: str | Path, family: str = "qwen3", seed: int = 0, block_size: int = 16
) -> tuple[Path, Path]:
    """Write OUT_DIR/target and OUT_DIR/draft; the same seed gives the same weights."""
    if family not in FAMILIES:
        raise SpecdeployError(f"unknown model family {family!r}: choose one of {', '.join(FAMILIES)}")
    if block_size not in BLOCK_SIZES:
        raise SpecdeployError(f"block size {block_size} is not supported: choose one of {BLOCK_SIZES}")
    out_dir = Path(out_dir)
    target_dir, draft_dir = empty_directory(out_dir / "target"), empty_directory(out_dir / "draft")
    config = target_config(family)
    with torch.random.fork_rng(devices=[]):  # leave the caller's random stream untouched
        torch.manual_seed(seed)
        target = target_model(config)
        drafter = DFlashDrafter(drafter_config_for(config, block_size))
    target.save_pretrained(str(target_dir))
    write_byte_tokenizer(target_dir)
    save_drafter(drafter, draft_dir)
    return target_dir, draft_dir
