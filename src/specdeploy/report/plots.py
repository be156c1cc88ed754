"""The report's plots as base64 PNG (matplotlib's Agg renderer, no display needed).

Colour says the mode (ar, dflash, ddtree b16, ...), line style and marker say the series (machine),
so that two boxes' runs of one mode read as the same colour drawn two ways. Each plot has one panel
per dataset; a plot without data to show returns None.
"""

from __future__ import annotations

import base64
import io
import math
from collections import defaultdict
from collections.abc import Callable, Iterable

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from specdeploy.report.rows import ReportRow, sort_key

STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1, 1, 1)), "v")]
PANEL_WIDTH, PANEL_HEIGHT, MAX_COLUMNS = 4.6, 3.6, 3


class Palette:
    """Stable colours per mode label and styles per series across every plot of one report."""

    def __init__(self, rows: list[ReportRow], series: list[str]) -> None:
        modes = list(dict.fromkeys(r.mode_label for r in sorted(rows, key=sort_key)))
        colours = [f"C{i % 10}" for i in range(len(modes))]
        self.colour = dict(zip(modes, colours, strict=True))
        self.series = series

    def style(self, series: str) -> tuple[object, str]:
        return STYLES[self.series.index(series) % len(STYLES)]

    def line(self, series: str, mode: str) -> dict[str, object]:
        linestyle, marker = self.style(series)
        return {"color": self.colour.get(mode, "black"), "linestyle": linestyle, "marker": marker}

    def label(self, series: str, mode: str) -> str:
        return mode if len(self.series) == 1 else f"{mode} - {series}"


def _panels(datasets: list[str], title: str) -> tuple[Figure, list[Axes]]:
    columns = min(len(datasets), MAX_COLUMNS)
    lines = math.ceil(len(datasets) / columns)
    figure = Figure(figsize=(PANEL_WIDTH * columns, PANEL_HEIGHT * lines + 0.6), layout="constrained")
    axes = figure.subplots(lines, columns, squeeze=False).ravel().tolist()
    for ax in axes[len(datasets) :]:
        ax.set_visible(False)
    for ax, dataset in zip(axes, datasets, strict=False):
        ax.set_title(dataset, fontsize=10)
        ax.grid(True, alpha=0.3)
    figure.suptitle(title, fontsize=11)
    return figure, axes[: len(datasets)]


def _png(figure: Figure) -> str:
    handles: dict[str, Line2D] = {}
    for ax in figure.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        # Two legend columns per panel: a wider legend than the figure would be cut off.
        panels = sum(ax.get_visible() for ax in figure.axes)
        figure.legend(
            list(handles.values()),
            list(handles),
            loc="outside lower center",
            ncols=max(1, min(len(handles), 2 * min(panels, MAX_COLUMNS))),
            fontsize=8,
        )
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=96)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _by_dataset(rows: Iterable[ReportRow]) -> dict[str, list[ReportRow]]:
    grouped: dict[str, list[ReportRow]] = defaultdict(list)
    for row in rows:
        grouped[row.dataset].append(row)
    return dict(sorted(grouped.items()))


def _lines(rows: list[ReportRow]) -> dict[tuple[str, str], list[ReportRow]]:
    """(series, mode label) -> its rows in concurrency order."""
    lines: dict[tuple[str, str], list[ReportRow]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: r.concurrency or 0):
        lines[(row.series, row.mode_label)].append(row)
    return lines


def _concurrency_axis(ax: Axes, rows: list[ReportRow]) -> None:
    levels = sorted({r.concurrency for r in rows if r.concurrency is not None})
    if len(levels) > 1:
        ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_xlabel("concurrency")


def _against_concurrency(
    rows: list[ReportRow],
    palette: Palette,
    title: str,
    ylabel: str,
    draw: Callable[[Axes, list[ReportRow], dict], None],
) -> str | None:
    rows = [r for r in rows if r.concurrency is not None]
    if not rows:
        return None
    datasets = _by_dataset(rows)
    figure, axes = _panels(list(datasets), title)
    for ax, dataset_rows in zip(axes, datasets.values(), strict=True):
        for (series, mode), line in _lines(dataset_rows).items():
            draw(ax, line, {**palette.line(series, mode), "label": palette.label(series, mode)})
        _concurrency_axis(ax, dataset_rows)
        ax.set_ylabel(ylabel)
    return _png(figure)


def throughput_plot(rows: list[ReportRow], palette: Palette) -> str | None:
    def draw(ax: Axes, line: list[ReportRow], style: dict) -> None:
        ax.plot([r.concurrency for r in line], [r.output_tok_s for r in line], **style)

    return _against_concurrency(rows, palette, "output throughput against concurrency", "output tok/s", draw)


def speedup_plot(rows: list[ReportRow], palette: Palette) -> str | None:
    paired = [r for r in rows if r.speedup is not None]

    def draw(ax: Axes, line: list[ReportRow], style: dict) -> None:
        estimates = [r.speedup.estimate for r in line]
        errors = [
            [r.speedup.estimate - r.speedup.low for r in line],
            [r.speedup.high - r.speedup.estimate for r in line],
        ]
        ax.errorbar([r.concurrency for r in line], estimates, yerr=errors, capsize=3, **style)
        ax.axhline(1.0, color="grey", linewidth=0.8)  # parity with the AR baseline

    return _against_concurrency(
        paired, palette, "speedup over AR (95% CI) against concurrency", "speedup", draw
    )


def _weighted_tau(rows: list[ReportRow]) -> float | None:
    n = sum(r.tau_requests for r in rows if r.tau_mean is not None)
    if n == 0:
        return None
    return sum(r.tau_mean * r.tau_requests for r in rows if r.tau_mean is not None) / n


