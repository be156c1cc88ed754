"""What every target model of the reference engine provides, whatever its family."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from specdeploy.engine.cache import KVCache
from specdeploy.errors import SpecdeployError

if TYPE_CHECKING:
    from specdeploy.engine.models.layers import RotaryEmbedding


@dataclass
class TargetConfig:
    """What the engine reads about a target; `raw` is the config dict the model was built from.

    For a multimodal wrapper (Kimi K2.5/K2.6) `architecture` is the wrapper's and `raw` its text model's.
    """

    architecture: str
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    max_position_embeddings: int
    eos_token_ids: list[int]
    tie_word_embeddings: bool
    raw: dict[str, Any] = field(repr=False)


@dataclass
class ModelOutput:
    logits: torch.Tensor  # [batch, new_tokens, vocab], float32
    hidden: torch.Tensor | None  # [batch, new_tokens, len(hidden_layer_ids) * hidden_size] or None


def causal_mask(new_tokens: int, cached: int, device: torch.device) -> torch.Tensor:
    """Plain causal visibility of `new_tokens` queries over [cached prefix + new tokens]: [1, T, S] bool."""
    query = cached + torch.arange(new_tokens, device=device)[:, None]
    key = torch.arange(cached + new_tokens, device=device)[None, :]
    return (key <= query)[None]


class TargetModel(nn.Module):
    """A decoder-only target: embed, pre-norm decoder layers, final norm, LM head.

    Families build `embed_tokens`, `layers`, `norm`, `lm_head` and `rotary` with checkpoint names (minus the
    leading `model.`); the forward pass below is shared. Every layer reads and appends its own cache entry,
    so a layer kind with recurrent state can keep it there too.
    """

    config: TargetConfig
    embed_tokens: nn.Embedding  # borrowed by the drafter
    layers: nn.ModuleList
    norm: nn.Module
    lm_head: nn.Linear  # borrowed by the drafter; the embedding itself when tie_word_embeddings
    rotary: RotaryEmbedding
    keep_fp32: tuple[str, ...] = ()  # parameter-name suffixes kept in float32 whatever the model dtype

    def new_cache(self) -> KVCache:
        return KVCache(len(self.layers))

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
        hidden_layer_ids: Sequence[int] = (),
    ) -> ModelOutput:
        """Run `input_ids` [B, T] at `position_ids` [B|1, T], appending them to `cache` when given.

        attention_mask [B|1, T, cache.length + T] (True = may attend) defaults to causal; it may be any
        visibility pattern, such as a draft tree's ancestor mask. `hidden` concatenates, in the order given,
        the outputs of the decoder layers `hidden_layer_ids`, i.e. transformers' hidden_states[id + 1]
        (which for the last layer is after the final norm).
        """
        batch, new = input_ids.shape
        cached = cache.length if cache is not None else 0
        if position_ids.dim() != 2 or position_ids.shape[1] != new or position_ids.shape[0] not in (1, batch):
            raise SpecdeployError(
                f"position_ids must be [{batch} or 1, {new}] like input_ids, got {list(position_ids.shape)}"
            )
        visible = self._visibility(attention_mask, batch, new, cached, input_ids.device)
        last = len(self.layers) - 1
        wrong = [i for i in hidden_layer_ids if not 0 <= i <= last]
        if wrong:
            raise SpecdeployError(f"hidden_layer_ids {wrong} out of range: this model has layers 0..{last}")

        x = self.embed_tokens(input_ids)
        rope = self.rotary(position_ids, x.dtype)
        captured: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            x = layer(x, rope, visible, cache)
            if i in hidden_layer_ids:
                captured[i] = x
        x = self.norm(x)
        if last in captured:
            captured[last] = x  # transformers reports the last layer's output after the final norm
        hidden = torch.cat([captured[i] for i in hidden_layer_ids], dim=-1) if hidden_layer_ids else None
        return ModelOutput(logits=self.lm_head(x).float(), hidden=hidden)

    @staticmethod
    def _visibility(
        mask: torch.Tensor | None, batch: int, new: int, cached: int, device: torch.device
    ) -> torch.Tensor:
        if mask is None:
            return causal_mask(new, cached, device)
        if (
            mask.dtype != torch.bool
            or mask.dim() != 3
            or mask.shape[0] not in (1, batch)
            or tuple(mask.shape[1:]) != (new, cached + new)
        ):
            raise SpecdeployError(
                f"attention_mask must be a bool tensor [{batch}|1, {new}, {cached + new}] "
                f"(new tokens x cached + new, True = may attend), got {mask.dtype} {list(mask.shape)}"
            )
        return mask
