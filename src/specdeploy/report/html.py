"""The report as one self-contained HTML page: inline CSS, plots as base64 PNG, no external resources."""

from __future__ import annotations

from datetime import datetime, timezone
from html import escape

import specdeploy
from specdeploy.bench.runs import Series
from specdeploy.report.columns import COLUMNS, side_by_side
from specdeploy.report.rows import ReportRow

CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 24px; color: #1d2430; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 17px; margin-top: 32px; border-bottom: 1px solid #d8dde6; padding-bottom: 4px; }
p.meta { color: #5b6678; font-size: 13px; margin-top: 0; }
p.note { color: #5b6678; font-size: 13px; }
table { border-collapse: collapse; font-size: 12.5px; margin: 8px 0; }
th, td { border: 1px solid #d8dde6; padding: 4px 8px; white-space: nowrap; }
th { background: #eef1f6; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr:nth-child(even) td { background: #f8f9fb; }
td.path { font-family: ui-monospace, monospace; font-size: 11.5px; white-space: normal; }
figure { margin: 12px 0 24px; }
figure img { max-width: 100%; border: 1px solid #e3e7ee; }
"""

TEXT_COLUMNS = {"series", "dataset", "mode", "load", "recipe", "hardware", "interconnect", "GPUs", "engine"}


def _table(header: list[str], body: list[list[str]], path_columns: frozenset[str] = frozenset()) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    lines = []
    for cells in body:
        tds = []
        for name, cell in zip(header, cells, strict=True):
            kind = "path" if name in path_columns else ("" if name in TEXT_COLUMNS else "num")
            tds.append(f'<td class="{kind}">{escape(cell)}</td>')
        lines.append("<tr>" + "".join(tds) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(lines)}</tbody></table>"


def _series_table(series: list[Series]) -> str:
    header = ["series", "recipe", "hardware", "interconnect", "GPUs", "engine", "run directories"]
    body = [
        [
            s.label,
            s.fact("recipe"),
            s.fact("hardware"),
            s.fact("interconnect"),
            s.gpu,
            s.fact("engine"),
            "; ".join(
                f"{sum(r.root == root for r in s.runs)} under {root}"
                for root in dict.fromkeys(r.root for r in s.runs)
            ),
        ]
        for s in series
    ]
    return _table(header, body, frozenset({"run directories"}))


def render_html(series: list[Series], rows: list[ReportRow], plots: list[tuple[str, str | None]]) -> str:
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>specdeploy benchmark report</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>specdeploy benchmark report</h1>",
        f'<p class="meta">{len(series)} series, {len(rows)} load points; generated {generated} by specdeploy '
        f"{escape(specdeploy.__version__)} from the run directories' files only.</p>",
        "<h2>Runs</h2>",
        _series_table(series),
        "<h2>Results per load point</h2>",
        '<p class="note">Throughput is the mean over repeats (± half their range, as a share of the mean); '
        "latency percentiles and tau pool every request. "
        "Speedup: AR time per output token over the mode's, on the same prompts, with a 95% bootstrap CI "
        "over repeats and requests. Match: greedy outputs identical to AR's.</p>",
        _table([h for h, _ in COLUMNS], [[cell(r) for _, cell in COLUMNS] for r in rows]),
    ]
    if len(series) > 1:
        header, body = side_by_side(rows, [s.label for s in series])
        parts += ["<h2>Side by side</h2>", _table(header, body)]
    for title, png in plots:
        parts.append(f"<h2>{escape(title)}</h2>")
        if png is None:
            parts.append('<p class="note">No data for this plot in these runs.</p>')
        else:
            parts.append(f'<figure><img alt="{escape(title)}" src="data:image/png;base64,{png}"></figure>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
