"""`specdeploy up | down | status | logs`: thin wrappers over deploy_up / deploy_down and the run directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from specdeploy.deploy.deployment import (
    DEFAULT_HEALTH_TIMEOUT_S,
    DEFAULT_STOP_GRACE_S,
    deploy_down,
    deploy_up,
    deployment_status,
    load_deployment,
    preview_up,
)
from specdeploy.deploy.hardware import DetectedHardware, detect_hardware, profile_for
from specdeploy.deploy.health import ServerStartError
from specdeploy.deploy.image_build import build_image
from specdeploy.deploy.launchers import LAUNCHERS, get_launcher
from specdeploy.deploy.manifest import DEFAULT_RUNS_ROOT, default_run_dir, find_run_dir, image_id
from specdeploy.deploy.plan_options import UPDATE_LOCK_HELP, PlanOverrides, plan_with, with_plan_options
from specdeploy.deploy.render import (
    preflight_table,
    print_deployment,
    print_plan_summary,
    print_preview,
    print_smoke,
    print_status,
)
from specdeploy.deploy.sglang_check import startup_check
from specdeploy.errors import SpecdeployError
from specdeploy.plan.launch_plan import LaunchPlan
from specdeploy.recipes.loader import list_hardware, load_hardware, load_recipe
from specdeploy.recipes.schema import HardwareProfile

RunDirArgument = Annotated[
    Path | None, typer.Argument(help="Run directory of the deployment (default: the newest `up`).")
]


def _plan_for(
    recipe: str, hardware: str, overrides: PlanOverrides
) -> tuple[LaunchPlan, HardwareProfile, DetectedHardware | None]:
    """`plan`'s plan for these options (under the recipe's lock, if any), its profile, and the detected
    hardware when `auto` had to look."""
    detected = None
    if hardware == "auto":
        detected = detect_hardware()
        profile = profile_for(detected, list_hardware())
    else:
        profile = load_hardware(hardware)
    try:
        return plan_with(recipe, profile, overrides), profile, detected
    except SpecdeployError as exc:
        if detected is None or detected.gpus:
            raise
        raise SpecdeployError(
            f"--hardware auto found no GPU ({detected.problem}), so it planned for CPU: {exc}"
        ) from exc


@with_plan_options
def up(
    recipe: Annotated[str, typer.Argument(help="Recipe name (`kimi-k2.6`) or a recipe .toml file.")],
    hardware: Annotated[str, typer.Option(help="`auto` (detect the GPUs) or a hardware profile.")] = "auto",
    launcher: Annotated[
        str | None,
        typer.Option(help=f"{', '.join(LAUNCHERS)} (default: reference for CPU plans, docker otherwise)."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Plan and preflight only; launch nothing.")
    ] = False,
    run_dir: Annotated[
        Path | None, typer.Option(help="Run directory (default: runs/<time>-<recipe>-<mode>).")
    ] = None,
    health_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for the server.")
    ] = DEFAULT_HEALTH_TIMEOUT_S,
    smoke: Annotated[bool, typer.Option(help="Send a few prompts once healthy.")] = True,
    overrides: PlanOverrides = PlanOverrides(),
) -> None:
    """Preflight, download the weights, launch, wait for health, smoke-test and record a deployment.

    Uses the recipe's lock file when there is one; a DDTree image is built once per host and reused."""
    console = Console()
    plan, profile, detected = _plan_for(recipe, hardware, overrides)
    check = startup_check(load_recipe(recipe), profile) if plan.engine.name == "sglang" else None
    chosen = launcher or ("reference" if plan.engine.name == "reference" else "docker")
    if chosen not in LAUNCHERS:
        raise SpecdeployError(f"unknown launcher {chosen!r}: use one of {', '.join(LAUNCHERS)}")
    run_dir = run_dir or default_run_dir(plan, DEFAULT_RUNS_ROOT)
    if dry_run:
        preview = preview_up(plan, chosen, run_dir, hardware=detected, startup_check=check)
        print_preview(console, plan, preview)
        failed = [check.name for check in preview.preflight.failures]
        if failed:
            raise SpecdeployError(
                f"preflight: {len(failed)} check(s) failed ({', '.join(failed)}); see the table above"
            )
        return
    print_plan_summary(console, plan)
    try:
        deployment = deploy_up(
            plan,
            chosen,
            run_dir,
            hardware=detected,
            health_timeout_s=health_timeout,
            smoke=smoke,
            show_preflight=lambda report: console.print(preflight_table(report)),
            startup_check=check,
        )
    except ServerStartError as exc:
        # The CLI prints errors on one line: show the log tail first, as it was written.
        Console(stderr=True).print("\n".join(exc.log_tail), markup=False, highlight=False)
        raise SpecdeployError(
            f"{exc.reason}; the server log's last lines are above (all of it in {run_dir})"
        ) from exc
    print_smoke(console, deployment.manifest.smoke if deployment.manifest else None)
    print_deployment(console, deployment)


def down(
    run_dir: RunDirArgument = None,
    grace: Annotated[float, typer.Option(help="Seconds between SIGTERM and SIGKILL.")] = DEFAULT_STOP_GRACE_S,
) -> None:
    """Stop a deployment (SIGTERM, then SIGKILL after the grace period) and mark its run directory stopped."""
    deployment = load_deployment(find_run_dir(run_dir))
    if deployment.record.state == "stopped":
        typer.echo(f"{deployment.run_dir}: already stopped")
        return
    deploy_down(deployment, grace)
    typer.echo(f"{deployment.run_dir}: stopped")


def status(
    run_dir: RunDirArgument = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Recorded state of a deployment, and whether its server is alive and healthy now."""
    report = deployment_status(load_deployment(find_run_dir(run_dir)))
    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    print_status(Console(), report)


def logs(
    run_dir: RunDirArgument = None,
    lines: Annotated[int, typer.Option("-n", "--lines", min=1, help="How many of the last lines.")] = 100,
) -> None:
    """The last lines of the deployment's server log (docker logs for containers that still exist)."""
    handle = load_deployment(find_run_dir(run_dir)).handle
    typer.echo("\n".join(get_launcher(handle.launcher).tail(handle, lines)))


image_app = typer.Typer(no_args_is_help=True, help="Images specdeploy builds itself (the DDTree build).")


@image_app.command("build")
def image_build(
    recipe: Annotated[str, typer.Argument(help="Recipe name or .toml: its lock pins the build.")],
    update_lock: Annotated[bool, typer.Option("--update-lock", help=UPDATE_LOCK_HELP)] = False,
    force: Annotated[bool, typer.Option("--force", help="Build even when this host has the tag.")] = False,
) -> None:
    """Build the DDTree image (SGLang PR at its commit, locked pip pins) once; the tag is its content hash."""
    from specdeploy.lock.resolve import current_lock
    from specdeploy.plan.engines import sglang_ddtree_build

    engine = sglang_ddtree_build(current_lock(recipe, update_lock))
    built = build_image(engine, force=force)
    where = image_id(str(engine.image))
    typer.echo(f"{engine.image} {'built' if built else 'already on this host'} (image id {where})")


def register(app: typer.Typer) -> None:
    for command in (up, down, status, logs):
        app.command(command.__name__)(command)
    app.add_typer(image_app, name="image")
