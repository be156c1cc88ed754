"""Block-diffusion training of a DFlash drafter against a frozen target (DFlash's objective).

Each training sequence gets several random anchor positions a. The block for anchor a is
[x_a, MASK x (B-1)] at positions a..a+B-1; it sees the target's context features of positions < a and,
non-causally, its own block, exactly as at decode time after committing x_a. Slot i (1..B-1) learns the
target's greedy token at a+i given the sequence before it (what verification accepts at temperature 0),
weighted exp(-(i-1)/gamma): early slots decide how much of a block is accepted. All blocks of a batch go
through the drafter in one forward, kept apart by an explicit attention mask.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdeploy.engine.single_pass import draft_pass
from specdeploy.zoo.loop import StepOutcome
from specdeploy.zoo.train_target import autocast

IGNORE = -100


@dataclass
class BlockBatch:
    block_ids: torch.Tensor  # [b, n*B] anchor token then MASKs, block after block
    positions: torch.Tensor  # [b, S + n*B] context positions 0..S-1, then each block's positions
    attention_mask: torch.Tensor  # [b, n*B, S + n*B] bool, True where a block query may look
    labels: torch.Tensor  # [b, n*B] the token each slot should predict; IGNORE for anchors and padding
    weights: torch.Tensor  # [b, n*B] loss weight per slot


def last_valid_positions(sequences: torch.Tensor, start: int, eos_token_id: int) -> torch.Tensor:
    """Per row, the last position worth predicting: the first EOS at or after `start` (inclusive)."""
    is_eos = sequences[:, start:] == eos_token_id
    no_eos = torch.full((sequences.shape[0],), sequences.shape[1] - 1)
    return torch.where(is_eos.any(1), is_eos.int().argmax(1) + start, no_eos)


def make_blocks(
    sequences: torch.Tensor,
    last_valid: torch.Tensor,
    num_blocks: int,
    block_size: int,
    mask_token_id: int,
    gamma: float,
    generator: torch.Generator,
    first_anchor: int = 1,
) -> BlockBatch:
    """Blocks at distinct random anchors in [first_anchor, S - B] of each row: every block has context and
    all its labels inside the row. Anchors before the row's `last_valid` come first, so a rollout that ended
    early still gives blocks with labels where it can."""
    batch, seq_len = sequences.shape
    device = sequences.device
    candidates = seq_len - block_size - first_anchor + 1
    if first_anchor < 1 or candidates < num_blocks:
        raise ValueError(
            f"sequences of {seq_len} tokens cannot hold {num_blocks} blocks of {block_size} from {first_anchor}"
        )
    positions = torch.arange(first_anchor, first_anchor + candidates)
    scores = torch.rand(batch, candidates, generator=generator)
    scores += (positions[None] >= last_valid.cpu()[:, None]).float()  # no label after the anchor: last
    anchors = (scores.argsort(1)[:, :num_blocks] + first_anchor).to(device)
    offsets = torch.arange(block_size, device=device)
    block_pos = (anchors[:, :, None] + offsets).flatten(1)  # [b, n*B]
    slot = offsets.repeat(num_blocks)[None].expand(batch, -1)

    block_ids = torch.full_like(block_pos, mask_token_id)
    block_ids[slot == 0] = sequences.gather(1, anchors).flatten()
    labels = sequences.gather(1, block_pos).long()
    labels[(slot == 0) | (block_pos > last_valid[:, None])] = IGNORE
    weights = torch.exp(-(slot.float() - 1).clamp(min=0) / gamma) * (labels != IGNORE)

    block_of = torch.arange(num_blocks, device=device).repeat_interleave(block_size)
    anchor_of_query = (block_pos - slot)[:, :, None]
    sees_context = torch.arange(seq_len, device=device)[None, None] < anchor_of_query
    sees_block = (block_of[:, None] == block_of[None, :])[None].expand(batch, -1, -1)
    ctx_positions = torch.arange(seq_len, device=device)[None].expand(batch, -1)
    return BlockBatch(
        block_ids=block_ids,
        positions=torch.cat([ctx_positions, block_pos], dim=1),
        attention_mask=torch.cat([sees_context, sees_block], dim=2),
        labels=labels,
        weights=weights,
    )


def target_features(
    target, sequences: torch.Tensor, layer_ids: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The concatenated hidden states after each of `layer_ids` (HF hidden_states[id + 1]), and the target's
    greedy choice for every position given the true prefix (position 0 keeps its own token)."""
    with torch.no_grad():
        out = target(sequences, output_hidden_states=True)
    greedy = torch.cat([sequences[:, :1], out.logits[:, :-1].argmax(-1)], dim=1)
    return torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1), greedy


