"""Tiny random target + drafter pairs built in a temporary directory, for the decoding tests."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import DeepseekV3Config, Qwen3Config, Qwen3MoeConfig, Qwen3NextConfig

from specdeploy.engine.drafter import DFlashDrafter
from specdeploy.engine.loading import save_drafter

HIDDEN = 32


def target_config(family: str, vocab: int, layers: int = 4):
    common = dict(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=vocab - 2,
        bos_token_id=0,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    if family == "qwen3":
        return Qwen3Config(**common, intermediate_size=64, head_dim=8)
    if family == "qwen3_moe":
        return Qwen3MoeConfig(
            **common,
            intermediate_size=64,
            moe_intermediate_size=16,
            num_experts=4,
            num_experts_per_tok=2,
            head_dim=8,
            decoder_sparse_step=1,
            mlp_only_layers=[],
        )
    if family in ("deepseek_v3", "kimi"):
        common["num_key_value_heads"] = common["num_attention_heads"]  # MLA: every head has its own K/V
        groups = 1 if family == "kimi" else 2  # Kimi K2 routes among all its experts: one group
        return DeepseekV3Config(
            **common,
            intermediate_size=64,
            moe_intermediate_size=16,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=groups,
            topk_group=1,
            n_shared_experts=1,
            first_k_dense_replace=1,
            q_lora_rank=16,
            # a latent head of 32 + 16 runs the Triton MLA kernels (16 + 4 never reached the Triton attention);
            # the nope and value widths of 8 take their padded paths
            kv_lora_rank=32,
            qk_nope_head_dim=8,
            qk_rope_head_dim=16,
            v_head_dim=8,
        )
    if family == "qwen3_next":  # hybrid: Gated DeltaNet layers around one full-attention layer, dense MLPs
        return Qwen3NextConfig(
            **common,
            intermediate_size=64,
            head_dim=8,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
            layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"][
                :layers
            ],
            mlp_only_layers=list(range(layers)),
        )
    raise ValueError(family)


def drafter_config(vocab: int, block_size: int, target_layers: int = 4) -> dict:
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": HIDDEN,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "intermediate_size": 64,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 512,
        "rope_theta": 10000.0,
        "num_target_layers": target_layers,
        "block_size": block_size,
        "vocab_size": vocab,
        "dflash_config": {"target_layer_ids": [0, 2], "mask_token_id": vocab - 1},
    }


def write_pair(
    root: Path, family: str, vocab: int = 64, block_size: int = 8, seed: int = 0, logit_scale: float = 1.0
) -> tuple[Path, Path]:
    """Save a random target (with transformers) and a random drafter (z-lab format) under root."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(target_config(family, vocab))
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)  # sharper targets make sampling tests see more structure
    target_dir, draft_dir = root / f"{family}-target", root / f"{family}-draft"
    model.save_pretrained(target_dir)
    drafter = DFlashDrafter(drafter_config(vocab, block_size))
    with torch.no_grad():
        for p in drafter.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    save_drafter(drafter, draft_dir)
    return target_dir, draft_dir
