"""What every target model of the reference engine provides, whatever its family."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [batch, new_tokens, vocab], float32
    hidden: torch.Tensor | None  # [batch, new_tokens, len(hidden_layer_ids) * hidden_size] or None


def causal_mask(new_tokens: int, cached: int, device: torch.device) -> torch.Tensor:
    """Plain causal visibility of `new_tokens` queries over [cached prefix + new tokens]: [1, T, S] bool."""
    query = cached + torch.arange(new_tokens, device=device)[:, None]
    key = torch.arange(cached + new_tokens, device=device)[None, :]
    return (key <= query)[None]
