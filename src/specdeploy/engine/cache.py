"""Per-layer caches for one batch of sequences: grown by append, cut back or compacted after verification.

Every tensor is laid out [batch, seq, ...]; attention layers keep (key, value) or any other per-position
tensors they need (MLA keeps its compressed latent). `keep` gathers along the sequence axis, which is how
a verified tree is compacted to its accepted path. A layer whose state is not per-position (a recurrent
layer) stores a `CacheEntry` instead, which keeps and crops itself.
"""

from __future__ import annotations

from typing import Protocol

import torch


class CacheEntry(Protocol):
    """A layer's cache entry that is not a tuple of per-position tensors, such as a recurrent state."""

    @property
    def length(self) -> int: ...

    def keep(self, positions: torch.Tensor) -> None: ...

    def crop(self, length: int) -> None: ...


class KVCache:
    def __init__(self, num_layers: int) -> None:
        self.layers: list[tuple[torch.Tensor, ...] | CacheEntry | None] = [None] * num_layers

    @property
    def length(self) -> int:
        """Cached positions (equal for every filled layer)."""
        for entry in self.layers:
            if isinstance(entry, tuple):
                return entry[0].shape[1]
            if entry is not None:
                return entry.length
        return 0

    def append(self, layer: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Append new positions to `layer` and return everything cached there, old and new."""
        old = self.layers[layer]
        if old is not None:
            tensors = tuple(torch.cat([o, t], dim=1) for o, t in zip(old, tensors, strict=True))
        self.layers[layer] = tensors
        return tensors

    def keep(self, positions: torch.Tensor) -> None:
        """Keep only `positions` (a 1-D index over the cached sequence, in the new order) in every layer."""
        positions = positions.to(torch.long)
        for i, entry in enumerate(self.layers):
            if isinstance(entry, tuple):
                index = positions.to(entry[0].device)
                self.layers[i] = tuple(t.index_select(1, index) for t in entry)
            elif entry is not None:
                entry.keep(positions)

    def crop(self, length: int) -> None:
        """Drop every position at or after `length`."""
        for i, entry in enumerate(self.layers):
            if isinstance(entry, tuple):
                self.layers[i] = tuple(t[:, :length] for t in entry)
            elif entry is not None:
                entry.crop(length)
