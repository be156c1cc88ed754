"""Rich tables for the end of a bench run and for the client self-test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from specdeploy.bench.compare import CompareRow
from specdeploy.bench.results import CellSummary, Comparison, Distribution, RunSummary
from specdeploy.bench.selftest import LevelResult
from specdeploy.terminal_tables import add_columns, narrow_table


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _speedup(comparison: Comparison | None) -> str:
    if comparison is None or comparison.speedup is None:
        return "-"
    s = comparison.speedup
    return f"{s.estimate:.2f}x [{s.low:.2f}, {s.high:.2f}]"


def _load(cell: CellSummary) -> str:
    key = cell.key
    return f"c={key.concurrency}" if key.request_rate is None else f"{key.request_rate:g} req/s"


# Why a speedup and the ratio of two tok/s figures can disagree (even rank two modes differently).
SPEEDUP_NOTE = (
    "speedup: the baseline's time per output token over the target's, paired prompt by prompt; tok/s: output "
    "tokens over the cell's wall time, gaps between requests included"
)


def summary_table(summary: RunSummary) -> Table:
    """One row per cell, key columns only: tokens/s, TTFT, tau, errors and the paired speedup (95% CI).

    summary.json (`bench --json`) and the report hold every other figure (req/s, TPOT, ITL, chunk gap, ...)."""
    table = narrow_table("bench results (TTFT p50 in ms; speedup with 95% bootstrap CI)", SPEEDUP_NOTE)
    add_columns(
        table,
        ("cell", "load", "rep", "tok/s", "TTFT", "tau", "err", "speedup", "match"),
        ("cell",),
        ("cell",),
    )
    for cell in summary.cells.values():
        m, key = cell.metrics, cell.key
        comparison = cell.comparison
        match = comparison.output_match_rate if comparison else None
        table.add_row(
            f"{key.role} {key.dataset} {key.mode or '-'}"
            + ("" if key.budget is None else f" b={key.budget}"),
            _load(cell),
            str(key.repeat),
            _num(m.output_tok_s),
            _num(m.ttft_ms.p50),
            _num(m.tau.mean, 2),
            str(m.n_errors),
            _speedup(comparison),
            "-" if match is None else f"{match:.0%}",
        )
    return table


def speedup_table(summary: RunSummary) -> Table:
    table = narrow_table("speedup per load point, all repeats pooled", SPEEDUP_NOTE)
    add_columns(table, ("load point", "pairs", "speedup", "match"), ("load point",), ("load point",))
    for point, comparison in summary.speedups.items():
        match = comparison.output_match_rate
        table.add_row(
            point,
            str(comparison.n_compared),
            _speedup(comparison),
            "-" if match is None else f"{match:.0%}",
        )
    return table


def _dist(d: Distribution) -> str:
    return f"{_num(d.p50, 2)}/{_num(d.p99, 2)}"


def selftest_table(results: list[LevelResult]) -> Table:
    """Key columns only; `bench-selftest --json` has every figure (requests, tokens/s, ...)."""
    table = narrow_table("client self-test against a loopback server (ms, p50/p99)")
    add_columns(table, ("conc", "err", "req/s (ideal)", "CPU cl/srv", "TTFT err", "chunk lag", "ITL err"))
    for r in results:
        table.add_row(
            str(r.concurrency),
            str(r.errors),
            f"{r.requests_per_s:,.1f} ({r.ideal_requests_per_s:,.1f})",
            f"{r.client_cpu:.0%}/" + ("-" if r.server_cpu is None else f"{r.server_cpu:.0%}"),
            _dist(r.ttft_error_ms),
            _dist(r.chunk_lag_ms),
            _dist(r.itl_error_ms),
        )
    return table


def _pair(values: tuple[float, float] | None) -> str:
    return "-" if values is None else f"{values[0]:+.2f}/{values[1]:+.2f}"


def compare_tables(rows: list[CompareRow]) -> list[Table]:
    """One row per level and client, every figure against the loopback server's own log; two tables, so
    that each fits 80 columns: the rates and errors, then what each client calls ITL and its CPU cost."""
    errors = narrow_table("clients against the loopback server's log (ms; client minus log, p50/p99)")
    add_columns(
        errors, ("conc", "client", "done", "req/s (plan)", "TTFT err", "ITL err"), ("client",), ("client",)
    )
    costs = narrow_table("the same clients: what their ITL is, and their CPU per request")
    add_columns(costs, ("conc", "client", "ITL as", "CPU ms/req"), ("client", "ITL as"), ("client", "ITL as"))
    for r in rows:
        rate = "-" if r.requests_per_s is None else f"{r.requests_per_s:,.1f}"
        client = r.client + (f" ({r.note})" if r.note else "")
        errors.add_row(
            str(r.concurrency),
            client,
            f"{r.completed}/{r.planned}",
            f"{rate} ({r.ideal_requests_per_s:,.1f})",
            _pair(r.ttft_error_ms),
            _pair(r.itl_error_ms),
        )
        costs.add_row(str(r.concurrency), client, r.itl_kind, _num(r.cpu_ms_per_request, 2))
    return [errors, costs]


@contextmanager
def cell_progress(console: Console) -> Iterator[Callable[[str, int, int | None], None]]:
    """A Rich progress display with one bar per cell; yields the runner's `progress(cell, done, planned)`."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        tasks: dict[str, int] = {}

        def progress(cell: str, done: int, planned: int | None) -> None:
            if cell not in tasks:
                tasks[cell] = bar.add_task(cell, total=planned)
            bar.update(tasks[cell], completed=done)

        yield progress
