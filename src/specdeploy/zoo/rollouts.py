"""Drafter training data: the frozen target's own greedy continuations of real code prefixes.

At temperature 0 the verifier accepts a drafted token only if it equals the target's greedy choice, so a
drafter learns acceptance best from text the target itself would write (DFlash trains on target outputs).
Prompts start at distinct positions of the training stream (a fixed pseudo-random order of all of them),
and rollouts are written shard by shard as they are generated, so an interrupted run keeps every finished
shard and the next one continues with the next prompts.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specdeploy.zoo.chunk import ChunkLimit

PROGRESS_FILE = "progress.json"


def prompt_starts(num_positions: int, first: int, count: int, seed: int) -> torch.Tensor:
    """Entries first .. first+count-1 of a seeded pseudo-random permutation of range(num_positions): an
    affine map k -> (a*k + b) mod n with a coprime to n, so no start repeats before all n are used."""
    generator = torch.Generator().manual_seed(seed)
    low = max(1, num_positions // 3)
    multiplier = int(torch.randint(low, max(low + 1, 2 * num_positions // 3), (1,), generator=generator))
    while math.gcd(multiplier, num_positions) != 1:
        multiplier += 1
    offset = int(torch.randint(0, num_positions, (1,), generator=generator))
    k = torch.arange(first, first + count, dtype=torch.int64)
    return (k * multiplier + offset) % num_positions


@dataclass
class RolloutProgress:
    shards: int = 0
    sequences: int = 0
    seconds: float = 0.0  # generation time summed over chunks


class RolloutStore:
    """`directory/shard-NNNNN.pt` ([batch, prompt + new] int32 each) and `progress.json`, which counts only
    shards written whole: a shard cut off mid-write is generated again, with the same prompts."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        path = directory / PROGRESS_FILE
        self.progress = (
            RolloutProgress(**json.loads(path.read_text())) if path.is_file() else RolloutProgress()
        )

    def shard_path(self, index: int) -> Path:
        return self.directory / f"shard-{index:05d}.pt"

    def append(self, rows: torch.Tensor, seconds: float) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.shard_path(self.progress.shards)
        tmp = path.with_name(path.name + ".tmp")
        torch.save(rows.to("cpu", torch.int32).contiguous(), tmp)
        os.replace(tmp, path)
        self.progress.shards += 1
        self.progress.sequences += rows.shape[0]
        self.progress.seconds += seconds
        progress = self.directory / PROGRESS_FILE
        progress.with_name(PROGRESS_FILE + ".tmp").write_text(json.dumps(asdict(self.progress)))
        os.replace(progress.with_name(PROGRESS_FILE + ".tmp"), progress)

    def load(self) -> torch.Tensor:
        """Every finished shard as one [n, L] int32 tensor on the CPU."""
        return torch.cat([torch.load(self.shard_path(i)) for i in range(self.progress.shards)])


def distinct_prompts(rows: torch.Tensor, prompt_len: int) -> int:
    """How many different prompts (token sequences, not just start positions) the rollouts continue."""
    return int(torch.unique(rows[:, :prompt_len], dim=0).shape[0])


@torch.no_grad()
def greedy_continuations(
    target: torch.nn.Module, prompts: torch.Tensor, new_tokens: int, eos_token_id: int
) -> torch.Tensor:
    """[batch, prompt + new_tokens] int32 on the CPU; rows that ended early are padded with EOS."""
    device = next(target.parameters()).device
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
    padded = torch.full((prompts.shape[0], prompts.shape[1] + new_tokens), eos_token_id, dtype=torch.int32)
    padded[:, : out.shape[1]] = out.to("cpu", torch.int32)
    return padded


def generate_rollouts(
    target: torch.nn.Module,
    stream: torch.Tensor,
    store: RolloutStore,
    prompt_len: int,
    new_tokens: int,
    batch: int,
    max_sequences: int,
    max_seconds: float,
    eos_token_id: int,
    seed: int,
    limit: ChunkLimit,
    on_shard: Callable[[], None],
) -> bool:
    """Add shards of `batch` rollouts until `max_sequences` or `max_seconds` of generation (True: done) or
    the chunk's limit (False); `on_shard` runs after each shard is saved."""
    target.eval()
    num_positions = stream.numel() - prompt_len
    offsets = torch.arange(prompt_len)
    progress = store.progress
    while progress.sequences < max_sequences and progress.seconds < max_seconds and not limit.reached():
        started = time.monotonic()
        starts = prompt_starts(num_positions, progress.shards * batch, batch, seed)
        prompts = stream[(starts[:, None] + offsets).to(stream.device)].long()
        rows = greedy_continuations(target, prompts, new_tokens, eos_token_id)
        store.append(rows, time.monotonic() - started)
        on_shard()
    return progress.sequences >= max_sequences or progress.seconds >= max_seconds
