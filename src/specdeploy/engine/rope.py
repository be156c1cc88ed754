"""Rotary position embeddings (default and YaRN), with inverse frequencies computed as transformers does.

A checkpoint's config.json may carry RoPE settings in the transformers 4 layout (`rope_theta` plus
`rope_scaling`) or the transformers 5 layout (`rope_parameters`); `read_rope_parameters` accepts both.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from specdeploy.errors import SpecdeployError

SUPPORTED_ROPE_TYPES = ("default", "yarn")


def read_rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """One flat dict with `rope_type`, `rope_theta` and the scaling keys, from either config layout."""
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    if any(isinstance(value, dict) for value in params.values()):
        raise SpecdeployError(
            "per-layer-type RoPE parameters are not supported: give one rope_parameters dict for all layers"
        )
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    if params["rope_type"] not in SUPPORTED_ROPE_TYPES:
        raise SpecdeployError(
            f"unsupported RoPE type {params['rope_type']!r}: supported are {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    factor = config.get("partial_rotary_factor", params.get("partial_rotary_factor", 1.0))
    if factor != 1.0:
        raise SpecdeployError(f"partial_rotary_factor {factor} is not supported: only full-head RoPE")
    if params["rope_type"] == "yarn":
        # transformers gives a top-level original_max_position_embeddings priority over the rope dict's.
        if "original_max_position_embeddings" in config:
            params["original_max_position_embeddings"] = config["original_max_position_embeddings"]
        params.setdefault("original_max_position_embeddings", config.get("max_position_embeddings"))
        if params["original_max_position_embeddings"] is None:
            raise SpecdeployError(
                "YaRN RoPE needs original_max_position_embeddings (or max_position_embeddings)"
            )
    return params


def legacy_yarn_attention_factor(factor: float) -> float:
    """YaRN's original attention (mscale) factor, 0.1 * ln(factor) + 1, or 1 when not extrapolating."""
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def yarn_attention_factor(params: dict[str, Any], factor: float, legacy: bool) -> float:
    """The cos/sin scale of YaRN. `legacy` ignores mscale/mscale_all_dim, as YaRN's first implementations did."""
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if not legacy and mscale and mscale_all_dim:
        return (0.1 * mscale * math.log(factor) + 1.0) / (0.1 * mscale_all_dim * math.log(factor) + 1.0)
    return legacy_yarn_attention_factor(factor)


def yarn_inverse_frequencies(params: dict[str, Any], head_dim: int, factor: float) -> torch.Tensor:
    """Per-dimension blend of interpolated and extrapolated frequencies (YaRN's ramp), in float32."""
    base = float(params["rope_theta"])
    original = params["original_max_position_embeddings"]
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:
        return (head_dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim)
    extrapolation_weight = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * ramp + (1.0 / pos_freqs) * extrapolation_weight


def inverse_frequencies(
    params: dict[str, Any], head_dim: int, max_position_embeddings: int, legacy_yarn: bool
) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim/2] float32 on CPU, cos/sin scale) for `read_rope_parameters` output."""
    base = float(params["rope_theta"])
    if params["rope_type"] == "default":
        dims = torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim
        return 1.0 / (base**dims), 1.0
    factor = params.get("factor")
    if factor is None:
        # DeepSeek-style configs leave factor out and mean the context extension ratio.
        factor = max_position_embeddings / params["original_max_position_embeddings"]
    factor = float(factor)
    return yarn_inverse_frequencies(params, head_dim, factor), yarn_attention_factor(
        params, factor, legacy_yarn
    )


class RotaryEmbedding(nn.Module):
    """cos/sin tables for arbitrary position ids; the frequencies stay float32 whatever the model dtype."""

    def __init__(self, inv_freq: torch.Tensor, attention_factor: float) -> None:
        super().__init__()
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_factor = attention_factor

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids [B, S] -> cos, sin [B, S, head_dim] in `dtype`."""
        freqs = position_ids[..., None].float() * self.inv_freq.float()
        angles = torch.cat([freqs, freqs], dim=-1)
        return (angles.cos() * self.attention_factor).to(dtype), (angles.sin() * self.attention_factor).to(
            dtype
        )


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, S, heads, head_dim], cos/sin [B, S, head_dim] -> x rotated by its positions' angles."""
    cos, sin = cos[:, :, None], sin[:, :, None]
    return x * cos + rotate_half(x) * sin
