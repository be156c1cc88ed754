"""`specdeploy demo`: the shipped tiny-code pair in ar, dflash and ddtree modes on built-in prompts, on CPU."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from specdeploy.errors import SpecdeployError
from specdeploy.zoo.measure import ModeSpec, run_modes
from specdeploy.zoo.prompts import DEMO_PROMPTS
from specdeploy.zoo.registry import get_pair
from specdeploy.zoo.table import mode_rows, mode_table
from specdeploy.zoo.tokenizer import load_tokenizer


def demo(
    pair: Annotated[str, typer.Option(help="Zoo pair to run.")] = "tiny-code",
    budget: Annotated[int, typer.Option(help="DDTree node budget.")] = 32,
    max_new_tokens: Annotated[int, typer.Option(help="New tokens per prompt.")] = 128,
    prompts: Annotated[
        int, typer.Option("--prompts", help=f"Built-in prompts to use (1-{len(DEMO_PROMPTS)}).")
    ] = len(DEMO_PROMPTS),
) -> None:
    """Decode built-in code prompts with a shipped zoo pair in ar, dflash and ddtree modes; compare them."""
    if not 1 <= prompts <= len(DEMO_PROMPTS):
        raise SpecdeployError(f"--prompts must be between 1 and {len(DEMO_PROMPTS)}, got {prompts}")
    zoo_pair = get_pair(pair)
    tokenizer = load_tokenizer(zoo_pair.target_dir)
    prompt_ids = [tokenizer.encode(text) for text in DEMO_PROMPTS[:prompts]]
    console = Console()
    console.print(
        f"{pair}: {zoo_pair.spec.description}; {prompts} prompts, greedy, {max_new_tokens} new tokens"
    )
    results = run_modes(
        zoo_pair.target_dir,
        zoo_pair.draft_dir,
        prompt_ids,
        (ModeSpec("ar"), ModeSpec("dflash"), ModeSpec("ddtree", budget)),
        max_new_tokens,
        say=lambda line: console.print(f"  {line}"),
    )
    console.print(mode_table(mode_rows(results), f"{pair} on CPU (reference engine, batch 1)"))