def drafter_loss(
    drafter, target, sequences: torch.Tensor, blocks: BlockBatch
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted cross-entropy over masked slots against the target's greedy tokens, and per-slot top-1
    accuracy (for the log). `blocks` comes back with those labels in place of the sequence's own tokens."""
    context, greedy = target_features(target, sequences, list(drafter.target_layer_ids))
    block_positions = blocks.positions[:, sequences.shape[1] :]
    blocks.labels = torch.where(blocks.labels == IGNORE, IGNORE, greedy.gather(1, block_positions))
    noise = target.get_input_embeddings()(blocks.block_ids) * getattr(drafter, "input_embedding_scale", 1.0)
    hidden = draft_pass(drafter, noise, context, blocks.positions, mask=blocks.attention_mask)
    logits = drafter.compute_logits(hidden, target.get_output_embeddings()).float()
    losses = F.cross_entropy(
        logits.flatten(0, 1), blocks.labels.flatten(), ignore_index=IGNORE, reduction="none"
    )
    loss = (losses * blocks.weights.flatten()).sum() / blocks.weights.sum().clamp(min=1e-6)
    correct = (logits.argmax(-1) == blocks.labels).float()
    return loss, correct


def drafter_optimizer(drafter: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    device = next(drafter.parameters()).device
    return torch.optim.AdamW(
        drafter.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01, fused=device.type == "cuda"
    )


def drafter_step(
    drafter: torch.nn.Module,
    target: torch.nn.Module,
    next_batch: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    num_blocks: int,
    gamma: float,
    first_anchor: int,
    generator: torch.Generator,
) -> Callable[[], StepOutcome]:
    """One drafter step on the rows `next_batch()` gives ([batch, S] tokens and each row's last position
    worth predicting); the target (whose embedding and head the drafter borrows) stays frozen."""
    device = next(drafter.parameters()).device
    target.requires_grad_(False)
    target.eval()
    block_size = drafter.block_size

    def step() -> StepOutcome:
        sequences, last_valid = next_batch()
        sequences, last_valid = sequences.to(device).long(), last_valid.to(device)
        blocks = make_blocks(
            sequences,
            last_valid,
            num_blocks,
            block_size,
            drafter.mask_token_id,
            gamma,
            generator,
            first_anchor,
        )
        with autocast(device):
            loss, correct = drafter_loss(drafter, target, sequences, blocks)

        def details() -> dict:
            accuracy = slot_accuracy(correct, blocks, block_size)
            return {
                "slot_accuracy": [round(a, 3) for a in accuracy],
                "expected_tau": round(expected_tau(accuracy), 2),
            }

        return StepOutcome(loss, (blocks.labels != IGNORE).sum(), details)

    return step


def slot_accuracy(correct: torch.Tensor, blocks: BlockBatch, block_size: int) -> list[float]:
    """Top-1 accuracy of slots 1..B-1 against their labels."""
    valid = (blocks.labels != IGNORE).float()
    per_slot_correct = (correct * valid).view(correct.shape[0], -1, block_size).sum((0, 1))
    per_slot_count = valid.view(valid.shape[0], -1, block_size).sum((0, 1)).clamp(min=1)
    return (per_slot_correct / per_slot_count)[1:].tolist()


def expected_tau(accuracy: list[float]) -> float:
    """A rough tau estimate from per-slot accuracies (treats slots as independent): 1 + sum of products."""
    tau, alive = 1.0, 1.0
    for a in accuracy:
        alive *= a
        tau += alive
    return tau if not math.isnan(tau) else 0.0
