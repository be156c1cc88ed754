"""`specdeploy doctor`: explain a low acceptance length from the pair's files and one short probe."""

from __future__ import annotations

import json
from typing import Annotated

import typer


def doctor(
    target: Annotated[str | None, typer.Option(help="Target checkpoint directory or zoo:NAME.")] = None,
    draft: Annotated[
        str | None,
        typer.Option(help="DFlash drafter directory or zoo:NAME-draft (a zoo target brings its own)."),
    ] = None,
    recipe: Annotated[
        str | None,
        typer.Option(help="Recipe name or TOML path: its models, block size, pairing, known issues."),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            help="Probe this running server (SGLang or `specdeploy serve`) instead of loading the models."
        ),
    ] = None,
    mode: Annotated[
        str, typer.Option(help="dflash or ddtree (the reference engine, in process).")
    ] = "dflash",
    budget: Annotated[int | None, typer.Option(help="DDTree draft nodes per step (in process).")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="New tokens per probe prompt.")] = 48,
    probe: Annotated[
        bool, typer.Option(help="Run the probe; --no-probe runs the static checks only.")
    ] = True,
    tokenizer: Annotated[
        str | None,
        typer.Option(help="Tokenizer (its chat template) for --url when the server's is not local."),
    ] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda (in process).")] = "cpu",
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16 (in process).")] = "auto",
    threads: Annotated[int | None, typer.Option(help="CPU threads for torch (default 1).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Check a target/drafter pair (vocabulary, hidden size, target layers, RoPE, mask token, block size,
    pairing, chat template), probe tau per prompt group and the acceptance at each draft depth, and print
    ranked findings with evidence and a fix. Exits 1 when a finding is an error."""
    from specdeploy.doctor.diagnose import diagnose, local_subject, render_text, server_subject
    from specdeploy.errors import SpecdeployError
    from specdeploy.recipes.loader import load_recipe

    if mode not in ("dflash", "ddtree"):
        raise SpecdeployError(f"--mode {mode} has no drafter to diagnose: use dflash or ddtree")
    if max_new_tokens < 8:
        raise SpecdeployError(
            f"--max-new-tokens {max_new_tokens} is too few to measure acceptance: use 8 or more"
        )
    pair_recipe = load_recipe(recipe) if recipe is not None else None
    if url is not None:
        subject = server_subject(url, target, draft, pair_recipe)
    else:
        subject = local_subject(target, draft, pair_recipe, mode, budget)
    diagnosis = diagnose(subject, mode, budget, max_new_tokens, probe, tokenizer, device, dtype, threads)
    typer.echo(json.dumps(diagnosis.as_json()) if as_json else render_text(diagnosis))
    if any(f.severity == "error" for f in diagnosis.findings):
        raise typer.Exit(1)
