"""`specdeploy zoo list` and `specdeploy zoo eval` (`zoo train` lives in zoo/train.py)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console

from specdeploy.terminal_tables import add_columns, narrow_table
from specdeploy.zoo.registry import get_pair, zoo_pairs

EVAL_BUDGETS = (16, 32)  # the demo's default budget and the one the zoo's quality bar names


def list_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object per pair.")] = False,
) -> None:
    """Show the zoo's pairs: family, parameters, size on disk and the tau their cards record (`-`: none).

    --json adds the block size and the card's summary."""
    rows = []
    for pair in zoo_pairs():
        log = pair.train_log()
        tau = pair.measured_tau()
        rows.append(
            {
                "name": pair.name,
                "model": f"zoo:{pair.name}",
                "draft": f"zoo:{pair.name}-draft",
                "family": pair.spec.family,
                "target_parameters": log.get("target_parameters"),
                "draft_parameters": log.get("draft_parameters"),
                "block_size": pair.spec.block_size,
                "size_bytes": pair.size_bytes() if pair.directory.exists() else 0,
                "shipped": pair.shipped,
                "summary": pair.card_summary(),
                "tau_dflash": tau.dflash,
                "tau_ddtree": tau.ddtree,
                "ddtree_budget": tau.ddtree_budget,
            }
        )
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row))
        return
    table = narrow_table(
        "specdeploy zoo (tau: as the pair's card records it, on its held-out prompts; ddtree at the budget "
        "shown; `specdeploy zoo eval NAME` measures it again)"
    )
    add_columns(
        table,
        ("name", "family", "target", "drafter", "on disk", "dflash tau", "ddtree tau"),
        ("name", "family"),
    )
    for row in rows:
        budget = f" (b{row['ddtree_budget']})" if row["tau_ddtree"] is not None else ""
        table.add_row(
            row["name"],
            row["family"],
            _millions(row["target_parameters"]),
            _millions(row["draft_parameters"]),
            f"{row['size_bytes'] / 1e6:.1f} MB" if row["shipped"] else "not trained",
            _tau(row["tau_dflash"]),
            _tau(row["tau_ddtree"]) + budget,
        )
    Console().print(table)


def eval_command(
    name: Annotated[str, typer.Argument(help="Zoo pair, e.g. tiny-code.")],
    prompts: Annotated[int, typer.Option("--prompts", help="Held-out prompts to decode.")] = 8,
    max_new_tokens: Annotated[int, typer.Option(help="New tokens per prompt.")] = 128,
    budgets: list[int] = typer.Option(
        list(EVAL_BUDGETS), "--budget", help="DDTree node budget (repeat the option for several)."
    ),
    write_card: Annotated[bool, typer.Option("--write-card", help="Rewrite the pair's card.md.")] = False,
) -> None:
    """Measure tau and tokens/s per mode (ar, dflash, ddtree) on held-out prompts with the reference engine."""
    from specdeploy.zoo import evaluate
    from specdeploy.zoo.table import mode_table

    if not evaluate.engine_can_run(name):
        typer.echo(f"{name}: {get_pair(name).spec.engine_support}; nothing to measure")
        if write_card:
            evaluate.write_card(name, None)  # the card then says why it has no tau
        return
    evaluation = evaluate.evaluate_pair(name, tuple(budgets), prompts, max_new_tokens, say=typer.echo)
    Console().print(mode_table(evaluation.rows, f"{name}: {prompts} held-out prompts, greedy"))
    if write_card:
        evaluate.write_card(name, evaluation)


def _tau(tau: float | None) -> str:
    return "-" if tau is None else f"{tau:.2f}"


def _millions(count: int | None) -> str:
    return f"{count / 1e6:.2f}M" if count else "-"
