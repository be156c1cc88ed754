"""The demo's result per mode, from the report's rows: printed as a table or as one JSON object."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from rich.table import Table

from specdeploy.demo.flow import DemoOptions, DemoRun
from specdeploy.terminal_tables import add_columns, narrow_table

SCHEMA = "specdeploy.demo/1"


@dataclass(frozen=True)
class ModeRow:
    mode: str
    budget: int | None
    tau: float | None
    tokens_per_s: float
    speedup: float | None  # AR time per output token over this mode's, paired prompt by prompt
    speedup_ci: tuple[float, float] | None  # 95% bootstrap interval
    greedy_match: float | None  # share of requests whose greedy output equals AR's

    @property
    def label(self) -> str:
        return self.mode if self.budget is None else f"{self.mode} (budget {self.budget})"


def mode_rows(run: DemoRun) -> list[ModeRow]:
    """AR first (its one run), then each speculative mode paired with it."""
    (ar,) = [r for r in run.rows if r.mode == "ar"]
    rows = [
        ModeRow(
            mode="ar",
            budget=None,
            tau=1.0,
            tokens_per_s=ar.output_tok_s,
            speedup=1.0,
            speedup_ci=None,
            greedy_match=None,
        )
    ]
    for row in run.rows:
        if row.mode == "ar":
            continue
        rows.append(
            ModeRow(
                mode=row.mode,
                budget=row.budget,
                tau=row.tau_mean,
                tokens_per_s=row.output_tok_s,
                speedup=row.speedup.estimate if row.speedup else None,
                speedup_ci=(row.speedup.low, row.speedup.high) if row.speedup else None,
                greedy_match=row.match_rate,
            )
        )
    return rows


def table(rows: list[ModeRow], options: DemoOptions) -> Table:
    result = narrow_table(
        f"{options.pair} served on this CPU: {options.prompts} prompts x {options.repeats} repeats, greedy, "
        f"{options.max_new_tokens} new tokens",
        "tau: tokens per target step (bonus token included), mean over requests; tokens/s: output tokens "
        "over each run's wall time; speedup: AR's time per output token over the mode's, paired prompt by "
        "prompt with the one AR run, 95% bootstrap CI (not the ratio of tokens/s, which also counts the gaps "
        "between requests); same output: greedy outputs identical to AR's",
    )
    add_columns(result, ("mode", "tau", "tokens/s", "speedup vs ar", "same output"), ("mode",))
    for row in rows:
        if row.mode == "ar":
            speedup, match = "baseline", "-"
        else:
            low, high = row.speedup_ci or (float("nan"), float("nan"))
            speedup = "-" if row.speedup is None else f"{row.speedup:.2f}x [{low:.2f}, {high:.2f}]"
            match = "-" if row.greedy_match is None else f"{row.greedy_match:.0%}"
        tau = "-" if row.tau is None else f"{row.tau:.2f}"
        result.add_row(row.label, tau, f"{row.tokens_per_s:.1f}", speedup, match)
    return result


def document(rows: list[ModeRow], run: DemoRun, options: DemoOptions) -> dict:
    """The `demo --json` object."""
    return {
        "schema": SCHEMA,
        "pair": options.pair,
        "prompts": options.prompts,
        "repeats": options.repeats,
        "max_new_tokens": options.max_new_tokens,
        "rows": [asdict(row) for row in rows],
        "run_dir": str(run.out),
        "report": str(run.report),
    }
