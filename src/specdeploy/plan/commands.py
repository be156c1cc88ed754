"""`specdeploy plan` and `specdeploy recipes`: thin wrappers over make_plan, the renderers and the loader."""

from __future__ import annotations

from typing import Annotated

import typer

from specdeploy.api_key import API_KEY_ENV
from specdeploy.plan.make import make_plan
from specdeploy.plan.render import RENDERERS, render_plan
from specdeploy.recipes.loader import list_hardware, list_recipes, load_hardware
from specdeploy.recipes.schema import HardwareProfile

AUTO = "auto"
API_KEY_HELP = f"Require an API key: the server reads it from ${API_KEY_ENV} at launch (written nowhere)."
UPDATE_LOCK_HELP = "Re-resolve the lock file (Hub, registry, image) before planning, moving its pins."


def resolve_hardware(name_or_path: str) -> HardwareProfile:
    """A profile name or file, or `auto`: the shipped profile matching this machine's GPUs."""
    if name_or_path != AUTO:
        return load_hardware(name_or_path)
    from specdeploy.deploy.hardware import detect_hardware, profile_for

    return profile_for(detect_hardware(), list_hardware())


def plan(
    recipe: Annotated[str, typer.Argument(help="Recipe name (`kimi-k2.6`) or a recipe .toml file.")],
    hardware: Annotated[
        str, typer.Option(help="Hardware profile (`specdeploy recipes` lists them), a .toml file, or auto.")
    ],
    mode: Annotated[str, typer.Option(help="ar, dflash, ddtree or eagle3.")] = "dflash",
    budget: Annotated[int | None, typer.Option(help="DDTree tree nodes per step (ddtree only).")] = None,
    tp: Annotated[int | None, typer.Option(help="Tensor-parallel size (default: chosen to fit).")] = None,
    context_length: Annotated[int | None, typer.Option(help="Longest request, in tokens.")] = None,
    max_running_requests: Annotated[
        int | None, typer.Option(help="Concurrent requests the server runs.")
    ] = None,
    nnodes: Annotated[int, typer.Option(help="Nodes of this profile that serve together.")] = 1,
    attention_backend: Annotated[
        str | None, typer.Option(help="Override the target's attention backend.")
    ] = None,
    port: Annotated[int, typer.Option(help="HTTP port of the server.")] = 30000,
    fmt: Annotated[str, typer.Option("--format", help=" | ".join(RENDERERS))] = "text",
    api_key: Annotated[bool, typer.Option("--api-key", help=API_KEY_HELP)] = False,
    update_lock: Annotated[bool, typer.Option("--update-lock", help=UPDATE_LOCK_HELP)] = False,
) -> None:
    """Show what would run on this hardware and why: argv, env, image, memory, warnings. Launches nothing.

    Uses the recipe's lock file when there is one (`specdeploy lock`) and refuses one that drifted."""
    # Resolving reaches the Hub and the registry, so it lives above plan; reading a lock does not.
    from specdeploy.lock.resolve import current_lock

    launch_plan = make_plan(
        recipe,
        resolve_hardware(hardware),
        mode,
        budget=budget,
        tp=tp,
        context_length=context_length,
        max_running_requests=max_running_requests,
        nnodes=nnodes,
        attention_backend=attention_backend,
        port=port,
        lock=current_lock(recipe, update_lock),
        api_key=api_key,
    )
    typer.echo(render_plan(launch_plan, fmt), nl=False)


def recipes() -> None:
    """List the shipped model pairs and hardware profiles."""
    typer.echo("Model pairs (specdeploy plan RECIPE ...)")
    for recipe in list_recipes():
        modes = "ar, dflash, ddtree" + (", eagle3" if recipe.eagle3 else "")
        typer.echo(f"  {recipe.name:<14} {recipe.description}")
        typer.echo(f"  {'':<14} target {recipe.target.path}, drafter {recipe.dflash.path}; modes: {modes}")
    typer.echo("\nHardware profiles (--hardware PROFILE, or auto to detect)")
    for profile in list_hardware():
        typer.echo(f"  {profile.name:<16} {profile.description}")


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
    app.command("recipes")(recipes)
