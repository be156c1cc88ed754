"""Next-token training of a zoo target (a transformers causal LM) on a flat token stream."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from specdeploy.zoo.loop import StepOutcome


def sample_windows(stream: torch.Tensor, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """`batch` random windows of `length` tokens from a flat stream, as int64 on the stream's device."""
    if stream.numel() <= length:
        raise ValueError(f"token stream of {stream.numel()} tokens is shorter than one window of {length}")
    starts = torch.randint(0, stream.numel() - length, (batch,), generator=generator)
    index = starts[:, None] + torch.arange(length)[None]
    return stream[index.to(stream.device)].long()


def autocast(device: torch.device):
    # bf16 autocast on GPU only: CPU autocast is slow and the CPU path exists for tests.
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


def lm_loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1]).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())


def target_optimizer(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    device = next(model.parameters()).device
    return torch.optim.AdamW(
        model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=device.type == "cuda"
    )


@torch.no_grad()
def held_out_loss(model, stream: torch.Tensor, batch: int, length: int, batches: int, seed: int) -> float:
    """Mean next-token loss on fixed windows of `stream` (the same windows at every call for one seed)."""
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    losses = []
    for _ in range(batches):
        with autocast(device):
            losses.append(lm_loss(model, sample_windows(stream, batch, length + 1, generator)).item())
    model.train(was_training)
    return sum(losses) / len(losses)


def target_step(
    model: torch.nn.Module, stream: torch.Tensor, batch: int, seq_len: int, generator: torch.Generator
) -> Callable[[], StepOutcome]:
    """One next-token step on `batch` random windows of `seq_len` + 1 tokens (loss and backward by the loop)."""
    device = next(model.parameters()).device

    def step() -> StepOutcome:
        tokens = sample_windows(stream, batch, seq_len + 1, generator)
        with autocast(device):
            loss = lm_loss(model, tokens)
        return StepOutcome(loss, tokens.numel())

    return step
