"""`specdeploy lab ...`: experiments with the reference engine (see lab/hybrid_tree.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from specdeploy.errors import SpecdeployError

app = typer.Typer(no_args_is_help=True, help="Experiments with the reference engine.")

RANDOM_PROMPT_TOKENS = 32
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def parse_budgets(text: str) -> list[int]:
    try:
        budgets = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SpecdeployError(f"--budgets {text!r} must be comma-separated integers, e.g. 4,16,64") from None
    if not budgets or min(budgets) < 1:
        raise SpecdeployError(f"--budgets {text!r} must list at least one budget, each at least 1")
    return budgets


def lab_prompts(target_path: Path, target, drafter, count: int, seed: int) -> tuple[list[list[int]], str]:
    """The zoo's built-in code prompts when the target has a tokenizer, else seeded random tokens."""
    from specdeploy.engine.runtime import load_tokenizer
    from specdeploy.lab.hybrid_tree import random_prompts
    from specdeploy.zoo.prompts import DEMO_PROMPTS

    if count < 1:
        raise SpecdeployError(f"--prompts must be at least 1, got {count}")
    # Without tokenizer files transformers would build an empty tokenizer from config.json alone.
    if not any((Path(target_path) / name).is_file() for name in TOKENIZER_FILES):
        avoid = {*target.config.eos_token_ids, drafter.mask_token_id}
        prompts = random_prompts(count, RANDOM_PROMPT_TOKENS, target.config.vocab_size, avoid, seed)
        return prompts, f"random {RANDOM_PROMPT_TOKENS}-token prompts (the target has no tokenizer)"
    tokenizer = load_tokenizer(target_path)
    if count > len(DEMO_PROMPTS):
        raise SpecdeployError(f"--prompts {count}: there are {len(DEMO_PROMPTS)} built-in prompts")
    prompts = [tokenizer.encode(text, add_special_tokens=False) for text in DEMO_PROMPTS[:count]]
    return prompts, "built-in code prompts"


@app.command("hybrid-tree")
def hybrid_tree(
    target: Annotated[str, typer.Option(help="Hybrid target checkpoint directory or zoo:NAME.")],
    draft: Annotated[str, typer.Option(help="DFlash drafter directory or zoo:NAME.")],
    budgets: Annotated[str, typer.Option(help="DDTree budgets, comma-separated.")] = "4,16,64",
    prompts: Annotated[int, typer.Option(help="Number of prompts.")] = 4,
    max_new_tokens: Annotated[int, typer.Option(help="New tokens per prompt.")] = 64,
    ignore_eos: Annotated[bool, typer.Option(help="Keep going past EOS.")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the random prompts (targets without tokenizer).")] = 0,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    dtype: Annotated[str, typer.Option(help="auto (fp32 on CPU, bf16 on CUDA), float32, bfloat16.")] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """DDTree on a hybrid target with exact per-node recurrent state and with a naive engine's leaky order."""
    from specdeploy.engine.loading import load_drafter, load_target
    from specdeploy.engine.runtime import resolve_device, resolve_dtype
    from specdeploy.engine.sampling import SamplingParams
    from specdeploy.lab.hybrid_tree import check_hybrid, hybrid_tree_experiment
    from specdeploy.zoo.registry import resolve_models

    budget_list = parse_budgets(budgets)
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    target_path, draft_path = resolve_models(target, draft, "dflash")  # any mode that needs the drafter
    model = load_target(target_path, device=torch_device, dtype=torch_dtype)
    check_hybrid(model)
    drafter = load_drafter(draft_path, device=torch_device, dtype=torch_dtype)
    drafter.check_compatible(model.config)
    prompt_ids, source = lab_prompts(target_path, model, drafter, prompts, seed)
    params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=ignore_eos)
    rows = hybrid_tree_experiment(model, drafter, prompt_ids, budget_list, params)
    if as_json:
        typer.echo(
            json.dumps(
                {"prompts": len(prompt_ids), "prompt_source": source, "rows": [r.as_dict() for r in rows]}
            )
        )
        return
    typer.echo(
        f"{len(prompt_ids)} {source}, up to {max_new_tokens} new tokens, greedy, block {drafter.block_size}"
    )
    typer.echo(f"{'mode':<7} {'budget':>6} {'state':<6} {'tau':>6} {'verified/step':>13} {'== AR':>7}")
    for row in rows:
        budget = "-" if row.budget is None else str(row.budget)
        typer.echo(
            f"{row.mode:<7} {budget:>6} {row.tree_state:<6} {row.tau:>6.2f} {row.verified_per_step:>13.1f} "
            f"{row.equal_to_ar:>3}/{row.prompts:<3}"
        )
