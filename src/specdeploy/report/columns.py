"""The report table's columns, as text: the terminal table and the HTML page show the same cells."""

from __future__ import annotations

from collections.abc import Callable

from specdeploy.bench.results import Interval
from specdeploy.report.rows import ReportRow
from specdeploy.terminal_tables import num


def speedup_text(interval: Interval | None) -> str:
    if interval is None:
        return "-"
    return f"{interval.estimate:.2f}x [{interval.low:.2f}, {interval.high:.2f}]"


def tok_s_text(row: ReportRow) -> str:
    """The mean over repeats and, with more than one, half their range as a share of it (a campaign's rounds are
    server starts of their own, whose throughput can differ more than the modes compared)."""
    text = num(row.output_tok_s)
    values = row.output_tok_s_by_repeat
    if len(values) > 1 and row.output_tok_s > 0:
        text += f" ±{(max(values) - min(values)) / 2 / row.output_tok_s:.0%}"
    return text


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def chosen_text(row: ReportRow) -> str:
    """An adaptive budget's mean over the verify steps, and its share of AR steps (budget 0)."""
    if row.budget_chosen_mean is None:
        return "-"
    return f"{row.budget_chosen_mean:.1f}, AR {row.ar_step_share:.0%}"


Column = tuple[str, Callable[[ReportRow], str]]

COLUMNS: list[Column] = [
    ("series", lambda r: r.series),
    ("dataset", lambda r: r.dataset),
    ("mode", lambda r: r.mode_label),
    ("load", lambda r: r.load_label),
    ("reps", lambda r: str(r.repeats)),
    ("tok/s", tok_s_text),
    ("tok/s/user p50", lambda r: num(r.tok_s_per_user_p50)),
    ("TTFT p50 ms", lambda r: num(r.ttft_p50_ms)),
    ("TPOT p50 ms", lambda r: num(r.tpot_p50_ms, 2)),
    ("ITL p50 ms", lambda r: num(r.itl_p50_ms, 2)),
    ("tau mean", lambda r: num(r.tau_mean, 2)),
    ("budget chosen", lambda r: chosen_text(r)),
    ("speedup [95% CI]", lambda r: speedup_text(r.speedup)),
    ("match", lambda r: percent(r.match_rate)),
    ("errors", lambda r: f"{r.errors}/{r.requests}"),
    ("model tok/s", lambda r: num(r.predicted_output_tok_s)),
    ("GPU W", lambda r: num(r.power_w_mean, 0)),
    ("tok/J", lambda r: num(r.tokens_per_joule, 2)),
    ("$/M tok", lambda r: num(r.usd_per_million_tokens, 2)),
]


def side_by_side(rows: list[ReportRow], labels: list[str]) -> tuple[list[str], list[list[str]]]:
    """Header and body of the comparison: one line per measured point, tok/s and speedup per series."""
    header = ["dataset", "mode", "load"] + [
        f"{label} {what}" for label in labels for what in ("tok/s", "speedup")
    ]
    by_point: dict[tuple[str, str, str], dict[str, ReportRow]] = {}
    for row in rows:
        by_point.setdefault(row.point, {})[row.series] = row
    body = []
    for point, found in by_point.items():
        cells = list(point)
        for label in labels:
            row = found.get(label)
            cells += ["-", "-"] if row is None else [num(row.output_tok_s), speedup_text(row.speedup)]
        body.append(cells)
    return header, body
