"""Tiny random hybrid targets (Qwen3-Next dense and MoE, Qwen3.5) saved by transformers, and a matching drafter."""

from __future__ import annotations

from pathlib import Path

import torch
from decode_helpers import HIDDEN, drafter_config
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig, Qwen3NextConfig, Qwen3NextForCausalLM

from specdeploy.engine.drafter import DFlashDrafter
from specdeploy.engine.loading import save_drafter

VOCAB = 64
SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,  # two value heads per key head, as in the real models
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
    max_position_embeddings=512,
    eos_token_id=VOCAB - 2,
    bos_token_id=0,
    pad_token_id=0,
)
CONFIGS = {
    "qwen3_next": (Qwen3NextForCausalLM, Qwen3NextConfig(**SHAPE, mlp_only_layers=[0, 1, 2, 3])),
    "qwen3_next_moe": (
        Qwen3NextForCausalLM,
        Qwen3NextConfig(
            **SHAPE,
            mlp_only_layers=[0],
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=16,
        ),
    ),
    "qwen3_5": (Qwen3_5ForCausalLM, Qwen3_5TextConfig(**SHAPE)),
}


def write_target(name: str, path: Path, seed: int = 0) -> Path:
    """A random target of CONFIGS[name], every weight perturbed (its norms would start at exactly 0 or 1)."""
    cls, config = CONFIGS[name]
    torch.manual_seed(seed)
    model = cls(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    return path


def write_drafter(path: Path, block_size: int = 8, seed: int = 100) -> Path:
    """A random DFlash drafter for the targets above (hidden size and feature layers match)."""
    torch.manual_seed(seed)
    drafter = DFlashDrafter(drafter_config(VOCAB, block_size=block_size))
    with torch.no_grad():
        for p in drafter.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    save_drafter(drafter, path)
    return path
