"""`specdeploy demo --quick`: the zoo pair in ar, dflash and ddtree through the engine alone (no servers)."""

from __future__ import annotations

from rich.console import Console

from specdeploy.engine.runtime import load_tokenizer
from specdeploy.zoo.measure import ModeSpec, run_modes
from specdeploy.zoo.prompts import DEMO_PROMPTS
from specdeploy.zoo.registry import get_pair
from specdeploy.zoo.table import mode_rows, mode_table


def run_quick(pair: str, budget: int, max_new_tokens: int, prompts: int, console: Console) -> None:
    zoo_pair = get_pair(pair)
    tokenizer = load_tokenizer(zoo_pair.target_dir)
    prompt_ids = [tokenizer.encode(text) for text in DEMO_PROMPTS[:prompts]]
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
    title = (
        f"{pair} on CPU, engine in process (batch 1): {prompts} demo prompts, {max_new_tokens} new tokens; "
        "tau: tokens per target step over all steps of all prompts (the served demo averages per request)"
    )
    console.print(mode_table(mode_rows(results), title))
