"""Terminal output of the deploy commands: preflight tables, the dry-run summary, deployment status."""

from __future__ import annotations

import shlex

from rich.console import Console
from rich.table import Table

from specdeploy.deploy.deployment import Deployment, UpPreview
from specdeploy.deploy.preflight import PreflightReport, Status
from specdeploy.deploy.smoke import SmokeReport
from specdeploy.plan.launch_plan import LaunchPlan

_STATUS_STYLE = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red"}


def preflight_table(report: PreflightReport) -> Table:
    table = Table(title="preflight", show_header=False, box=None, pad_edge=False)
    for check in report.checks:
        style = _STATUS_STYLE[check.status]
        table.add_row(f"[{style}]{check.status.value}[/]", check.name, check.message)
    return table


def print_plan_summary(console: Console, plan: LaunchPlan) -> None:
    engine = plan.engine
    where = f"image {engine.image}" if engine.image else f"from {engine.source}"
    budget = f", budget {plan.budget}" if plan.budget is not None else ""
    console.print(
        f"plan: [bold]{plan.recipe}[/] on {plan.hardware}, mode {plan.mode}{budget}, TP {plan.tp}; "
        f"engine {engine.name} {engine.version} ({where})"
    )
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/] {warning}")


def print_preview(console: Console, plan: LaunchPlan, preview: UpPreview) -> None:
    print_plan_summary(console, plan)
    console.print(preflight_table(preview.preflight))
    if preview.downloads:
        console.print("would download (resumable, into the Hugging Face cache):")
        for download in preview.downloads:
            console.print(f"  {download}", markup=False)
    console.print(f"would launch (run directory {preview.run_dir}):")
    console.print(f"  {shlex.join(preview.command)}", markup=False, soft_wrap=True)
    console.print("dry run: nothing was downloaded or launched")


def print_smoke(console: Console, smoke: SmokeReport | None) -> None:
    if smoke is None:
        return
    tau = "n/a (no speculation reported)" if smoke.tau is None else f"{smoke.tau:.2f} tokens/step"
    latency = sum(result.latency_s for result in smoke.results)
    console.print(f"smoke test: {len(smoke.results)} prompts in {latency:.1f} s, acceptance length {tau}")
    for warning in smoke.warnings:
        console.print(f"[yellow]warning:[/] {warning}")


def print_deployment(console: Console, deployment: Deployment) -> None:
    handle = deployment.handle
    process = f"pid {handle.process.pid}" if handle.process else f"container {handle.container_name}"
    console.print(f"[green]up[/]: {deployment.url} ({handle.launcher}, {process})")
    console.print(
        f"run directory {deployment.run_dir}: manifest.json, server.log; stop with `specdeploy down`"
    )


def print_status(console: Console, status: dict) -> None:
    health = "healthy" if status["healthy"] else ("alive, not healthy" if status["alive"] else "not running")
    console.print(
        f"{status['run_dir']}: {status['recipe']} {status['mode']}, recorded {status['state']}, now {health}"
    )
    launcher = status["launcher"]
    process = (
        f"pid {launcher['process']['pid']}"
        if launcher["process"]
        else f"container {launcher['container_name']}"
    )
    console.print(f"  {status['url']} ({launcher['launcher']}, {process}), updated {status['updated_at']}")
    if status["error"]:
        console.print(f"  error: {status['error'].splitlines()[0]}", markup=False)
