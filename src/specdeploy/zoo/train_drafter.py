"""Block-diffusion training of a DFlash drafter against a frozen target.

Each training sequence gets several random anchor positions a. The block for anchor a is
[x_a, MASK x (B-1)] at positions a..a+B-1; it sees the target's context features of positions < a and,
non-causally, its own block, exactly as at decode time after committing x_a. Slot i predicts x_{a+i}.
All blocks of a batch go through the drafter in one forward, kept apart by an explicit attention mask.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdeploy.zoo.schedule import TrainBudget
from specdeploy.zoo.train_target import TrainLog, autocast

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
) -> BlockBatch:
    batch, seq_len = sequences.shape
    device = sequences.device
    # Distinct anchors per row in [1, S - B]: every block has context and all its labels inside the row.
    candidates = seq_len - block_size
    if candidates < num_blocks:
        raise ValueError(f"sequences of {seq_len} tokens cannot hold {num_blocks} blocks of {block_size}")
    anchors = torch.rand(batch, candidates, generator=generator).argsort(1)[:, :num_blocks] + 1
    anchors = anchors.to(device)
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
    drafter, target, sequences: torch.Tensor, blocks: BlockBatch, target_labels: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted cross-entropy over masked slots, and per-slot top-1 accuracy (for the log).

    With `target_labels`, slot i learns the target's greedy token at anchor+i (given the true prefix)
    instead of the text's own token: what verification accepts at temperature 0.
    """
    context, greedy = target_features(target, sequences, list(drafter.target_layer_ids))
    if target_labels:
        block_positions = blocks.positions[:, sequences.shape[1] :]
        labels = torch.where(blocks.labels == IGNORE, IGNORE, greedy.gather(1, block_positions))
        blocks = BlockBatch(blocks.block_ids, blocks.positions, blocks.attention_mask, labels, blocks.weights)
    noise = target.get_input_embeddings()(blocks.block_ids) * getattr(drafter, "input_embedding_scale", 1.0)
    hidden = drafter(noise, context, blocks.positions, None, attention_mask=blocks.attention_mask)
    logits = drafter.compute_logits(hidden, target.get_output_embeddings()).float()
    losses = F.cross_entropy(
        logits.flatten(0, 1), blocks.labels.flatten(), ignore_index=IGNORE, reduction="none"
    )
    loss = (losses * blocks.weights.flatten()).sum() / blocks.weights.sum().clamp(min=1e-6)
    correct = (logits.argmax(-1) == blocks.labels).float()
    return loss, correct


def train_drafter(
    drafter: torch.nn.Module,
    target: torch.nn.Module,
    next_batch: Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]],
    target_labels: bool,
    budget: TrainBudget,
    batch: int,
    num_blocks: int,
    gamma: float,
    seed: int,
    checkpoint: Callable[[], None],
    checkpoint_every: int,
    log_every: int = 50,
    say: Callable[[str], None] = print,
) -> TrainLog:
    """Train `drafter` (its embedding and head are the frozen target's) on batches from `next_batch`.

    `next_batch(batch, generator)` gives token rows [batch, S] and each row's last position worth predicting.
    """
    device = next(drafter.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    target.requires_grad_(False)
    target.eval()
    optimizer = torch.optim.AdamW(
        drafter.parameters(),
        lr=budget.peak_lr,
        betas=(0.9, 0.95),
        weight_decay=0.01,
        fused=device.type == "cuda",
    )
    block_size = drafter.block_size
    log = TrainLog()
    drafter.train()
    started = time.monotonic()
    running = float("nan")
    while not budget.done(log.steps):
        for group in optimizer.param_groups:
            group["lr"] = budget.learning_rate(log.steps)
        seqs, last_valid = next_batch(batch, generator)
        seqs = seqs.to(device).long()
        blocks = make_blocks(
            seqs, last_valid.to(device), num_blocks, block_size, drafter.mask_token_id, gamma, generator
        )
        with autocast(device):
            loss, correct = drafter_loss(drafter, target, seqs, blocks, target_labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        log.steps += 1
        log.tokens_seen += int((blocks.labels != -100).sum())
        if log.steps % log_every == 0 or budget.done(log.steps):
            running = loss.item()
            accuracy = slot_accuracy(correct, blocks, block_size)
            log.history.append(
                {
                    "step": log.steps,
                    "loss": round(running, 4),
                    "s": round(time.monotonic() - started, 1),
                    "slot_accuracy": [round(a, 3) for a in accuracy],
                }
            )
            say(
                f"draft step {log.steps} loss {running:.4f} acc@1 {accuracy[0]:.2f} expected tau {expected_tau(accuracy):.2f}"
            )
        if log.steps % checkpoint_every == 0:
            checkpoint()
    log.seconds = round(time.monotonic() - started, 1)
    log.final_train_loss = round(running, 4)
    checkpoint()
    return log


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
