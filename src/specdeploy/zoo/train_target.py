"""Next-token training of a zoo target (a transformers causal LM) on a flat token stream."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from specdeploy.zoo.schedule import TrainBudget


@dataclass
class TrainLog:
    steps: int = 0
    seconds: float = 0.0
    tokens_seen: int = 0
    final_train_loss: float = float("nan")
    held_out_loss: float = float("nan")
    history: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "history"}


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


@torch.no_grad()
def held_out_loss(model, stream: torch.Tensor, batch: int, length: int, batches: int, seed: int) -> float:
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    model.eval()
    losses = []
    for _ in range(batches):
        with autocast(device):
            losses.append(lm_loss(model, sample_windows(stream, batch, length + 1, generator)).item())
    model.train()
    return sum(losses) / len(losses)


def train_target(
    model: torch.nn.Module,
    train_stream: torch.Tensor,
    held_out_stream: torch.Tensor | None,
    budget: TrainBudget,
    batch: int,
    seq_len: int,
    seed: int,
    checkpoint: Callable[[], None],
    checkpoint_every: int,
    log_every: int = 50,
    say: Callable[[str], None] = print,
) -> TrainLog:
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=budget.peak_lr,
        betas=(0.9, 0.95),
        weight_decay=0.1,
        fused=device.type == "cuda",
    )
    log = TrainLog()
    model.train()
    started = time.monotonic()
    running = None
    while not budget.done(log.steps):
        for group in optimizer.param_groups:
            group["lr"] = budget.learning_rate(log.steps)
        tokens = sample_windows(train_stream, batch, seq_len + 1, generator)
        with autocast(device):
            loss = lm_loss(model, tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        log.steps += 1
        log.tokens_seen += tokens.numel()
        if log.steps % log_every == 0 or budget.done(log.steps):
            running = loss.item()
            log.history.append(
                {"step": log.steps, "loss": round(running, 4), "s": round(time.monotonic() - started, 1)}
            )
            say(f"target step {log.steps} loss {running:.4f} lr {budget.learning_rate(log.steps):.2e}")
        if log.steps % checkpoint_every == 0:
            checkpoint()
    log.seconds = round(time.monotonic() - started, 1)
    log.final_train_loss = round(running if running is not None else float("nan"), 4)
    if held_out_stream is not None and held_out_stream.numel() > seq_len + 1:
        log.held_out_loss = round(held_out_loss(model, held_out_stream, batch, seq_len, 4, seed), 4)
        say(f"target held-out loss {log.held_out_loss:.4f}")
    checkpoint()
    return log
