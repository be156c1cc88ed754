"""`specdeploy zoo train`: train the zoo's pairs in resumable chunks (also `python -m specdeploy.zoo.train`)."""

from __future__ import annotations

from pathlib import Path

import typer

from specdeploy.errors import SpecdeployError
from specdeploy.zoo.settings import ChunkOptions, DataOptions, TrainSettings
from specdeploy.zoo.specs import PAIRS

RUN = TrainSettings()  # the defaults shown by --help are the ones the code uses
DATA = DataOptions()
CHUNK = ChunkOptions()


def train_command(
    out: Path = typer.Option(..., "--out", help="Folder for the shared data and the pairs' runs."),
    pairs: list[str] = typer.Option(
        list(PAIRS), "--pair", help="Pair(s) to train, in turn (repeat the option)."
    ),
    corpus: list[Path] = typer.Option(
        [], help="Folder(s) of .py files instead of this Python's stdlib (repeat the option)."
    ),
    corpus_package: list[str] = typer.Option(
        [],
        help="An installed package whose .py files join the corpus, pinned as NAME==VERSION (repeat the option).",
    ),
    max_files: int | None = typer.Option(
        DATA.max_files, help="Use only the first N files of each corpus source."
    ),
    vocab_size: int = typer.Option(DATA.vocab_size, help="Tokenizer vocabulary."),
    max_minutes: float | None = typer.Option(
        CHUNK.max_minutes,
        help="Stop this invocation after this long (checkpointed); run it again to continue.",
    ),
    device: str = typer.Option(CHUNK.device, help="cpu or cuda (may differ between invocations)."),
    checkpoint_minutes: float = typer.Option(
        CHUNK.checkpoint_minutes, help="Checkpoint at least this often."
    ),
    seed: int = typer.Option(RUN.seed, help="Seed of weight initialisation, data order and rollout prompts."),
    scale: float = typer.Option(
        RUN.scale, help="Model width factor; below 1 also shrinks depth (quick runs)."
    ),
    target_minutes: float = typer.Option(
        RUN.target_minutes, help="Target training time, summed over invocations."
    ),
    target_steps: int = typer.Option(RUN.target_steps, help="Target steps at most."),
    target_batch: int = typer.Option(RUN.target_batch, help="Windows per target step."),
    target_lr: float = typer.Option(RUN.target_lr, help="Target learning rate."),
    seq_len: int = typer.Option(RUN.seq_len, help="Target training window (tokens)."),
    rollouts: int = typer.Option(
        RUN.rollouts, help="Greedy target rollouts for the drafter, from distinct prompts."
    ),
    rollout_minutes: float = typer.Option(RUN.rollout_minutes, help="Rollout generation time at most."),
    rollout_batch: int = typer.Option(RUN.rollout_batch, help="Rollouts generated (and saved) together."),
    rollout_prompt: int = typer.Option(RUN.rollout_prompt, help="Prompt tokens of each rollout."),
    rollout_new_tokens: int = typer.Option(
        RUN.rollout_new_tokens, help="Tokens the target writes per prompt."
    ),
    draft_minutes: float = typer.Option(
        RUN.draft_minutes, help="Drafter training time, summed over invocations."
    ),
    draft_steps: int = typer.Option(RUN.draft_steps, help="Drafter steps at most."),
    draft_batch: int = typer.Option(RUN.draft_batch, help="Rollouts per drafter step."),
    draft_lr: float = typer.Option(RUN.draft_lr, help="Drafter learning rate."),
    blocks_per_sequence: int = typer.Option(
        RUN.blocks_per_sequence, help="Drafter blocks (anchors) per rollout."
    ),
    archive_dir: Path | None = typer.Option(
        CHUNK.archive_dir,
        help="Also write each pair as a tar split into parts (<= --archive-part-mb) after each save.",
    ),
    archive_part_mb: int = typer.Option(
        CHUNK.archive_part_bytes >> 20, help="Largest part of a --archive-dir tar, in MiB."
    ),
) -> None:
    """Train tokenizer, targets and DFlash drafters for the zoo's pairs, checkpointing as it goes.

    Each invocation continues the run in --out where the last one stopped (with the same options) and works
    until the run is finished or --max-minutes is up; SIGTERM or Ctrl-C also stop it at a checkpoint. The
    last line says whether each pair is finished.
    """
    from specdeploy.zoo.pipeline import train_zoo

    if max_minutes is not None and max_minutes <= 0:
        raise SpecdeployError(f"--max-minutes must be positive, got {max_minutes}")
    settings = TrainSettings(
        seed=seed,
        scale=scale,
        target_minutes=target_minutes,
        target_steps=target_steps,
        target_batch=target_batch,
        target_lr=target_lr,
        seq_len=seq_len,
        rollouts=rollouts,
        rollout_minutes=rollout_minutes,
        rollout_prompt=rollout_prompt,
        rollout_new_tokens=rollout_new_tokens,
        rollout_batch=rollout_batch,
        draft_minutes=draft_minutes,
        draft_steps=draft_steps,
        draft_batch=draft_batch,
        draft_lr=draft_lr,
        blocks_per_sequence=blocks_per_sequence,
    )
    data = DataOptions(
        corpus_roots=tuple(str(path.resolve()) for path in corpus),
        corpus_packages=tuple(corpus_package),
        max_files=max_files,
        vocab_size=vocab_size,
    )
    chunk = ChunkOptions(
        device=device,
        max_minutes=max_minutes,
        checkpoint_minutes=checkpoint_minutes,
        archive_dir=archive_dir,
        archive_part_bytes=archive_part_mb << 20,
    )
    finished = train_zoo(out, pairs, settings, data, chunk)
    state = ", ".join(f"{name} {'finished' if done else 'not finished'}" for name, done in finished.items())
    waiting = [name for name, done in finished.items() if not done]
    typer.echo(state + (f"; run the same command again to continue {', '.join(waiting)}" if waiting else ""))


if __name__ == "__main__":
    typer.run(train_command)
