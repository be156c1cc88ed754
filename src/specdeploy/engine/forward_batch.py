"""What one forward pass needs to know beyond its tokens: positions, cache slots and who may attend to whom.

Attention runs over a window of the first S cache slots (the new tokens are written there first), with a
visibility mask over those slots: a causal prefill, one AR token, or a draft tree whose nodes each see the
committed prefix and their own ancestors. Every layer shares the mask, converted once per forward to the
additive form attention kernels take.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdeploy.engine.models.rope import Rope
from specdeploy.engine.tree import root_paths


@dataclass
class ForwardBatch:
    positions: torch.Tensor  # [B|1, T] RoPE positions of the new tokens
    slots: torch.Tensor  # [B, T] cache slots the new tokens are written to
    visible: torch.Tensor  # [B|1, T, S] bool over cache slots 0..S-1 (True = may attend)
    capacity: int  # slots per row of the cache the slots index
    row_start: int = 0  # batch row b is cache row row_start + b
    # For recurrent layers, a tree: each new token's path from the first new token (its root), -1 padded,
    # [B, T, D]; its state is committed later (`TargetModel.commit_tree`). None: a chain, committed at once.
    tree_paths: torch.Tensor | None = None
    # [B, T] bool, False for padding after a chain's real tokens (a prefill chunk run at a fixed size): padding
    # writes only the scratch slot, and recurrent layers keep the state the real tokens left. None: all real.
    valid: torch.Tensor | None = None
    rope: Rope | None = None  # set by the model once per forward
    shared: dict = field(default_factory=dict, repr=False)  # made by one layer, reused by the others
    _bias: dict = field(default_factory=dict, repr=False)
    _flat_slots: torch.Tensor | None = field(default=None, repr=False)

    @property
    def window(self) -> int:
        return self.visible.shape[-1]

    @property
    def flat_slots(self) -> torch.Tensor:
        """cache row * capacity + slot for every new token, [B * T]."""
        if self._flat_slots is None:
            self._flat_slots = flat_slots(self.slots, self.capacity, self.row_start)
        return self._flat_slots

    def view(self, entry: torch.Tensor) -> torch.Tensor:
        """This batch's rows of a cache entry [rows, capacity, ...], over the attention window."""
        return entry[self.row_start : self.row_start + self.slots.shape[0], : self.window]

    def attention_bias(self, group: int, dtype: torch.dtype) -> torch.Tensor:
        """[B|1, 1, group*T, S] additive mask (0 visible, -inf hidden) for queries folded as (head group, token)."""
        key = (group, dtype)
        if key not in self._bias:
            rows, tokens, window = self.visible.shape
            visible = self.visible[:, None].expand(-1, group, -1, -1).reshape(rows, 1, group * tokens, window)
            bias = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
            self._bias[key] = bias.masked_fill_(~visible, float("-inf"))
        return self._bias[key]


_row_offsets: dict[tuple[int, int, int, torch.device], torch.Tensor] = {}


def flat_slots(slots: torch.Tensor, capacity: int, row_start: int = 0) -> torch.Tensor:
    """cache row * capacity + slot for slots [B, T] of cache rows row_start.., flattened: what
    `StaticCache.store` indexes."""
    key = (slots.shape[0], capacity, row_start, slots.device)
    offsets = _row_offsets.get(key)
    if (
        offsets is None
    ):  # made once per shape (a CUDA graph's warm-up runs before its capture): one launch fewer
        offsets = _row_offsets[key] = (
            row_start + torch.arange(slots.shape[0], device=slots.device)[:, None]
        ) * capacity
    return (slots + offsets).flatten()


def causal_visibility(new: int, cached: int, window: int, device: torch.device) -> torch.Tensor:
    """[1, new, window]: new token i (at slot cached + i) sees slots 0..cached + i."""
    query = cached + torch.arange(new, device=device)[:, None]
    return (torch.arange(window, device=device)[None, :] <= query)[None]


def append_batch(
    positions: torch.Tensor,
    cached: int,
    capacity: int,
    batch: int,
    mask: torch.Tensor | None = None,
    window_multiple: int = 64,
    row_start: int = 0,
) -> ForwardBatch:
    """A batch whose T new tokens follow `cached` committed slots in every row; `mask` [B|1, T, cached + T]
    (None: causal) says what each may see. The window is the used slots rounded up, within the capacity.
    With a mask, the new tokens are a tree for recurrent layers (the mask among them its ancestor relation):
    they keep its accepted path only at `TargetModel.commit_tree`; without one, a chain committed at once."""
    new = positions.shape[-1]
    device = positions.device
    used = cached + new
    window = min(capacity, -(-used // window_multiple) * window_multiple)
    tree_paths = None
    if mask is None:
        visible = causal_visibility(new, cached, window, device)
    else:
        visible = torch.zeros(mask.shape[0], new, window, dtype=torch.bool, device=device)
        visible[..., :used] = mask
        tree_paths = root_paths(mask[..., cached:].expand(batch, -1, -1), new)
    slots = (cached + torch.arange(new, device=device)).expand(batch, -1)
    return ForwardBatch(
        positions=positions,
        slots=slots,
        visible=visible,
        capacity=capacity,
        tree_paths=tree_paths,
        row_start=row_start,
    )
