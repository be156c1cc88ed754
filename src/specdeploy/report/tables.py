"""Rich tables of a report for the terminal."""

from __future__ import annotations

from rich.table import Table

from specdeploy.report.columns import COLUMNS, side_by_side
from specdeploy.report.rows import ReportRow
from specdeploy.report.runs import Series

LEFT_ALIGNED = {"series", "dataset", "mode", "load"}


def series_table(series: list[Series]) -> Table:
    table = Table(title="runs")
    for column in ("series", "recipe", "hardware", "interconnect", "GPUs", "engine", "run directories"):
        table.add_column(column)
    for s in series:
        table.add_row(
            s.label,
            s.fact("recipe"),
            s.fact("hardware"),
            s.fact("interconnect"),
            s.gpu,
            s.fact("engine"),
            str(len(s.runs)),
        )
    return table


def rows_table(rows: list[ReportRow]) -> Table:
    table = Table(title="results per load point (repeats pooled; speedup against the paired AR run)")
    for header, _ in COLUMNS:
        table.add_column(header, justify="left" if header in LEFT_ALIGNED else "right")
    for row in rows:
        table.add_row(*(cell(row) for _, cell in COLUMNS))
    return table


def comparison_table(rows: list[ReportRow], series: list[Series]) -> Table:
    header, body = side_by_side(rows, [s.label for s in series])
    table = Table(title="side by side")
    for column in header:
        table.add_column(column, justify="left" if column in LEFT_ALIGNED else "right")
    for cells in body:
        table.add_row(*cells)
    return table
