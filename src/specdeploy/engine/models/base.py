"""What every target model of the reference engine provides, whatever its family."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from specdeploy.engine.cache import EntryShape, StaticCache
from specdeploy.engine.forward_batch import ForwardBatch

if TYPE_CHECKING:
    from specdeploy.engine.models.rope import RotaryEmbedding


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


class TargetModel(nn.Module):
    """A decoder-only target: embed, pre-norm decoder layers, final norm, LM head.

    Families build `embed_tokens`, `layers`, `norm`, `lm_head` and `rotary` with checkpoint names (minus the
    leading `model.`); `run` below is shared. Each layer's mixer declares what it caches per slot
    (`cache_entry`, or None for a recurrent layer, which keeps its state in the cache's `recurrent`).
    """

    config: TargetConfig
    embed_tokens: nn.Embedding  # borrowed by the drafter
    layers: nn.ModuleList
    norm: nn.Module
    lm_head: nn.Linear  # borrowed by the drafter; the embedding itself when tie_word_embeddings
    rotary: RotaryEmbedding
    keep_fp32: tuple[str, ...] = ()  # parameter-name suffixes kept in float32 whatever the model dtype
    has_recurrent_layers = (
        False  # their state follows a verified tree: it needs `tree_paths` and `commit_tree`
    )

    def cache_entries(self) -> list[EntryShape | None]:
        return [layer.mixer.cache_entry() for layer in self.layers]

    def new_cache(self, batch: int = 1, capacity: int = 256, tree_tokens: int = 1) -> StaticCache:
        """Caches for `batch` rows of `capacity` slots; `tree_tokens`: the most tokens one tree verification
        may hold (what recurrent layers record until `commit_tree`)."""
        weight = self.embed_tokens.weight
        entries = self.cache_entries()
        cache = StaticCache(entries, batch, capacity, weight.device, weight.dtype)
        self.rotary.prepare(capacity, weight.dtype)  # a cache's positions are below its capacity
        recurrent = [i for i, entry in enumerate(entries) if entry is None]
        if recurrent:  # every recurrent layer of a model has one shape
            mixer = self.layers[recurrent[0]].mixer
            cache.recurrent = mixer.new_recurrent_cache(
                recurrent, batch, tree_tokens, weight.dtype, weight.device
            )
        return cache

    def commit_tree(self, cache: StaticCache, path: torch.Tensor, count: torch.Tensor) -> None:
        """After a tree verification of rows 0..B-1: row b keeps the first count[b] tokens of path[b] ([B, P]
        indices of the verified tokens, root first) in its recurrent layers; attention layers need nothing."""
        if cache.recurrent is not None:
            cache.recurrent.commit(path, count)

    def run(
        self,
        input_ids: torch.Tensor,
        batch: ForwardBatch,
        cache: StaticCache,
        hidden_layer_ids: Sequence[int] = (),
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run `input_ids` [B, T] as `batch` says, writing their cache entries.

        Returns the final-norm hidden states [B, T, H] (the LM head's input) and the concatenated outputs of
        layers `hidden_layer_ids` [B, T, K*H] (transformers' hidden_states[id + 1]; for the last layer that
        is after the final norm), or None.
        """
        x = self.embed_tokens(input_ids)
        batch.rope = self.rotary(batch.positions, x.dtype)
        last = len(self.layers) - 1
        captured: dict[int, torch.Tensor] = {}
        residual = None
        for i, layer in enumerate(self.layers):
            x, residual = layer(x, residual, batch, cache)
            if i in hidden_layer_ids and i != last:
                captured[i] = residual + x
        x, _ = self.norm(x, residual)
        if last in hidden_layer_ids:
            captured[last] = x
        hidden = torch.cat([captured[i] for i in hidden_layer_ids], dim=-1) if hidden_layer_ids else None
        return x, hidden

    def check_visibility(self, mask: torch.Tensor | None, cached: int) -> None:
        """Refuse masks the layers cannot follow (attention layers follow any); `single_pass` asks."""
