"""`specdeploy demo`: option parsing and presentation only."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from specdeploy.errors import SpecdeployError
from specdeploy.zoo.prompts import DEMO_PROMPTS

# Measured on an idle 2-core CPU (alternating runs): DDTree 8 gave 1.61-1.73x AR, 16 gave 1.40-1.55x; the
# verify of 17 tokens costs more here than its extra accepted tokens (tau 4.46 against 3.97) win back.
DEFAULT_BUDGET = 8


def demo(
    pair: Annotated[str, typer.Option(help="Zoo pair to run.")] = "tiny-code",
    budget: Annotated[int, typer.Option(help="DDTree node budget.")] = DEFAULT_BUDGET,
    max_new_tokens: Annotated[int, typer.Option(help="New tokens per prompt.")] = 128,
    prompts: Annotated[
        int,
        typer.Option(
            "--num-prompts",
            "--prompts",
            help=f"Built-in prompts to use (1-{len(DEMO_PROMPTS)}), as bench's --num-prompts "
            "(--prompts: the old name).",
        ),
    ] = len(DEMO_PROMPTS),
    repeats: Annotated[
        int, typer.Option(help="Repeats of every bench cell (the speedup's CI resamples them).")
    ] = 2,
    out: Annotated[Path | None, typer.Option(help="Run directory (default runs/demo-<UTC time>).")] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="Only the engine in-process: no servers, bench or report.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object (rows per mode, report path).")
    ] = False,
) -> None:
    """Serve a shipped zoo pair on this CPU (AR, DFlash and DDTree reference servers), bench each mode
    against AR on built-in code prompts, write a run directory with report.html, and print the table."""
    if not 1 <= prompts <= len(DEMO_PROMPTS):
        raise SpecdeployError(f"--num-prompts must be between 1 and {len(DEMO_PROMPTS)}, got {prompts}")
    if repeats < 1 or budget < 1 or max_new_tokens < 1:
        raise SpecdeployError("--repeats, --budget and --max-new-tokens must be at least 1")
    console = Console(stderr=as_json)  # with --json, stdout holds the JSON object only
    if quick:
        if as_json:
            raise SpecdeployError(
                "--quick prints a table only: drop --json, or drop --quick for the JSON object"
            )
        from specdeploy.demo.quick import run_quick

        run_quick(pair, budget, max_new_tokens, prompts, console)
        return
    from specdeploy.demo.flow import DemoOptions, run_demo
    from specdeploy.demo.summary import document, mode_rows, table

    options = DemoOptions(
        pair=pair,
        budget=budget,
        max_new_tokens=max_new_tokens,
        prompts=prompts,
        repeats=repeats,
        out=out or Path("runs") / f"demo-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}",
    )
    run = run_demo(
        options, lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True), console
    )
    rows = mode_rows(run)
    if as_json:
        typer.echo(json.dumps(document(rows, run, options), indent=2))
        return
    console.print(table(rows, options))
    console.print(f"report: {run.report}", markup=False, highlight=False, soft_wrap=True)
