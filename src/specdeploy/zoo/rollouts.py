"""Drafter training data: the frozen target's own greedy continuations of real code prefixes.

At temperature 0 the verifier accepts a drafted token only if it equals the target's greedy choice, so a
drafter learns acceptance best from text the target itself would write (DFlash trains on target outputs).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from specdeploy.zoo.train_target import sample_windows


@torch.no_grad()
def greedy_rollouts(
    target: torch.nn.Module,
    stream: torch.Tensor,
    prompt_len: int,
    new_tokens: int,
    batch: int,
    max_seconds: float,
    max_batches: int,
    eos_token_id: int,
    seed: int,
    say: Callable[[str], None] = print,
) -> torch.Tensor:
    """[n, prompt_len + new_tokens] int32 sequences on CPU; rows that ended early are padded with EOS."""
    generator = torch.Generator().manual_seed(seed)
    device = next(target.parameters()).device
    target.eval()
    rows: list[torch.Tensor] = []
    started = time.monotonic()
    while len(rows) < max_batches and time.monotonic() - started < max_seconds:
        prompts = sample_windows(stream, batch, prompt_len, generator)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            out = target.generate(
                prompts,
                attention_mask=torch.ones_like(prompts),
                max_new_tokens=new_tokens,
                do_sample=False,
                eos_token_id=eos_token_id,
                pad_token_id=eos_token_id,
            )
        # generate() stops early when every row has ended; pad to full length with EOS like finished rows.
        padded = torch.full((batch, prompt_len + new_tokens), eos_token_id, dtype=torch.int32)
        padded[:, : out.shape[1]] = out.to("cpu", torch.int32)
        rows.append(padded)
    say(f"rollouts: {len(rows) * batch} sequences in {time.monotonic() - started:.0f}s")
    target.train()
    return torch.cat(rows)
