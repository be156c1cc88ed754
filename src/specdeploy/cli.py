"""The specdeploy command line: one Typer app; each command is a thin call into a module."""

from __future__ import annotations

import sys

import typer

from specdeploy import generate as generate_command
from specdeploy.bench import commands as bench_commands
from specdeploy.campaign import commands as campaign_commands
from specdeploy.demo import command as demo_command
from specdeploy.deploy import commands as deploy_commands
from specdeploy.deploy import plan_commands
from specdeploy.deploy.orphans import reap_orphans
from specdeploy.doctor import command as doctor_command
from specdeploy.errors import SpecdeployError
from specdeploy.lab import commands as lab_commands
from specdeploy.lock import commands as lock_commands
from specdeploy.perf import commands as perf_commands
from specdeploy.projection import commands as projection_commands
from specdeploy.report import commands as report_commands
from specdeploy.server import commands as server_commands
from specdeploy.zoo import cli as zoo_cli

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help=__doc__,
    pretty_exceptions_show_locals=False,
    # Click's plain help: Rich's panels cut long option names ("--chat-template-k…") at 80 columns.
    rich_markup_mode=None,
)


def fail(message: str) -> None:
    """Print a one-line error and exit with status 2 (the convention for usage errors)."""
    typer.echo(f"error: {message}", err=True)
    sys.exit(2)


def main() -> None:
    try:
        reap_orphans(lambda line: typer.echo(line, err=True))  # servers of a killed campaign or demo
        app()
    except SpecdeployError as exc:
        fail(" ".join(str(exc).split()))


@app.callback()
def _root() -> None:
    """Deploy and benchmark speculative decoding (DFlash, DDTree) reproducibly."""


app.command("generate")(generate_command.generate)
app.command("profile")(perf_commands.profile)
app.command("random-weights")(perf_commands.random_weights)
app.command("serve")(server_commands.serve)
app.command("load")(bench_commands.load)
app.add_typer(zoo_cli.app, name="zoo")
app.add_typer(lab_commands.app, name="lab")
app.command("demo")(demo_command.demo)
deploy_commands.register(app)  # up, down, status, logs, image build
plan_commands.register(app)  # plan, recipes
app.command("lock")(lock_commands.lock)
app.command("bench")(bench_commands.bench)
app.command("bench-selftest")(bench_commands.bench_selftest)
app.command("campaign")(campaign_commands.campaign)
app.command("report")(report_commands.report)
projection_commands.register(app)  # project, recommend
app.command("doctor")(doctor_command.doctor)


if __name__ == "__main__":
    sys.exit(main())
