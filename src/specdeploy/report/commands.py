"""`specdeploy report RUN_DIR...`: tables on the terminal (or JSON) and a self-contained HTML page."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from specdeploy.bench.runs import Series, load_series
from specdeploy.errors import SpecdeployError
from specdeploy.projection.project import fitted_output_tok_s
from specdeploy.report.html import render_html
from specdeploy.report.rows import ReportRow, report_document, report_rows
from specdeploy.report.tables import comparison_tables, model_table, rows_tables, series_table


def with_model(series: list[Series], rows: list[ReportRow]) -> list[ReportRow]:
    """Each row with `specdeploy project`'s model figure at its point, where one can be fitted."""
    fitted = {s.label: fitted_output_tok_s(s) for s in series}
    return [
        row.model_copy(
            update={
                "predicted_output_tok_s": fitted[row.series].get(
                    (
                        row.dataset,
                        "ar" if row.mode == "baseline" else row.mode,
                        row.budget,
                        row.concurrency or 0,
                    )
                )
            }
        )
        for row in rows
    ]


def write_report(run_dirs: list[Path], out: Path) -> tuple[list[Series], list[ReportRow]]:
    """Read the runs, write the HTML page to `out`; returns (series, rows) for the caller to print."""
    series = load_series(run_dirs)
    rows = with_model(series, report_rows(series))
    if not rows:
        raise SpecdeployError(
            f"the runs in {', '.join(map(str, run_dirs))} have no finished cell yet: nothing to report"
        )
    from specdeploy.report.plots import all_plots  # matplotlib: only when a report is written

    page = render_html(series, rows, all_plots(rows, [s.label for s in series]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return series, rows


def report(
    run_dirs: Annotated[
        list[Path],
        typer.Argument(help="Bench run directories or campaign directories (several: side by side)."),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            help="The HTML page to write (default: report.html inside the one directory given, or in the "
            "current directory when several are compared)."
        ),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the aggregated table as JSON.")] = False,
) -> None:
    """Report on finished runs from their files only: throughput, latency, tau, speedup; plots in HTML."""
    # Beside the runs it describes, so that a report never lands in (and gets committed to) a source checkout.
    out = out or (run_dirs[0] / "report.html" if len(run_dirs) == 1 else Path("report.html"))
    series, rows = write_report(run_dirs, out)
    if json_output:
        typer.echo(json.dumps(report_document(series, rows), indent=2))
        Console(stderr=True).print(f"HTML report in {out}")
        return
    console = Console()
    console.print(series_table(series))
    for table in rows_tables(rows, series):
        console.print(table)
    if len(series) > 1:
        for table in comparison_tables(rows, series):
            console.print(table)
    if any(row.predicted_output_tok_s is not None for row in rows):
        console.print(model_table(rows))
    console.print(f"HTML report in {out}")
