"""`specdeploy campaign FILE.toml`: option parsing and presentation only."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.tree import Tree

from specdeploy.bench.display import cell_progress
from specdeploy.campaign.matrix import CampaignServer, bench_runs, server_configs
from specdeploy.campaign.runner import DeployControl, check_datasets, default_launcher, run_campaign
from specdeploy.campaign.spec import CampaignSpec, load_campaign
from specdeploy.campaign.state import CampaignState
from specdeploy.deploy.launchers import get_launcher
from specdeploy.deploy.orphans import orphan_watch
from specdeploy.deploy.plan_options import UPDATE_LOCK_HELP
from specdeploy.errors import SpecdeployError
from specdeploy.interrupts import sigterm_as_interrupt
from specdeploy.lock.resolve import current_lock
from specdeploy.terminal_tables import add_columns, narrow_table


def plan_tree(spec: CampaignSpec, servers: list[CampaignServer], out: Path, launcher: str) -> Tree:
    """The ordered server starts and, under each, its runs and cells (finished ones marked done)."""
    total = sum(len(run.cells()) for server in servers for run in bench_runs(spec, server, out))
    tree = Tree(
        f"campaign {spec.name}: {len(servers) * spec.rounds} server starts ({launcher} launcher), {total} cells, "
        "run directories inside the campaign directory:"
    )
    starts = [(round_, server) for round_ in range(spec.rounds) for server in servers]
    for index, (round_, server) in enumerate(starts, 1):
        in_round = f" (round {round_ + 1} of {spec.rounds})" if spec.rounds > 1 else ""
        branch = tree.add(f"{index}. start {server.id}{in_round}: {server.plan.summary}")
        for run in bench_runs(spec, server, out):
            cells = [key for key in run.cells() if key.repeat in run.round_repeats(round_)]
            done = len(cells) - len(run.missing_cells(round_))
            loads = dict.fromkeys(
                f"c={key.concurrency}" if key.request_rate is None else f"{key.request_rate:g}req/s"
                for key in cells
            )
            # Paths relative to `out` (named once, above): whole paths would wrap mid-word at 80 columns.
            baseline = (
                f", paired with {_below(Path(run.config.baseline_run), out)}"
                if run.config.baseline_run
                else ""
            )
            branch.add(
                f"{run.label}: {' '.join(loads)} x {spec.repeats} repeat(s), {done}/{len(cells)} cells done "
                f"-> {_below(run.path, out)}{baseline}"
            )
        branch.add("stop")
    return tree


def _below(path: Path, out: Path) -> str:
    """`path` relative to the campaign directory where it lies inside it (run paths are absolute or not)."""
    for root in (out, out.resolve()):
        if path.is_relative_to(root):
            return str(path.relative_to(root))
    return str(path)


def state_table(state: CampaignState) -> Table:
    table = narrow_table(f"campaign {state.name}")
    headers = ("server", "status", "starts", "deaths", "failed cells", "error")
    add_columns(table, headers, ("server", "status", "failed cells", "error"), ("failed cells", "error"))
    for server_id, server in state.servers.items():
        table.add_row(
            server_id,
            server.status,
            str(len(server.starts)),
            str(len(server.deaths)),
            ", ".join(server.failed_cells) or "-",
            server.error or "-",
        )
    return table


def campaign(
    file: Annotated[Path, typer.Argument(help="Campaign TOML (see examples/).")],
    out: Annotated[
        Path | None, typer.Option(help="Campaign directory (default runs/campaign-<name>-<UTC time>).")
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the campaign in --out: only missing cells run.")
    ] = False,
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", help="With --resume: also rerun configurations that failed.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the ordered server starts and cells; start nothing.")
    ] = False,
    update_lock: Annotated[bool, typer.Option("--update-lock", help=UPDATE_LOCK_HELP)] = False,
) -> None:
    """Run a benchmark matrix: each server configuration starts once, AR first; resumable.

    Uses the campaign's lock file (`specdeploy lock FILE`) when there is one and refuses one that drifted."""
    spec = load_campaign(file)
    lock = current_lock(str(file), update_lock)
    if resume and out is None:
        raise SpecdeployError("--resume needs --out: the campaign directory to continue")
    if retry_failed and not resume:
        raise SpecdeployError("--retry-failed goes with --resume")
    out = out or Path("runs") / f"campaign-{spec.name}-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
    console = Console()
    servers = server_configs(spec, lock)
    launcher = default_launcher(spec, servers[0].plan)
    for server in servers:  # a launcher that cannot run these plans fails now, not at the first start
        get_launcher(launcher).command(server.plan, out / "servers" / server.id)
    if dry_run:
        # Long paths and URLs on lines of their own, unwrapped, so that they stay whole for copying.
        console.print(f"campaign directory: {out}", soft_wrap=True, markup=False, highlight=False)
        console.print(plan_tree(spec, servers, out, launcher))
        for line in check_datasets(spec, servers, out, download=False):
            console.print(f"warning: {line}", style="yellow", soft_wrap=True, markup=False, highlight=False)
        return
    resume_command = f"specdeploy campaign {file} --out {out} --resume"
    # A campaign stopped by SIGTERM stops its server too (the server runs in its own process group); one
    # killed outright has its servers stopped by the watchdog (deploy/orphans.py).
    try:
        with orphan_watch() as owner, sigterm_as_interrupt(), cell_progress(console) as progress:
            control = DeployControl(
                launcher, spec.health_timeout_s, spec.smoke, out / "servers", Console(stderr=True), owner
            )
            state = run_campaign(
                spec,
                out,
                control,
                resume=resume,
                retry_failed=retry_failed,
                log=console.print,
                progress=progress,
                lock=lock,
            )
    except KeyboardInterrupt:
        typer.echo(
            f"campaign interrupted; its finished cells are kept: continue with `{resume_command}`", err=True
        )
        raise typer.Exit(130) from None
    console.print(state_table(state))
    failed = [
        server_id for server_id, server in state.servers.items() if server.status in ("failed", "blocked")
    ]
    if failed:
        raise SpecdeployError(
            f"{len(failed)} server configuration(s) did not finish ({', '.join(failed)}); see {out}/state.json, "
            f"then `specdeploy campaign {file} --out {out} --resume --retry-failed`"
        )
    console.print(f"results in {out}; `specdeploy report {out}` summarises them")
