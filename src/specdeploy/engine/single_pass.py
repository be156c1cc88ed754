"""One pass of a model outside the decoding step, through the same `run(ForwardBatch)` / `draft` the step uses.

For tests, probes and drafter training: the caller says how many slots of each cache row are already
committed (`cached`) and the new tokens are written right after them, in a static cache (a fresh one when
none is given). Nothing here grows a cache or tracks its length: the step's own bookkeeping does that.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from specdeploy.engine.cache import StaticCache
from specdeploy.engine.forward_batch import append_batch
from specdeploy.errors import SpecdeployError

if TYPE_CHECKING:
    from specdeploy.engine.drafter import DFlashDrafter
    from specdeploy.engine.models.base import TargetModel


def target_pass(
    target: TargetModel,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    cache: StaticCache | None = None,
    cached: int = 0,
    mask: torch.Tensor | None = None,
    hidden_layer_ids: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run `input_ids` [B, T] at `positions` [B|1, T] after `cached` committed slots of `cache` (a fresh one
    when None), writing their entries at slots cached..cached+T-1.

    `mask` [B|1, T, cached + T] (True = may attend) defaults to causal; it may be any visibility pattern, such
    as a draft tree's ancestor mask. Returns float32 logits [B, T, V] and the features of `hidden_layer_ids`
    [B, T, K*H] (`TargetModel.run`'s), or None.
    """
    rows, new = input_ids.shape
    if positions.dim() != 2 or positions.shape[1] != new or positions.shape[0] not in (1, rows):
        raise SpecdeployError(
            f"positions must be [{rows} or 1, {new}] like input_ids, got {list(positions.shape)}"
        )
    if mask is not None and (
        mask.dtype != torch.bool or mask.dim() != 3 or mask.shape[0] not in (1, rows)
        or tuple(mask.shape[1:]) != (new, cached + new)
    ):  # fmt: skip
        raise SpecdeployError(
            f"mask must be a bool tensor [{rows}|1, {new}, {cached + new}] (new tokens x cached + new, "
            f"True = may attend), got {mask.dtype} {list(mask.shape)}"
        )
    last = len(target.layers) - 1
    wrong = [i for i in hidden_layer_ids if not 0 <= i <= last]
    if wrong:
        raise SpecdeployError(f"hidden_layer_ids {wrong} out of range: this model has layers 0..{last}")
    cache = cache if cache is not None else target.new_cache(rows, cached + new + 1, tree_tokens=new)
    _check_room(cache, rows, cached + new)
    target.check_visibility(mask, cached)
    batch = append_batch(positions, cached, cache.capacity, rows, mask)
    hidden, features = target.run(input_ids, batch, cache, hidden_layer_ids)
    return target.lm_head(hidden).float(), features


def draft_pass(
    drafter: DFlashDrafter,
    noise_embedding: torch.Tensor,
    context: torch.Tensor,
    positions: torch.Tensor,
    cache: StaticCache | None = None,
    cached: int = 0,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Draft hidden states [B, L, H] (after the final norm) for the block `noise_embedding` [B, L, H].

    `context` [B, C, K*H]: raw target features of C newly committed positions (C may be 0), written at slots
    cached..cached+C-1 of `cache` (a fresh one when None); the block's keys and values go to the next L
    slots, which the next pass may overwrite (the caller's committed count becomes cached + C). `positions`
    [B|1, C+L]: the context's positions, then the block's. `mask` [B|1, L, cached + C + L] bool replaces the
    default visibility (the block sees every cached and context key and itself, non-causally); layer
    causality and sliding windows still apply.
    """
    rows, length, width = noise_embedding.shape
    ctx_len = context.shape[1]
    features = len(drafter.target_layer_ids) * drafter.hidden_size
    if width != drafter.hidden_size or context.shape[-1] != features:
        raise SpecdeployError(
            f"drafter expects block embeddings of width {drafter.hidden_size} and context features of width "
            f"{features}, got {width} and {context.shape[-1]}"
        )
    if positions.shape[-1] != ctx_len + length:
        raise SpecdeployError(
            f"positions cover {positions.shape[-1]} positions, expected C+L={ctx_len + length}"
        )
    keys = cached + ctx_len + length
    if mask is not None and (mask.dim() != 3 or tuple(mask.shape[1:]) != (length, keys)):
        raise SpecdeployError(f"mask must be [B or 1, {length}, {keys}] bool, got {list(mask.shape)}")
    cache = cache if cache is not None else drafter.new_cache(rows, keys + 1)
    _check_room(cache, rows, keys)
    positions = positions.expand(rows, -1)
    slots = (cached + torch.arange(ctx_len, device=positions.device)).expand(rows, -1)
    drafter.write_context(context, positions[:, :ctx_len], slots, cache)
    if mask is None:
        mask = torch.ones(1, length, keys, dtype=torch.bool, device=positions.device)
    batch = append_batch(positions[:, ctx_len:], cached + ctx_len, cache.capacity, rows, mask.to(torch.bool))
    return drafter.draft(noise_embedding, batch, cache)


def _check_room(cache: StaticCache, rows: int, slots: int) -> None:
    """A pass past a row's last usable slot would write into the next row's slots."""
    if cache.batch < rows or slots > cache.usable:
        raise SpecdeployError(
            f"the cache holds {cache.batch} rows of {cache.usable} usable slots; this pass needs {rows} rows "
            f"of {slots}"
        )
