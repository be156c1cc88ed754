"""Qwen3-MoE: Qwen3 with a softmax-routed top-k mixture of SwiGLU experts (no shared expert) in its MLPs."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specdeploy.engine.models.config import config_value
from specdeploy.engine.models.moe import Experts
from specdeploy.engine.models.qwen3 import Qwen3ForCausalLM


def expert_count(config: dict[str, Any]) -> int:
    # Qwen's checkpoints say num_experts; transformers 5 saves the same number as num_local_experts.
    return config["num_experts"] if "num_experts" in config else config["num_local_experts"]


class Qwen3MoeSparseBlock(nn.Module):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        hidden, num_experts = config["hidden_size"], expert_count(config)
        self.top_k = config["num_experts_per_tok"]
        self.norm_topk_prob = config_value(config, "norm_topk_prob", False)
        self.gate = nn.Linear(hidden, num_experts, bias=False)
        self.experts = Experts(num_experts, hidden, config["moe_intermediate_size"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        logits = self.gate(flat)
        weights, indices = torch.topk(F.softmax(logits, dim=-1, dtype=torch.float32), self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return self.experts(flat, weights.to(logits.dtype), indices).view_as(x)


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    def build_mlp(self, config: dict[str, Any], layer: int) -> nn.Module:
        sparse = (
            layer not in config_value(config, "mlp_only_layers", [])
            and expert_count(config) > 0
            and (layer + 1) % config_value(config, "decoder_sparse_step", 1) == 0
        )
        return Qwen3MoeSparseBlock(config) if sparse else super().build_mlp(config, layer)
