"""Every Rich table the CLI prints is legible at 80 columns: no value cut to "…", the key values in full."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table
from test_report import NVLINK, PCIE, write_box
from typer.testing import CliRunner

from specdeploy.bench.compare import CompareRow
from specdeploy.bench.display import compare_tables, selftest_table, speedup_table, summary_table
from specdeploy.bench.results import Distribution, RunDirectory
from specdeploy.bench.runs import load_series
from specdeploy.bench.selftest import LevelResult
from specdeploy.campaign.commands import state_table
from specdeploy.campaign.state import CampaignState, ServerState
from specdeploy.cli import app
from specdeploy.demo.flow import DemoOptions
from specdeploy.demo.summary import ModeRow as DemoRow
from specdeploy.demo.summary import table as demo_table
from specdeploy.report.columns import speedup_text
from specdeploy.report.rows import report_rows
from specdeploy.report.tables import comparison_tables, rows_tables, series_table
from specdeploy.terminal_tables import num
from specdeploy.zoo.registry import zoo_pairs
from specdeploy.zoo.table import ModeRow, mode_table


def render(*tables: Table) -> str:
    console = Console(width=80, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    for table in tables:
        console.print(table)
    return console.export_text()


def assert_legible(text: str, values: list[str]) -> None:
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80
    missing = [value for value in values if value not in text]
    assert missing == [], text


@pytest.fixture(scope="module")
def boxes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("boxes")
    return write_box(root / "pcie", PCIE, 10.0, ("gsm8k", "spec-bench")), write_box(root / "nvl", NVLINK, 6.0)


def test_bench_tables(boxes):
    summary = RunDirectory(boxes[0] / "runs" / "tp8-ddtree-b16" / "spec-bench").read_summary()
    text = render(summary_table(summary), speedup_table(summary))
    values = []
    for cell in summary.cells.values():
        m, comparison = cell.metrics, cell.comparison
        values += [
            num(m.output_tok_s),
            num(m.ttft_ms.p50),
            f"{m.tau.mean:,.2f}",
            speedup_text(comparison.speedup),
        ]
    values += [speedup_text(c.speedup) for c in summary.speedups.values()] + list(summary.speedups)
    assert_legible(text, values)


def test_report_tables(boxes):
    series = load_series(list(boxes))
    rows = report_rows(series)
    text = render(series_table(series), *rows_tables(rows, series), *comparison_tables(rows, series))
    values = [s.label for s in series] + ["sglang 0.5.23", "rtx-pro-6000-x8", "b200-x8"]
    values += [num(r.output_tok_s) for r in rows] + [speedup_text(r.speedup) for r in rows]
    values += [num(r.tau_mean, 2) for r in rows] + ["ddtree b16", "spec-bench"]
    assert_legible(text, values)


def test_campaign_state_table():
    state = CampaignState(
        name="kimi-k2.6-rtx-pro-6000",
        servers={
            "tp8-ddtree-b16": ServerState(status="failed", error="the server died twice " * 4),
            "tp8-dflash": ServerState(
                status="complete", failed_cells=["tp8-dflash/gsm8k:target/gsm8k/dflash/c16/rep1"]
            ),
        },
    )
    assert_legible(render(state_table(state)), ["tp8-ddtree-b16", "tp8-dflash", "failed", "complete"])


def _dist(p50: float, p99: float) -> Distribution:
    return Distribution(n=10, mean=p50, p50=p50, p99=p99)


def test_selftest_and_compare_tables():
    level = LevelResult(
        256,
        768,
        0,
        3.0,
        1234.5,
        1280.0,
        4938.0,
        5120.0,
        _dist(1.23, 12.34),
        _dist(0.45, 10.12),
        _dist(-0.12, 3.45),
        _dist(1.0, 2.0),
        0.93,
        0.41,
    )
    rows = [
        CompareRow(
            256, "specdeploy", 768, 768, 1234.5, 1280.0, (1.23, 12.34), (-0.12, 3.45), "per token", 0.85
        ),
        CompareRow(256, "sglang-oai", 768, 768, 1100.1, 1280.0, (2.5, 40.25), (0.1, 9.99), "per chunk", 2.25),
        CompareRow(256, "aiperf", 768, 0, None, 1280.0, None, None, "per request", None, "not installed"),
    ]
    text = render(selftest_table([level]), *compare_tables(rows))
    values = ["1,234.5 (1,280.0)", "93%/41%", "1.23/12.34", "0.45/10.12", "-0.12/3.45"]
    values += [
        "+1.23/+12.34",
        "+2.50/+40.25",
        "per chunk",
        "768/768",
        "1,100.1 (1,280.0)",
        "sglang-oai",
        "0.85",
    ]
    assert_legible(text, values)


def test_demo_and_engine_mode_tables():
    options = DemoOptions("tiny-code", 16, 128, 8, 2, Path("runs/demo"))
    demo = [
        DemoRow("ar", None, 1.0, 291.1, 1.0, None, None),
        DemoRow("ddtree", 16, 2.36, 1194.5, 1.35, (1.21, 1.52), 1.0),
    ]
    modes = [ModeRow("ar", 1.0, 291.1, None, None, 8), ModeRow("ddtree (budget 32)", 2.36, 194.5, 0.67, 8, 8)]
    text = render(demo_table(demo, options), mode_table(modes, "tiny-code: 8 held-out prompts, greedy"))
    assert_legible(text, ["1.35x [1.21, 1.52]", "1194.5", "ddtree (budget 32)", "0.67x", "8/8", "2.36"])


def test_zoo_list_shows_each_pairs_recorded_tau():
    result = CliRunner().invoke(app, ["zoo", "list"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    values = [pair.name for pair in zoo_pairs()]
    for pair in zoo_pairs():
        tau = pair.measured_tau()
        values += [f"{tau.dflash:.2f}" if tau.dflash is not None else "-"]
        values += [f"{tau.ddtree:.2f} (b{tau.ddtree_budget})" if tau.ddtree is not None else "-"]
    assert_legible(result.output, values)


@pytest.mark.parametrize(
    ("recipe", "hardware", "mode"),
    [
        ("kimi-k2.6", "rtx-pro-6000-x8", "dflash"),
        ("kimi-k2.6", "b200-x8", "ddtree"),
        ("tiny-code", "cpu", "ar"),
    ],
)
def test_plan_text_fits_the_terminal_and_loses_no_word(recipe, hardware, mode):
    result = CliRunner().invoke(
        app, ["plan", recipe, "--hardware", hardware, "--mode", mode], env={"COLUMNS": "80"}
    )
    assert result.exit_code == 0, result.output
    wide = [line for line in result.output.splitlines() if len(line) > 80]
    # Only a word that cannot be broken (a URL, a flag with its value) may stick out.
    assert len(wide) <= 3, wide
    assert all(any(len(word) > 40 for word in line.split()) for line in wide), wide
    wide_terminal = CliRunner().invoke(
        app, ["plan", recipe, "--hardware", hardware, "--mode", mode], env={"COLUMNS": "200"}
    )
    assert max(len(line) for line in wide_terminal.output.splitlines()) > 80  # at most 100 columns
    # Wrapping moves words, never drops or cuts one.
    assert result.output.split() == wide_terminal.output.split()
