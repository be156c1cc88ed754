"""`specdeploy zoo ...`: tiny models for tests, CI and laptops."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from specdeploy.zoo.commands import eval_command, list_command
from specdeploy.zoo.train import train_command

app = typer.Typer(no_args_is_help=True, help=__doc__)


@app.command("random")
def random_pair(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write target/ and draft/ into.")],
    family: Annotated[
        str, typer.Option(help="Target architecture: qwen3, qwen3_moe or deepseek_v3.")
    ] = "qwen3",
    seed: Annotated[int, typer.Option(help="Same seed, same weights.")] = 0,
    block_size: Annotated[int, typer.Option(help="Drafter block size: 8 or 16.")] = 16,
    as_json: Annotated[bool, typer.Option("--json", help="Print the paths as one JSON object.")] = False,
) -> None:
    """Write a tiny random target (transformers format, byte-level tokenizer) and a matching DFlash drafter."""
    from specdeploy.zoo.random_pair import write_random_pair

    target_dir, draft_dir = write_random_pair(out_dir, family=family, seed=seed, block_size=block_size)
    if as_json:
        typer.echo(json.dumps({"target": str(target_dir), "draft": str(draft_dir), "family": family}))
    else:
        typer.echo(f"target: {target_dir}\ndraft:  {draft_dir}")


app.command("list")(list_command)
app.command("train")(train_command)
app.command("eval")(eval_command)
