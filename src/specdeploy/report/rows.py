"""The report's table: one row per series, dataset, mode, budget and load point, repeats pooled.

Throughput (output tok/s, requests/s) is the mean over the point's repeats: each repeat is its own
timed span. Latency percentiles, tau and the acceptance histogram pool every request of every
repeat. The speedup is the run's own pooled comparison (summary.json `speedups`), with its CI.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from pydantic import BaseModel

from specdeploy.bench.metrics import cell_metrics
from specdeploy.bench.results import CellKey, CellSummary, Interval
from specdeploy.bench.runs import LoadedRun, Series
from specdeploy.modes import Budget, budget_order

REPORT_SCHEMA = "specdeploy.report/1"
MODE_ORDER = {"ar": 0, "dflash": 1, "ddtree": 2, "eagle3": 3}


class ReportRow(BaseModel):
    series: str
    dataset: str
    mode: str  # "ar" also for the AR baseline cells of a `bench --baseline-url` run
    budget: Budget | None
    concurrency: int | None
    request_rate: float | None
    repeats: int
    requests: int
    errors: int
    output_tok_s: float
    # each repeat's, in repeat order: how far they spread (a campaign's rounds are server starts of their own)
    output_tok_s_by_repeat: list[float] = []
    requests_per_s: float
    tok_s_per_user_p50: float | None
    ttft_p50_ms: float | None
    tpot_p50_ms: float | None
    itl_p50_ms: float | None
    e2e_p50_ms: float | None
    tau_mean: float | None
    tau_requests: int
    tau_histogram: dict[str, int]
    budget_chosen_mean: float | None = None  # an adaptive budget: mean over the point's verify steps
    ar_step_share: float | None = None  # ... and the share of them that were AR steps (budget 0)
    speedup: Interval | None
    match_rate: float | None
    baseline: str | None
    run: str
    # GPU telemetry pooled over the repeats that recorded it (None on a machine without NVML)
    power_w_mean: float | None = None
    tokens_per_joule: float | None = None
    usd_per_million_tokens: float | None = None
    # `specdeploy project`'s step model fitted on the series' cells, at this point
    predicted_output_tok_s: float | None = None

    @property
    def mode_label(self) -> str:
        return self.mode + ("" if self.budget is None else f" b{self.budget}")

    @property
    def load_label(self) -> str:
        return f"c={self.concurrency}" if self.request_rate is None else f"{self.request_rate:g} req/s"

    @property
    def point(self) -> tuple[str, str, str]:
        """What rows of different series share when they measure the same thing."""
        return (self.dataset, self.mode_label, self.load_label)


def _mode(key: CellKey) -> str:
    # A `bench --baseline-url` baseline is an AR server: labelled as an AR run's cells (a campaign's or the
    # demo's), so that side by side they share one row.
    if key.role == "baseline":
        return "ar"
    return key.mode or "-"


def _thinking_label(run: LoadedRun) -> str:
    """A thinking target's setting, next to the dataset it was measured on (older runs recorded none)."""
    thinking = run.manifest.options.get("thinking")
    return "" if thinking is None else f" (thinking {thinking})"


def _row(series: str, run: LoadedRun, cells: list[CellSummary]) -> ReportRow:
    key = cells[0].key
    ids = {cell.key.id for cell in cells}
    # Distributions only: its duration would span repeats that each count time from their own start.
    pooled = cell_metrics([r for r in run.records if r.cell in ids])
    histogram: Counter[str] = Counter()
    for cell in cells:
        histogram.update(cell.metrics.tau_histogram)
    comparison = run.summary.speedups.get(key.point_id)
    telemetry = [c.telemetry for c in cells if c.telemetry is not None and c.telemetry.absent is None]
    powers = [sum(g.power_w_mean or 0.0 for g in t.gpus) for t in telemetry]
    energies = [
        (c.metrics.output_tokens, c.telemetry.energy_j) for c in cells if c.telemetry and c.telemetry.energy_j
    ]
    dollars = [t.usd_per_million_tokens for t in telemetry if t.usd_per_million_tokens is not None]
    chosen = [b for r in run.records if r.cell in ids and r.ddtree_budgets for b in r.ddtree_budgets]
    return ReportRow(
        series=series,
        dataset=key.dataset + _thinking_label(run),
        mode=_mode(key),
        budget=key.budget,
        concurrency=key.concurrency if key.request_rate is None else None,
        request_rate=key.request_rate,
        repeats=len(cells),
        requests=sum(c.metrics.n_requests for c in cells),
        errors=sum(c.metrics.n_errors for c in cells),
        output_tok_s=sum(c.metrics.output_tok_s for c in cells) / len(cells),
        output_tok_s_by_repeat=[c.metrics.output_tok_s for c in sorted(cells, key=lambda c: c.key.repeat)],
        requests_per_s=sum(c.metrics.requests_per_s for c in cells) / len(cells),
        tok_s_per_user_p50=pooled.output_tok_s_per_user.p50,
        ttft_p50_ms=pooled.ttft_ms.p50,
        tpot_p50_ms=pooled.tpot_ms.p50,
        itl_p50_ms=pooled.itl_ms.p50,
        e2e_p50_ms=pooled.e2e_ms.p50,
        tau_mean=pooled.tau.mean,
        tau_requests=pooled.tau.n,
        tau_histogram=dict(sorted(histogram.items(), key=lambda item: float(item[0]))),
        budget_chosen_mean=sum(chosen) / len(chosen) if chosen else None,
        ar_step_share=chosen.count(0) / len(chosen) if chosen else None,
        speedup=comparison.speedup if comparison else None,
        match_rate=comparison.output_match_rate if comparison else None,
        baseline=comparison.baseline_cell if comparison else None,
        run=str(run.path),
        power_w_mean=sum(powers) / len(powers) if powers else None,
        tokens_per_joule=sum(t for t, _ in energies) / sum(e for _, e in energies) if energies else None,
        usd_per_million_tokens=sum(dollars) / len(dollars) if dollars else None,
    )


def sort_key(row: ReportRow) -> tuple[Any, ...]:
    return (
        row.dataset,
        row.request_rate is not None,
        MODE_ORDER.get(row.mode, 9),
        budget_order(row.budget),
        row.concurrency or 0,
        row.request_rate or 0.0,
    )


def report_rows(series: list[Series]) -> list[ReportRow]:
    """Every load point of every run, sorted so that the series of one point sit next to each other."""
    order = {one.label: index for index, one in enumerate(series)}
    rows = []
    for one in series:
        for run in one.runs:
            points: dict[str, list[CellSummary]] = defaultdict(list)
            for cell in run.summary.cells.values():
                points[cell.key.point_id].append(cell)
            rows += [_row(one.label, run, cells) for cells in points.values()]
    return sorted(rows, key=lambda row: (*sort_key(row), order[row.series]))


def report_document(series: list[Series], rows: list[ReportRow]) -> dict[str, Any]:
    """The `report --json` document."""
    return {
        "schema": REPORT_SCHEMA,
        "series": [
            {
                "label": s.label,
                "recipe": s.fact("recipe"),
                "hardware": s.fact("hardware"),
                "interconnect": s.fact("interconnect"),
                "engine": s.fact("engine"),
                "gpu": s.gpu,
                "runs": [str(r.path) for r in s.runs],
            }
            for s in series
        ],
        "rows": [row.model_dump(mode="json") for row in rows],
    }