def tau_budget_plot(rows: list[ReportRow], palette: Palette) -> str | None:
    """Mean acceptance length (all loads pooled) against the DDTree budget; DFlash's chain as a dotted level."""
    # An adaptive (auto) budget has no place on this axis; the tables show it.
    trees = [r for r in rows if r.mode == "ddtree" and isinstance(r.budget, int) and r.tau_mean is not None]
    if not trees:
        return None
    datasets = _by_dataset(trees)
    figure, axes = _panels(list(datasets), "acceptance length tau against DDTree budget")
    for ax, (dataset, dataset_rows) in zip(axes, datasets.items(), strict=True):
        by_series: dict[str, dict[int, list[ReportRow]]] = defaultdict(lambda: defaultdict(list))
        for row in dataset_rows:
            by_series[row.series][row.budget].append(row)
        for series, budgets in by_series.items():
            points = sorted((budget, _weighted_tau(group)) for budget, group in budgets.items())
            style = palette.line(series, "ddtree")
            style["color"] = "C3" if len(palette.series) == 1 else f"C{palette.series.index(series) % 10}"
            ax.plot([b for b, _ in points], [t for _, t in points], label=f"ddtree - {series}", **style)
            chain = _weighted_tau(
                [r for r in rows if r.series == series and r.dataset == dataset and r.mode == "dflash"]
            )
            if chain is not None:
                ax.axhline(
                    chain, color=style["color"], linestyle=":", linewidth=1, label=f"dflash chain - {series}"
                )
        ax.set_xscale("log", base=2)
        budgets_seen = sorted({r.budget for r in dataset_rows})
        ax.set_xticks(budgets_seen, [str(b) for b in budgets_seen])
        ax.set_xlabel("DDTree budget (draft-tree nodes)")
        ax.set_ylabel("tau (tokens per target forward)")
    return _png(figure)


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both axes (higher is better on both), by x ascending."""
    front: list[tuple[float, float]] = []
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if not front or y > front[-1][1]:
            front.append((x, y))
    return sorted(front)


def pareto_plot(rows: list[ReportRow], palette: Palette) -> str | None:
    """Per-user speed against total throughput; each series' Pareto front over all its modes, shaded."""
    measured = [r for r in rows if r.tok_s_per_user_p50 is not None and r.output_tok_s > 0]
    if not measured:
        return None
    datasets = _by_dataset(measured)
    figure, axes = _panels(list(datasets), "throughput-latency trade-off (upper right is better)")
    for ax, dataset_rows in zip(axes, datasets.values(), strict=True):
        for (series, mode), line in _lines(dataset_rows).items():
            xs = [r.output_tok_s for r in line]
            ys = [r.tok_s_per_user_p50 for r in line]
            ax.plot(xs, ys, label=palette.label(series, mode), alpha=0.85, **palette.line(series, mode))
            for row, x, y in zip(line, xs, ys, strict=True):
                ax.annotate(row.load_label, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        for series in dict.fromkeys(r.series for r in dataset_rows):
            front = pareto_front(
                [(r.output_tok_s, r.tok_s_per_user_p50) for r in dataset_rows if r.series == series]
            )
            linestyle, _ = palette.style(series)
            ax.plot(
                *zip(*front, strict=True),
                color="black",
                linewidth=5,
                alpha=0.25,
                linestyle=linestyle,
                zorder=0,
                label=f"Pareto front - {series}",
            )
        ax.set_xlabel("total output tok/s")
        ax.set_ylabel("tok/s per user (p50)")
    return _png(figure)


def tau_histogram_plot(rows: list[ReportRow], palette: Palette) -> str | None:
    """Share of requests per acceptance-length bin (0.5 wide), all loads pooled, per mode and series."""
    speculative = [r for r in rows if r.tau_histogram and r.mode != "ar"]
    if not speculative:
        return None
    datasets = _by_dataset(speculative)
    figure, axes = _panels(list(datasets), "per-request acceptance length tau")
    for ax, dataset_rows in zip(axes, datasets.values(), strict=True):
        counts: dict[tuple[str, str], dict[float, int]] = defaultdict(lambda: defaultdict(int))
        for row in dataset_rows:
            for edge, n in row.tau_histogram.items():
                counts[(row.series, row.mode_label)][float(edge)] += n
        for (series, mode), bins in counts.items():
            low, high = min(bins), max(bins)
            edges = [low + 0.5 * i for i in range(int(round((high - low) / 0.5)) + 2)]
            total = sum(bins.values())
            shares = [bins.get(edge, 0) / total for edge in edges[:-1]]
            style = palette.line(series, mode)
            ax.stairs(
                shares,
                edges,
                color=style["color"],
                linestyle=style["linestyle"],
                linewidth=1.8,
                label=palette.label(series, mode),
            )
        ax.set_xlabel("tau (tokens per target forward)")
        ax.set_ylabel("share of requests")
    return _png(figure)


def all_plots(rows: list[ReportRow], series: list[str]) -> list[tuple[str, str | None]]:
    """(title, base64 PNG or None) for every plot of the report, in page order."""
    palette = Palette(rows, series)
    return [
        ("Throughput against concurrency", throughput_plot(rows, palette)),
        ("Speedup against concurrency", speedup_plot(rows, palette)),
        ("Acceptance length against DDTree budget", tau_budget_plot(rows, palette)),
        ("Throughput-latency Pareto front", pareto_plot(rows, palette)),
        ("Acceptance length histograms", tau_histogram_plot(rows, palette)),
    ]
