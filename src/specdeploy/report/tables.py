"""Rich tables of a report for the terminal: the key columns, legible at 80 columns.

The HTML page and `report --json` carry every column (recipe, interconnect, GPUs, latencies, errors, ...)."""

from __future__ import annotations

from string import ascii_uppercase

from rich.table import Table

from specdeploy.bench.runs import Series
from specdeploy.report.columns import chosen_text, percent, speedup_text
from specdeploy.report.rows import ReportRow
from specdeploy.terminal_tables import add_columns, narrow_table, num

SERIES_PER_COMPARISON = 2  # series side by side in one terminal table


def series_table(series: list[Series]) -> Table:
    table = narrow_table("runs")
    add_columns(
        table, ("series", "hardware", "engine", "runs"), ("series", "hardware", "engine"), ("series",)
    )
    for s in series:
        table.add_row(s.label, s.fact("hardware"), s.fact("engine"), str(len(s.runs)))
    return table


def rows_tables(rows: list[ReportRow], series: list[Series]) -> list[Table]:
    """One table per series: tokens/s, tau and the speedup against the paired AR run, per load point; with an
    adaptive budget, the budget it chose (mean over the verify steps, share of AR steps)."""
    adaptive = any(row.budget_chosen_mean is not None for row in rows)
    tables = []
    for s in series:
        table = narrow_table(
            f"{s.label}: per load point (repeats pooled, tok/s ± half their range; speedup against the paired AR run)"
        )
        headers = ("dataset", "mode", "load", "tok/s", "tau", *(("budget chosen",) if adaptive else ()))
        add_columns(table, (*headers, "speedup [95% CI]", "match"), ("dataset", "mode", "load"))
        for row in rows:
            if row.series == s.label:
                table.add_row(
                    row.dataset,
                    row.mode_label,
                    row.load_label,
                    num(row.output_tok_s),
                    num(row.tau_mean, 2),
                    *((chosen_text(row),) if adaptive else ()),
                    speedup_text(row.speedup),
                    percent(row.match_rate),
                )
        tables.append(table)
    return tables


def comparison_tables(rows: list[ReportRow], series: list[Series]) -> list[Table]:
    """Tokens/s and speedup per measured point, series side by side (a few per table, lettered)."""
    letters = {s.label: ascii_uppercase[i % 26] for i, s in enumerate(series)}
    by_point: dict[tuple[str, str, str], dict[str, ReportRow]] = {}
    for row in rows:
        by_point.setdefault(row.point, {})[row.series] = row
    tables = []
    for start in range(0, len(series), SERIES_PER_COMPARISON):
        group = series[start : start + SERIES_PER_COMPARISON]
        caption = "; ".join(f"{letters[s.label]}: {s.label}" for s in group)
        table = narrow_table("side by side", caption)
        headers = [f"{letters[s.label]} {what}" for s in group for what in ("tok/s", "speedup")]
        add_columns(table, ("dataset", "mode", "load", *headers), ("dataset", "mode", "load"))
        for point, found in by_point.items():
            cells = list(point)
            for s in group:
                row = found.get(s.label)
                speedup = "-" if row is None or row.speedup is None else f"{row.speedup.estimate:.2f}x"
                cells += ["-", "-"] if row is None else [num(row.output_tok_s), speedup]
            table.add_row(*cells)
        tables.append(table)
    return tables


def model_table(rows: list[ReportRow]) -> Table:
    """Measured tok/s next to the step model's (`specdeploy project`, fitted on the same series' cells)."""
    table = narrow_table("measured against the step model (specdeploy project)")
    add_columns(
        table,
        ("series", "dataset", "mode", "load", "tok/s", "model", "off by"),
        ("series", "dataset", "mode", "load"),
        ("series",),
    )
    for row in rows:
        if row.predicted_output_tok_s is not None:
            off = row.predicted_output_tok_s / row.output_tok_s - 1 if row.output_tok_s > 0 else None
            table.add_row(row.series, row.dataset, row.mode_label, row.load_label, num(row.output_tok_s),
                          num(row.predicted_output_tok_s), "-" if off is None else f"{off:+.0%}")  # fmt: skip
    return table
