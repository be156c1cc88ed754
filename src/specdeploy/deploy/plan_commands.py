"""`specdeploy plan` and `specdeploy recipes`: thin wrappers over make_plan, the renderers and the loader.

They live in deploy, not plan, because `--hardware auto` detects this machine's GPUs (deploy's job) and hands
plan a profile: plan itself stays pure."""

from __future__ import annotations

import shutil
from typing import Annotated

import typer

from specdeploy.deploy import hardware as detection
from specdeploy.deploy.plan_options import PlanOverrides, plan_with, with_plan_options
from specdeploy.plan.render import RENDERERS, render_plan
from specdeploy.plan.render.text import WIDTH
from specdeploy.recipes.loader import list_hardware, list_recipes, load_hardware, load_recipe
from specdeploy.recipes.schema import HardwareProfile

AUTO = "auto"
CHECK_HELP = (
    "Also run SGLang 0.5.23's own start-up resolution and validation on the plan's argv, on this CPU, with the "
    "profile's GPUs and the recipe's model configs; print its verdict on stderr, exit 1 when it refuses."
)


def resolve_hardware(name_or_path: str) -> HardwareProfile:
    """A profile name or file, or `auto`: the shipped profile matching this machine's GPUs."""
    if name_or_path != AUTO:
        return load_hardware(name_or_path)
    return detection.profile_for(detection.detect_hardware(), list_hardware())


@with_plan_options
def plan(
    recipe: Annotated[str, typer.Argument(help="Recipe name (`kimi-k2.6`) or a recipe .toml file.")],
    hardware: Annotated[
        str, typer.Option(help="Hardware profile (`specdeploy recipes` lists them), a .toml file, or auto.")
    ],
    overrides: PlanOverrides,
    fmt: Annotated[str, typer.Option("--format", help=f"Output format: {' | '.join(RENDERERS)}.")] = "text",
    check: Annotated[bool, typer.Option("--check", help=CHECK_HELP)] = False,
) -> None:
    """Show what would run on this hardware and why: argv, env, image, memory, warnings. Launches nothing.

    Uses the recipe's lock file when there is one (`specdeploy lock`) and refuses one that drifted."""
    profile = resolve_hardware(hardware)
    launch_plan = plan_with(recipe, profile, overrides)
    # COLUMNS or the terminal's width, at most the renderer's own; 100 where output goes to a pipe or file.
    width = min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns)
    typer.echo(render_plan(launch_plan, fmt, width), nl=False)
    if check:
        from specdeploy.deploy.sglang_check import (  # a child process: only when asked
            check_plan,
            verdict_line,
        )

        verdict = check_plan(launch_plan, load_recipe(recipe), profile)
        typer.echo(verdict_line(launch_plan, verdict), err=True)
        if not verdict.accepted:
            raise typer.Exit(1)


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
