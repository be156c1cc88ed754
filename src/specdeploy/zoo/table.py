"""The mode comparison table (tau, tokens/s, speedup over AR, output match at temperature 0)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rich.table import Table

from specdeploy.terminal_tables import add_columns, narrow_table
from specdeploy.zoo.measure import ModeResult


@dataclass(frozen=True)
class ModeRow:
    label: str
    tau: float
    tokens_per_s: float
    speedup: float | None  # over the AR row; None where there is no AR baseline
    matched: int | None  # prompts whose output equals AR's; None for AR itself
    prompts: int


def mode_rows(results: list[ModeResult]) -> list[ModeRow]:
    """Rows relative to the `ar` result (the baseline), if there is one."""
    baseline = next((r for r in results if r.spec.mode == "ar"), None)
    rows = []
    for result in results:
        is_baseline = result is baseline
        rows.append(
            ModeRow(
                label=result.spec.label,
                tau=result.tau,
                tokens_per_s=result.tokens_per_s,
                speedup=result.tokens_per_s / baseline.tokens_per_s
                if baseline and baseline.tokens_per_s
                else None,
                matched=None if baseline is None or is_baseline else result.matches(baseline),
                prompts=len(result.results),
            )
        )
    return rows


def mode_table(rows: list[ModeRow], title: str) -> Table:
    table = narrow_table(title)
    add_columns(table, ("mode", "tau", "tokens/s", "speedup vs ar", "same output as ar (T=0)"), ("mode",))
    for row in rows:
        table.add_row(
            row.label,
            f"{row.tau:.2f}",
            f"{row.tokens_per_s:.1f}",
            f"{row.speedup:.2f}x" if row.speedup is not None else "-",
            "baseline" if row.matched is None else f"{row.matched}/{row.prompts}",
        )
    return table


@dataclass(frozen=True)
class MeasuredTau:
    """The tau a card's acceptance table records: DFlash's, and DDTree's best over the budgets measured."""

    dflash: float | None
    ddtree: float | None
    ddtree_budget: int | None


_CARD_ROW = re.compile(r"^\| (dflash|ddtree \(budget (\d+)\)) \| (\d+(?:\.\d+)?) \|", re.MULTILINE)


def measured_tau(card: str) -> MeasuredTau:
    """The tau rows of the table `markdown_table` wrote into a card; None where the card has none."""
    dflash, ddtree = None, []
    for label, budget, tau in _CARD_ROW.findall(card):
        if label == "dflash":
            dflash = float(tau)
        else:
            ddtree.append((float(tau), int(budget)))
    best = max(ddtree, default=(None, None))
    return MeasuredTau(dflash, best[0], best[1])


def markdown_table(rows: list[ModeRow]) -> str:
    lines = [
        "| mode | tau | tokens/s (CPU) | speedup vs ar | same output as ar (T=0) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        speedup = f"{row.speedup:.2f}x" if row.speedup is not None else "-"
        matched = "baseline" if row.matched is None else f"{row.matched}/{row.prompts}"
        lines.append(f"| {row.label} | {row.tau:.2f} | {row.tokens_per_s:.1f} | {speedup} | {matched} |")
    return "\n".join(lines)
