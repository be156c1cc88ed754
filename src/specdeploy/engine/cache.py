"""Static caches: preallocated per-slot buffers (keys/values, or MLA latents) written in place.

Layers whose entries have the same shape share one tensor [layers, batch, capacity, *entry], so moving the
accepted path of a verified tree into place is one gather and one scatter over all layers together. Slot s
of a row holds position s once committed: a verify step writes its tree tokens at slots prefix..prefix+T-1
and `keep_path` brings the accepted path's entries down to prefix, prefix+1, ... The last slot is scratch, where
padding entries land. Recurrent layers keep their per-row state in `recurrent` (a `RecurrentCache`).

The cache knows nothing of how many slots a row has committed: its callers (the decoding step, or
`single_pass`) say which slots each pass writes and sees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specdeploy.engine import ops
from specdeploy.errors import SpecdeployError

if TYPE_CHECKING:
    from specdeploy.engine.recurrent_state import RecurrentCache

EntryShape = tuple[
    tuple[int, ...], ...
]  # per-slot shapes of one layer's cached tensors, e.g. ((8, 128), (8, 128))


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class StaticCache:
    def __init__(
        self,
        entry_shapes: list[EntryShape | None],
        batch: int,
        capacity: int,
        device: torch.device | str,
        dtype: torch.dtype,
        with_positions: bool = False,
    ) -> None:
        """`entry_shapes[i]` is layer i's per-slot tensors, or None for a layer that caches no slots."""
        if capacity < 2:
            raise SpecdeployError(f"a cache needs at least 2 slots (one is scratch), got {capacity}")
        self.batch, self.capacity = batch, capacity
        self.device, self.dtype = torch.device(device), dtype
        self.entry_shapes = entry_shapes
        self.recurrent: RecurrentCache | None = None
        groups: dict[EntryShape, list[int]] = {}
        for layer, shapes in enumerate(entry_shapes):
            if shapes is not None:
                groups.setdefault(shapes, []).append(layer)
        # layer -> (group tensors, index of the layer inside them)
        self._where: dict[int, tuple[list[torch.Tensor], int]] = {}
        self._entries: dict[int, tuple[torch.Tensor, ...]] = {}
        self._flat_entries: dict[int, tuple[torch.Tensor, ...]] = {}
        self.groups: list[list[torch.Tensor]] = []
        for shapes, layers in groups.items():
            tensors = [
                torch.zeros(len(layers), batch, capacity, *shape, device=self.device, dtype=dtype)
                for shape in shapes
            ]
            self.groups.append(tensors)
            for index, layer in enumerate(layers):
                self._where[layer] = (tensors, index)
        # Position held by each slot, for rules that compare query and key positions (sliding windows).
        self.positions = (
            torch.zeros(batch, capacity, dtype=torch.long, device=self.device) if with_positions else None
        )

    @property
    def scratch_slot(self) -> int:
        return self.capacity - 1

    @property
    def usable(self) -> int:
        """Slots a sequence may fill: all but the scratch slot."""
        return self.capacity - 1

    def entry(self, layer: int) -> tuple[torch.Tensor, ...]:
        """Layer `layer`'s tensors, each [batch, capacity, *entry]."""
        views = self._entries.get(layer)
        if views is None:  # made once per layer: every forward of every layer asks
            tensors, index = self._where[layer]
            views = self._entries[layer] = tuple(t[index] for t in tensors)
        return views

    def flat_entry(self, layer: int) -> tuple[torch.Tensor, ...]:
        """Layer `layer`'s tensors viewed as [batch * capacity, *entry]: what flat slots index."""
        views = self._flat_entries.get(layer)
        if views is None:
            views = self._flat_entries[layer] = tuple(t.view(-1, *t.shape[2:]) for t in self.entry(layer))
        return views

    def store(self, layer: int, flat_slots: torch.Tensor, *values: torch.Tensor) -> None:
        """Store `values` [B, T, *entry] at `flat_slots` (cache row * capacity + slot, [B * T])."""
        for buffer, value in zip(self.flat_entry(layer), values, strict=True):
            buffer.index_copy_(0, flat_slots, value.reshape(-1, *value.shape[2:]).to(buffer.dtype))

    def copy_row(self, source: torch.Tensor, dest: torch.Tensor, length: int) -> None:
        """Copy row `source`'s first `length` slots to row `dest` (a sequence moving rows). The rows are
        one-element tensors on the cache's device, so that a CUDA graph replays the copy for any pair."""
        for tensors in self.groups:
            for tensor in tensors:
                window = tensor[:, :, :length]
                window.index_copy_(1, dest, window.index_select(1, source))
        if self.positions is not None:
            window = self.positions[:, :length]
            window.index_copy_(0, dest, window.index_select(0, source))
        if self.recurrent is not None:
            self.recurrent.copy_row(source, dest)

    def keep_path(self, path: torch.Tensor, length: torch.Tensor, prefix: torch.Tensor) -> None:
        """After a tree verification written at slots prefix[b].., rows 0..B-1 keep their first length[b] path
        entries ([B, P] tree indices, root first) at slots prefix[b], prefix[b] + 1, ..., in every layer. A
        length of 0 moves nothing. On CUDA one Triton launch per cache tensor (`triton_step`)."""
        kernels = ops.step_kernels_for(path)
        tensors = [t for group in self.groups for t in group]
        if self.positions is not None:
            tensors.append(self.positions[None, :, :, None])
        if kernels is not None:
            kernels.move_accepted(tensors, path, length, prefix)
            return
        index = torch.arange(path.shape[1], device=path.device)
        kept = index < length[:, None]
        rows = torch.arange(path.shape[0], device=path.device)[:, None] * self.capacity
        scratch = self.scratch_slot
        source = (torch.where(kept, prefix[:, None] + path, scratch) + rows).flatten()
        dest = (torch.where(kept, prefix[:, None] + index, scratch) + rows).flatten()
        for tensor in tensors:  # all reads first: a kept entry may sit where another one lands
            flat = tensor.view(tensor.shape[0], -1, *tensor.shape[3:])
            flat.index_copy_(1, dest, flat.index_select(1, source))
