"""`specdeploy zoo train`: train the zoo's pairs from a seed (also runnable as `python -m specdeploy.zoo.train`)."""

from __future__ import annotations

from pathlib import Path

import typer

from specdeploy.zoo.specs import PAIRS


def train_command(
    out: Path = typer.Option(..., "--out", help="Folder for the corpus record, tokenizer and trained pairs."),
    pairs: list[str] = typer.Option(list(PAIRS), "--pair", help="Pair(s) to train (repeat the option)."),
    corpus: list[Path] = typer.Option(
        [], help="Folder(s) of .py files (repeat the option; default: this Python's stdlib)."
    ),
    max_files: int | None = typer.Option(None, help="Use only the first N files of each corpus folder."),
    seed: int = typer.Option(0),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    scale: float = typer.Option(1.0, help="Model width factor; below 1 also shrinks depth (quick runs)."),
    target_seconds: float = typer.Option(180.0),
    target_steps: int = typer.Option(100_000),
    target_batch: int = typer.Option(64),
    draft_seconds: float = typer.Option(120.0),
    draft_steps: int = typer.Option(100_000),
    draft_batch: int = typer.Option(64),
    seq_len: int = typer.Option(512, help="Target training window (tokens)."),
    rollout_seconds: float = typer.Option(45.0, help="Time for the target's greedy rollouts (drafter data)."),
    rollout_batches: int = typer.Option(1000),
    rollout_batch: int = typer.Option(256),
    rollout_new_tokens: int = typer.Option(192),
    checkpoint_every: int = typer.Option(500, help="Save (and archive) every N optimizer steps."),
    parallel: bool = typer.Option(False, help="Train the pairs side by side in separate processes."),
    archive_dir: Path | None = typer.Option(
        None, help="Also write each pair as a tar split into parts (<= --archive-part-mb) after each save."
    ),
    archive_part_mb: int = typer.Option(15),
    reuse_data: bool = typer.Option(False, help="Reuse the tokenizer and tokens already in --out."),
    draft_only: bool = typer.Option(
        False, help="Only continue training the drafters in --out/<pair> against their trained targets."
    ),
    draft_lr: float = typer.Option(2e-3),
) -> None:
    """Train tokenizer, targets and DFlash drafters for the zoo's pairs, checkpointing as it goes."""
    from specdeploy.zoo.pipeline import TrainSettings, retrain_drafter, train_zoo

    settings = TrainSettings(
        seed=seed,
        device=device,
        scale=scale,
        max_files=max_files,
        target_steps=target_steps,
        target_seconds=target_seconds,
        target_batch=target_batch,
        seq_len=seq_len,
        rollout_seconds=rollout_seconds,
        rollout_batches=rollout_batches,
        rollout_batch=rollout_batch,
        rollout_new_tokens=rollout_new_tokens,
        draft_steps=draft_steps,
        draft_seconds=draft_seconds,
        draft_batch=draft_batch,
        draft_lr=draft_lr,
        checkpoint_every=checkpoint_every,
        archive_part_bytes=archive_part_mb << 20,
    )
    if draft_only:
        for name in pairs:
            retrain_drafter(out / name, corpus or None, settings)
        return
    train_zoo(out, pairs, settings, corpus or None, parallel, archive_dir, reuse_data)


if __name__ == "__main__":
    typer.run(train_command)
