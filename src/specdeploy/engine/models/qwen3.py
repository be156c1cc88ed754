"""Qwen3 (dense): GQA attention with per-head RMSNorm on queries and keys, SwiGLU MLP."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from specdeploy.engine import ops
from specdeploy.engine.cache import EntryShape, StaticCache
from specdeploy.engine.forward_batch import ForwardBatch
from specdeploy.engine.models.base import TargetConfig, TargetModel
from specdeploy.engine.models.config import config_value, require_silu
from specdeploy.engine.models.layers import DecoderLayer, MergedLinear, RMSNorm, SwiGLU, attend_folded
from specdeploy.engine.models.rope import RotaryEmbedding, rope_parameters
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


def qk_norm_attention(
    module: nn.Module,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    batch: ForwardBatch,
    cache: StaticCache,
) -> torch.Tensor:
    """Attention with per-head q/k RMSNorm and RoPE (Qwen3 and its relatives): `module` has q_norm, k_norm,
    layer_idx and head_dim; q [B, T, H, D], k and v [B, T, Hkv, D] -> [B, T, H * D]."""
    k_cache, v_cache = cache.flat_entry(module.layer_idx)
    folded = ops.qk_norm_rope_store(
        q,
        k,
        v,
        module.q_norm.weight,
        module.k_norm.weight,
        module.k_norm.eps,
        module.k_norm.zero_centered,
        batch.rope,
        batch.flat_slots,
        k_cache,
        v_cache,
    )
    keys, values = (batch.view(t) for t in cache.entry(module.layer_idx))
    return attend_folded(folded, keys, values, batch, module.head_dim**-0.5)


class Qwen3Attention(nn.Module):
    """Caches post-norm, post-RoPE keys and values, [kv_heads, head_dim] each per slot."""

    query_width = 1  # q_proj rows per head, in head_dims (the gated variant adds an output gate)
    norm: type[nn.Module] = RMSNorm

    def __init__(self, config: dict[str, Any], layer_idx: int) -> None:
        super().__init__()
        hidden, heads = config["hidden_size"], config["num_attention_heads"]
        kv_heads = config_value(config, "num_key_value_heads", heads)
        bias = config_value(config, "attention_bias", False)
        eps = config_value(config, "rms_norm_eps", 1e-6)
        self.layer_idx = layer_idx
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim(config)
        dim = self.head_dim
        self.qkv_proj = MergedLinear(
            hidden,
            {"q_proj": self.query_width * heads * dim, "k_proj": kv_heads * dim, "v_proj": kv_heads * dim},
            bias,
        )
        self.o_proj = nn.Linear(heads * dim, hidden, bias=bias)
        self.q_norm = self.norm(dim, eps)
        self.k_norm = self.norm(dim, eps)

    def cache_entry(self) -> EntryShape:
        return ((self.kv_heads, self.head_dim), (self.kv_heads, self.head_dim))

    @property
    def first_projection(self) -> nn.Linear:
        return self.qkv_proj

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: StaticCache) -> torch.Tensor:
        return self.after_first_projection(ops.linear(x, self.qkv_proj), batch, cache)

    def after_first_projection(
        self, qkv: torch.Tensor, batch: ForwardBatch, cache: StaticCache
    ) -> torch.Tensor:
        b, tokens, _ = qkv.shape
        qkv = qkv.view(b, tokens, self.heads + 2 * self.kv_heads, self.head_dim)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=2)
        return ops.linear(qk_norm_attention(self, q, k, v, batch, cache), self.o_proj)


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
