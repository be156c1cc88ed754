"""Rotary position embeddings: the RoPE variants of the supported checkpoints, and applying them.

Numerics follow transformers where it matters for bit-level agreement: tables are computed in float32 and
cast back, and inverse frequencies are computed on the CPU exactly as `transformers.modeling_rope_utils` does.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from specdeploy.engine.models.config import config_value
from specdeploy.errors import SpecdeployError

Rope = tuple[torch.Tensor, torch.Tensor]  # cos, sin: [batch, new_tokens, rotary_dim] in the model dtype

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
    explicit attention_factor still wins): what z-lab's DFlash drafters were trained with. Once `prepare`d for a
    dtype (models do when they make a cache), cos/sin are looked up in tables, as SGLang's cos_sin_cache: three
    launches per forward instead of nine, the same values.
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
        self.max_positions = max_position_embeddings
        self._tables: dict[tuple[torch.device, torch.dtype], Rope] = {}

    def prepare(self, positions: int, dtype: torch.dtype) -> None:
        """Tables of cos/sin in `dtype` for positions 0..max(positions, max_position_embeddings)-1, on the
        device of `inv_freq`. Call it outside CUDA graph captures (a cache's size is known before them)."""
        size = max(positions, self.max_positions)
        key = (self.inv_freq.device, dtype)
        table = self._tables.get(key)
        if table is None or table[0].shape[0] < size:
            self._tables[key] = self._compute(torch.arange(size, device=self.inv_freq.device), dtype)

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> Rope:
        table = self._tables.get((position_ids.device, dtype))
        if table is None:
            return self._compute(position_ids, dtype)
        # a padded (dead) row's stale position must not index past the table; real ones never reach it
        index = position_ids.clamp(max=table[0].shape[0] - 1)
        return table[0][index], table[1][index]

    def _compute(self, position_ids: torch.Tensor, dtype: torch.dtype) -> Rope:
        freqs = position_ids[..., None].float() * self.inv_freq
        angles = torch.cat([freqs, freqs], dim=-1)
        cos, sin = angles.cos() * self.attention_scaling, angles.sin() * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, rope: Rope, interleaved: bool = False) -> torch.Tensor:
    """Rotate x [batch, tokens, heads, dim] by its tokens' angles (cos/sin [batch|1, tokens, dim]).

    `interleaved` checkpoints (DeepSeek) store rotary pairs as (x0, x1), (x2, x3), ...; they are regrouped
    into halves first, as transformers does, so queries and cached keys share one layout.
    """
    if interleaved:
        x = x.unflatten(-1, (-1, 2)).transpose(-1, -2).flatten(-2)
    cos, sin = rope[0][:, :, None], rope[1][:, :, None]
    return x * cos + rotate_half(x) * sin
