"""The options of `zoo train`, in a module light enough for the CLI to read their defaults from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DataOptions:
    corpus_roots: tuple[str, ...] = ()  # folders of .py files instead of the stdlib
    corpus_packages: tuple[str, ...] = ()  # NAME==VERSION pins of installed packages
    max_files: int | None = None
    vocab_size: int = 2048


@dataclass(frozen=True)
class TrainSettings:
    """What a training run is: every invocation that continues it must pass the same settings."""

    seed: int = 0
    scale: float = 1.0  # model width factor; < 1 for quick runs
    target_minutes: float = 30.0
    target_steps: int = 1_000_000
    target_batch: int = 128
    target_lr: float = 2e-3
    seq_len: int = 512
    # Enough rollouts that the drafter sees each only a few times in its budget (the card states how often).
    rollouts: int = 600_000
    rollout_minutes: float = 20.0
    rollout_prompt: int = 64
    rollout_new_tokens: int = 192
    rollout_batch: int = 4096
    draft_minutes: float = 30.0
    draft_steps: int = 1_000_000
    draft_batch: int = 64
    draft_lr: float = 2e-3
    blocks_per_sequence: int = 16


@dataclass(frozen=True)
class ChunkOptions:
    """How this one invocation runs: free to differ between the chunks of a run."""

    device: str = "cpu"
    max_minutes: float | None = None  # None: until the run is finished
    checkpoint_minutes: float = 2.0
    archive_dir: Path | None = None
    archive_part_bytes: int = 15 << 20
    log_every: int = 50
