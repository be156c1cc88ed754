"""Pieces shared by the target model families: norms, rotary embeddings, SwiGLU, masked attention, MoE.

Numerics follow transformers where it matters for bit-level agreement: RMSNorm and RoPE tables are
computed in float32 and cast back, and inverse frequencies are computed on the CPU exactly as
`transformers.modeling_rope_utils` does.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specdeploy.engine.cache import KVCache
from specdeploy.errors import SpecdeployError

Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin: [batch, new_tokens, rotary_dim] in the model dtype


def config_value(config: dict[str, Any], key: str, default: Any = None) -> Any:
    """`config[key]`, or `default` where the key is absent or null (how transformers fills its defaults)."""
    value = config.get(key)
    return default if value is None else value


def require_silu(config: dict[str, Any]) -> None:
    activation = config_value(config, "hidden_act", "silu")
    if activation != "silu":
        raise SpecdeployError(f"hidden_act {activation!r} is not supported: these models use silu (SwiGLU)")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


# ---------------------------------------------------------------------------------------------- RoPE

SUPPORTED_ROPE_TYPES = ("default", "yarn", "llama3")


def rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """One flat RoPE dict (`rope_type`, `rope_theta`, scaling keys) from either config.json layout.

    transformers 4 wrote `rope_theta` plus `rope_scaling` (with `type` or `rope_type`); transformers 5 writes
    `rope_parameters`. Like transformers, `rope_scaling` wins when both are present.
    """
    params = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
    if any(isinstance(value, dict) for value in params.values()):
        raise SpecdeployError("per-layer-type RoPE parameters are not supported by these model families")
    params.setdefault("rope_type", params.get("type", "default"))
    params.setdefault("rope_theta", config_value(config, "rope_theta", 10000.0))
    if params["rope_type"] not in SUPPORTED_ROPE_TYPES:
        raise SpecdeployError(
            f"RoPE type {params['rope_type']!r} is not supported: use one of {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise SpecdeployError(
            "partial_rotary_factor is not supported: these families rotate the whole rope dim"
        )
    if params["rope_type"] != "default":
        # transformers lets a top-level original_max_position_embeddings override the rope dict's (Phi-3 style).
        if "original_max_position_embeddings" in config:
            params["original_max_position_embeddings"] = config["original_max_position_embeddings"]
        params.setdefault("original_max_position_embeddings", config["max_position_embeddings"])
    return params


def _default_inv_freq(base: float, dim: int) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction 0.1 * mscale * ln(factor) + 1 (1 when not extending the context)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(
    params: dict[str, Any], dim: int, max_position_embeddings: int, legacy: bool
) -> tuple[torch.Tensor, float]:
    base = float(params["rope_theta"])
    original = params["original_max_position_embeddings"]
    # DeepSeek-style configs may omit the factor and mean the context extension ratio.
    factor = float(params.get("factor") or max_position_embeddings / original)
    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all_dim and not legacy:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolate = 1 - ramp  # high-frequency dims keep their original frequency
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate
    return inv_freq, float(attention_factor)


def _llama3(params: dict[str, Any], dim: int) -> torch.Tensor:
    inv_freq = _default_inv_freq(float(params["rope_theta"]), dim)
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    original = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < original / high) * ~(wavelen > original / low)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """cos/sin for arbitrary position ids (tree nodes use prefix + depth), never for the cache length.

    `legacy_yarn` ignores mscale/mscale_all_dim and scales by YaRN's original 0.1 * ln(factor) + 1 (an
    explicit attention_factor still wins): what z-lab's DFlash drafters were trained with.
    """

    def __init__(
        self, params: dict[str, Any], dim: int, max_position_embeddings: int, legacy_yarn: bool = False
    ) -> None:
        super().__init__()
        # Explicitly on the CPU: models are built on the meta device and this buffer is not in checkpoints.
        with torch.device("cpu"):
            if params["rope_type"] == "yarn":
                inv_freq, self.attention_scaling = _yarn(params, dim, max_position_embeddings, legacy_yarn)
            elif params["rope_type"] == "llama3":
                inv_freq, self.attention_scaling = _llama3(params, dim), 1.0
            else:
                inv_freq, self.attention_scaling = _default_inv_freq(float(params["rope_theta"]), dim), 1.0
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> Rope:
        freqs = position_ids[..., None].float() * self.inv_freq
        angles = torch.cat([freqs, freqs], dim=-1)
        cos, sin = angles.cos() * self.attention_scaling, angles.sin() * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, rope: Rope, interleaved: bool = False) -> torch.Tensor:
    """Rotate x [batch, heads, tokens, dim] by its positions' angles.

    `interleaved` checkpoints (DeepSeek) store rotary pairs as (x0, x1), (x2, x3), ...; they are regrouped
    into halves first, as transformers does, so queries and cached keys share one layout.
    """
    if interleaved:
        x = x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)
    cos, sin = rope[0][:, None], rope[1][:, None]
    return x * cos + rotate_half(x) * sin


# ------------------------------------------------------------------------------------------ attention


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention of q [B, H, T, D] over k [B, Hkv, S, D], v [B, Hkv, S, Dv] where `visible` [B|1, T, S] allows.

    Grouped heads are folded into the query axis ([B, Hkv, G*T, D]) instead of repeating keys and values,
    so one call serves MHA, GQA and MLA's single latent head on every SDPA backend.
    """
    batch, heads, tokens, _ = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    q = q.reshape(batch, kv_heads, group * tokens, q.shape[-1])
    mask = (
        visible[:, None, None].expand(-1, 1, group, -1, -1).reshape(visible.shape[0], 1, group * tokens, -1)
    )
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.reshape(batch, heads, tokens, v.shape[-1])


# ------------------------------------------------------------------------------------------------ MLP


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def mix_experts(
    x: torch.Tensor, experts: nn.ModuleList, weights: torch.Tensor, indices: torch.Tensor
) -> torch.Tensor:
    """Sum over each token's chosen experts of weight * expert(token): x [N, H], weights/indices [N, k]."""
    out = torch.zeros_like(x)
    chosen = indices.flatten()
    token = torch.arange(x.shape[0], device=x.device).repeat_interleave(indices.shape[1])
    weight = weights.flatten()
    # Only the experts some token picked run; each sees just its own tokens.
    for expert in chosen.unique().tolist():
        picked = chosen == expert
        rows = token[picked]
        out.index_add_(0, rows, (experts[expert](x[rows]) * weight[picked, None]).to(out.dtype))
    return out


# -------------------------------------------------------------------------------------- decoder layer


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then + mlp(norm(x)). Names follow the HF checkpoints."""

    def __init__(self, self_attn: nn.Module, mlp: nn.Module, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.mlp = mlp
        self.input_layernorm = RMSNorm(hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(hidden_size, eps)

    def forward(
        self, x: torch.Tensor, rope: Rope, visible: torch.Tensor, cache: KVCache | None
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, visible, cache)
        return x + self.mlp(self.post_attention_layernorm(x))
