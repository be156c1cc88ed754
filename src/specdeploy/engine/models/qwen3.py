"""Qwen3 (dense): GQA attention with per-head RMSNorm on queries and keys, SwiGLU MLP."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from specdeploy.engine.cache import KVCache
from specdeploy.engine.models.base import TargetConfig, TargetModel
from specdeploy.engine.models.layers import (
    DecoderLayer,
    RMSNorm,
    Rope,
    RotaryEmbedding,
    SwiGLU,
    apply_rope,
    attend,
    config_value,
    require_silu,
    rope_parameters,
)
from specdeploy.errors import SpecdeployError


def head_dim(config: dict[str, Any]) -> int:
    return config_value(config, "head_dim", config["hidden_size"] // config["num_attention_heads"])


def reject_sliding_window(config: dict[str, Any]) -> None:
    sliding = config_value(config, "use_sliding_window", False) or "sliding_attention" in (
        config_value(config, "layer_types", [])
    )
    if sliding:
        raise SpecdeployError(
            "sliding-window attention layers are not supported by the reference engine: "
            "use a checkpoint with use_sliding_window false"
        )


class Qwen3Attention(nn.Module):
    """Caches post-norm, post-RoPE keys and values as [batch, seq, kv_heads, head_dim]."""

    def __init__(self, config: dict[str, Any], layer_idx: int) -> None:
        super().__init__()
        hidden, heads = config["hidden_size"], config["num_attention_heads"]
        kv_heads = config_value(config, "num_key_value_heads", heads)
        bias = config_value(config, "attention_bias", False)
        eps = config_value(config, "rms_norm_eps", 1e-6)
        self.layer_idx = layer_idx
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim(config)
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, eps)
        self.k_norm = RMSNorm(self.head_dim, eps)

    def forward(
        self, x: torch.Tensor, rope: Rope, visible: torch.Tensor, cache: KVCache | None
    ) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(batch, tokens, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(batch, tokens, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(batch, tokens, self.kv_heads, self.head_dim)
        q, k = apply_rope(q, rope), apply_rope(k, rope).transpose(1, 2)
        if cache is not None:
            k, v = cache.append(self.layer_idx, k, v)
        out = attend(q, k.transpose(1, 2), v.transpose(1, 2), visible, self.head_dim**-0.5)
        return self.o_proj(out.transpose(1, 2).reshape(batch, tokens, -1))


class Qwen3ForCausalLM(TargetModel):
    def __init__(self, config: TargetConfig) -> None:
        super().__init__()
        raw = config.raw
        require_silu(raw)
        reject_sliding_window(raw)
        eps = config_value(raw, "rms_norm_eps", 1e-6)
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(Qwen3Attention(raw, i), self.build_mlp(raw, i), config.hidden_size, eps)
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(rope_parameters(raw), head_dim(raw), config.max_position_embeddings)

    def build_mlp(self, config: dict[str, Any], layer: int) -> nn.Module:
        return SwiGLU(config["hidden_size"], config["intermediate_size"])
