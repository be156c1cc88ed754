"""Reports from synthetic run directories written through the bench's own writers and metrics."""

from __future__ import annotations

import base64
import json
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specdeploy.bench.metrics import cell_metrics, compare
from specdeploy.bench.results import CellKey, CellSummary, Chunk, RequestRecord, RunDirectory, RunManifest
from specdeploy.bench.runs import load_series
from specdeploy.cli import app
from specdeploy.errors import SpecdeployError
from specdeploy.report.commands import write_report
from specdeploy.report.plots import pareto_front
from specdeploy.report.rows import report_rows

PROMPTS = 6
TOKENS = 24
PCIE = {
    "recipe": "kimi-k2.6",
    "hardware": "rtx-pro-6000-x8",
    "interconnect": "pcie",
    "engine": "sglang 0.5.23",
}
NVLINK = {"recipe": "kimi-k2.6", "hardware": "b200-x8", "interconnect": "nvlink", "engine": "sglang 0.5.23"}


def records(key: CellKey, tokens_per_chunk: int, gap_ms: float, seed: int) -> list[RequestRecord]:
    """One request per prompt, `tokens_per_chunk` tokens every `gap_ms` (with a little noise)."""
    rng = random.Random(seed)
    out = []
    slots = [0] * (key.concurrency or 1)  # when each concurrent user is free to send again
    for i in range(PROMPTS):
        t, tokens, chunks = 0, 0, []
        while tokens < TOKENS:
            t += int(gap_ms * 1e6 * rng.uniform(0.9, 1.1))
            tokens = min(tokens + tokens_per_chunk, TOKENS)
            chunks.append(Chunk(t_ns=t, tokens=tokens))
        start = slots[i % len(slots)]
        slots[i % len(slots)] += t
        out.append(
            RequestRecord(
                cell=key.id,
                index=i,
                prompt_id=f"p{i}",
                route="generate",
                sent_unix=time.time(),
                start_ns=start,
                chunks=chunks,
                end_ns=t,
                completion_tokens=TOKENS,
                spec_verify_ct=len(chunks),
                output_ids=list(range(TOKENS)),
            )
        )
    return out


def write_run(
    path: Path,
    facts: dict[str, Any],
    mode: str,
    budget: int | None = None,
    tokens_per_chunk: int = 1,
    gap_ms: float = 10.0,
    baseline: Path | None = None,
    dataset: str = "gsm8k",
    concurrency: tuple[int, ...] = (1, 4),
) -> Path:
    run = RunDirectory(path)
    manifest = RunManifest(
        run_id=path.name,
        created_unix=time.time(),
        specdeploy_version="test",
        options={"dataset": dataset},
        deployment={**facts, "mode": mode, "budget": budget},
    )
    run.create(manifest, {"target": None})
    for c in concurrency:
        key = CellKey(dataset=dataset, mode=mode, budget=budget, concurrency=c)
        # More load, slower steps: the shape real servers show.
        mine = records(key, tokens_per_chunk, gap_ms * (1 + c / 8), seed=c)
        comparison, speedups = None, {}
        if baseline is not None:
            base_id = f"target/{dataset}/ar/c{c}/rep0"
            base = RunDirectory(baseline).read_records(base_id)
            comparison = compare({0: mine}, {0: base}, base_id, greedy=True)
            speedups = {key.point_id: compare({0: mine}, {0: base}, base_id.rsplit("/", 1)[0], greedy=True)}
        summary = CellSummary(
            key=key, metrics=cell_metrics(mine), comparison=comparison, finished_unix=time.time()
        )
        run.write_cell(summary, mine, speedups)
    return path


def write_box(
    root: Path,
    facts: dict[str, Any],
    gap_ms: float,
    datasets: tuple[str, ...] = ("gsm8k",),
    verify_cost: float = 1.3,
) -> Path:
    """A campaign-like directory: AR, DFlash and DDTree budgets 8 and 16 on each dataset.

    `verify_cost`: how much longer a speculative step takes than an AR step (tree verification).
    """
    for dataset in datasets:
        ar = write_run(root / "runs" / "tp8-ar" / dataset, facts, "ar", gap_ms=gap_ms, dataset=dataset)
        dflash_gap = gap_ms * (1 + (verify_cost - 1) * 0.7)
        write_run(root / "runs" / "tp8-dflash" / dataset, facts, "dflash", None, 3, dflash_gap, ar, dataset)
        for budget, k in ((8, 4), (16, 5)):
            path = root / "runs" / f"tp8-ddtree-b{budget}" / dataset
            write_run(path, facts, "ddtree", budget, k, gap_ms * verify_cost, ar, dataset)
    # A deployment record next to the runs (its manifest.json has another schema): not a bench run.
    (root / "servers" / "tp8-ar" / "start-1").mkdir(parents=True)
    (root / "servers" / "tp8-ar" / "start-1" / "manifest.json").write_text('{"schema": 1}')
    return root


def test_rows_pool_repeats_and_carry_speedup_and_tau(tmp_path: Path) -> None:
    box = write_box(tmp_path / "pcie", PCIE, gap_ms=10.0)
    series = load_series([box])
    assert [s.label for s in series] == ["kimi-k2.6 on rtx-pro-6000-x8"] and len(series[0].runs) == 4
    rows = report_rows(series)
    assert [(r.mode_label, r.concurrency) for r in rows] == [
        ("ar", 1),
        ("ar", 4),
        ("dflash", 1),
        ("dflash", 4),
        ("ddtree b8", 1),
        ("ddtree b8", 4),
        ("ddtree b16", 1),
        ("ddtree b16", 4),
    ]
    by_mode = {(r.mode_label, r.concurrency): r for r in rows}
    ar, tree = by_mode[("ar", 1)], by_mode[("ddtree b16", 1)]
    assert ar.speedup is None and ar.tau_mean == pytest.approx(1.0)
    # 24 tokens in chunks of 5: 5 verify steps per request.
    assert tree.tau_mean == pytest.approx(24 / 5) and tree.tau_histogram == {"4.5": PROMPTS}
    # 5 tokens per 13 ms against 1 per 10 ms, the last chunk short: about 24 * 10 / (5 * 13) = 3.7x.
    assert (
        3.2 < tree.speedup.estimate < 4.2 and tree.speedup.low <= tree.speedup.estimate <= tree.speedup.high
    )
    assert tree.match_rate == 1.0 and tree.baseline == "target/gsm8k/ar/c1"
    assert tree.tpot_p50_ms == pytest.approx(13 * 1.125 / 5, rel=0.1)
    assert tree.errors == 0 and tree.requests == PROMPTS


def test_two_boxes_side_by_side_in_terminal_json_and_html(tmp_path: Path) -> None:
    pcie = write_box(tmp_path / "pcie", PCIE, gap_ms=10.0, datasets=("gsm8k", "humaneval"))
    nvlink = write_box(tmp_path / "nvlink", NVLINK, 6.0, ("gsm8k", "humaneval"), verify_cost=1.15)
    page = tmp_path / "out" / "report.html"
    runner = CliRunner()
    result = runner.invoke(
        app, ["report", str(pcie), str(nvlink), "--out", str(page)], env={"COLUMNS": "400"}
    )
    assert result.exit_code == 0, result.output
    assert "side by side" in result.output
    # the terminal letters the series (A, B) under the table; the HTML page names them in its headers
    assert "A tok/s" in result.output and "B tok/s" in result.output
    assert "A: kimi-k2.6 on rtx-pro-6000-x8; B: kimi-k2.6 on b200-x8" in result.output

    document = json.loads(
        runner.invoke(app, ["report", str(pcie), str(nvlink), "--out", str(page), "--json"]).stdout
    )
    assert document["schema"] == "specdeploy.report/1"
    assert [s["interconnect"] for s in document["series"]] == ["pcie", "nvlink"]
    rows = document["rows"]
    assert len(rows) == 2 * 2 * 4 * 2  # series x datasets x modes x concurrency
    point = [r for r in rows if r["dataset"] == "gsm8k" and r["mode"] == "ar" and r["concurrency"] == 1]
    assert [r["series"] for r in point] == ["kimi-k2.6 on rtx-pro-6000-x8", "kimi-k2.6 on b200-x8"]
    assert point[1]["output_tok_s"] > point[0]["output_tok_s"]  # the faster box is faster

    html = page.read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(images) == 5 and all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    assert "No data for this plot" not in html
    # Self-contained: nothing is fetched from anywhere.
    assert not re.search(r"<(link|script)\b|src=\"(?!data:)|url\(", html)
    assert html.count("kimi-k2.6 on b200-x8") >= 2 and "Side by side" in html
    assert "kimi-k2.6 on b200-x8 tok/s" in html


def test_same_machine_from_two_campaigns_stays_two_series(tmp_path: Path) -> None:
    first = write_box(tmp_path / "monday", PCIE, gap_ms=10.0)
    second = write_box(tmp_path / "tuesday", PCIE, gap_ms=9.0)
    labels = [s.label for s in load_series([first, second])]
    assert labels == ["kimi-k2.6 on rtx-pro-6000-x8 (monday)", "kimi-k2.6 on rtx-pro-6000-x8 (tuesday)"]


def test_plain_bench_run_with_baseline_cells_and_no_facts(tmp_path: Path) -> None:
    path = write_run(tmp_path / "bench-1", {}, "ddtree", 8, 4)
    _, rows = write_report([path], tmp_path / "r.html")
    assert {r.series for r in rows} == {"bench-1"} and rows[0].speedup is None
    html = (tmp_path / "r.html").read_text()
    assert 'Speedup against concurrency</h2>\n<p class="note">No data for this plot' in html


def test_an_adaptive_budget_shows_the_budget_it_chose_at_each_concurrency(tmp_path: Path) -> None:
    """Each request's per-step budgets (meta_info `ddtree_budgets`, 0 an AR step) pooled per load point."""
    from rich.console import Console

    from specdeploy.report.tables import rows_tables

    path = tmp_path / "bench-auto"
    run = RunDirectory(path)
    manifest = RunManifest(run_id=path.name, created_unix=time.time(), specdeploy_version="test",
                           options={"dataset": "gsm8k"}, deployment={"mode": "ddtree", "budget": "auto"})  # fmt: skip
    run.create(manifest, {"target": None})
    chosen = {1: [[16, 16, 8], [16, 16, 16]], 8: [[0, 0, 4], [0, 4, 4, 0]]}  # per request, per verify step
    for c, budgets in chosen.items():
        key = CellKey(dataset="gsm8k", mode="ddtree", budget="auto", concurrency=c)
        mine = records(key, 4, 10.0, seed=c)
        for i, record in enumerate(mine):
            record.ddtree_budgets = budgets[i % 2]
        run.write_cell(CellSummary(key=key, metrics=cell_metrics(mine), finished_unix=time.time()), mine, {})
    series, rows = write_report([path], tmp_path / "r.html")
    by_c = {r.concurrency: r for r in rows}
    assert by_c[1].budget_chosen_mean == pytest.approx((40 / 3 + 16) / 2) and by_c[1].ar_step_share == 0
    assert by_c[8].budget_chosen_mean == pytest.approx(12 / 7) and by_c[8].ar_step_share == pytest.approx(
        4 / 7
    )
    console = Console(width=120, record=True)
    for table in rows_tables(rows, series):
        console.print(table)
    text = console.export_text()
    assert "14.7, AR 0%" in text and "1.7, AR 57%" in text
    assert "<th>budget chosen</th>" in (tmp_path / "r.html").read_text()


def test_pareto_front_keeps_only_undominated_points() -> None:
    points = [(100, 50), (200, 40), (150, 30), (300, 10), (50, 60), (200, 20)]
    assert pareto_front(points) == [(50, 60), (100, 50), (200, 40), (300, 10)]


def test_bad_report_inputs_say_what_to_give(tmp_path: Path) -> None:
    with pytest.raises(SpecdeployError, match="does not exist"):
        load_series([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecdeployError, match="holds no benchmark run"):
        load_series([tmp_path / "empty"])
    run = RunDirectory(tmp_path / "fresh")
    run.create(RunManifest(run_id="x", created_unix=0, specdeploy_version="t", options={}), {})
    with pytest.raises(SpecdeployError, match="no finished cell yet"):
        write_report([run.path], tmp_path / "r.html")
    result = CliRunner().invoke(app, ["report"])
    assert result.exit_code != 0


# /server_info as the reference server answers it (server/routes_info.py) and in SGLang's shape (its server
# arguments, scheduler info and `version`); trimmed to the fields the report reads and a few neighbours.
REFERENCE_SERVER_INFO = {
    "model_path": "/zoo/tiny-code/target",
    "speculative_algorithm": "DDTREE",
    "device": "cpu",
    "version": "0.1.0",
    "engine": {"name": "specdeploy-reference", "version": "0.1.0", "mode": "ddtree", "device": "cpu"},
}
SGLANG_SERVER_INFO = {
    "model_path": "moonshotai/Kimi-K2.6",
    "tp_size": 8,
    "nnodes": 1,
    "device": "cuda",
    "speculative_algorithm": "DFLASH",
    "internal_states": [{"avg_spec_accept_length": 3.1}],
    "version": "0.5.23",
}


@pytest.mark.parametrize(
    ("info", "engine", "hardware"),
    [
        (REFERENCE_SERVER_INFO, "specdeploy-reference 0.1.0", "cpu"),
        (SGLANG_SERVER_INFO, "sglang 0.5.23", "cuda, TP 8"),
    ],
)
def test_runs_without_a_deployment_name_engine_and_hardware_from_server_info(
    tmp_path: Path, info: dict, engine: str, hardware: str
) -> None:
    run = write_run(tmp_path / "bench", {}, "ar")
    (run / "server_info.json").write_text(json.dumps({"target": info}))
    (series,) = load_series([run])
    assert (series.fact("engine"), series.fact("hardware")) == (engine, hardware)
    result = CliRunner().invoke(app, ["report", str(run), "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert engine in result.output and hardware in result.output
    assert engine in (tmp_path / "r.html").read_text()
    result = CliRunner().invoke(app, ["report", str(run)])
    assert result.exit_code == 0 and (run / "report.html").is_file()  # beside the run, not in the cwd


def test_recorded_deployment_facts_win_over_server_info(tmp_path: Path) -> None:
    run = write_run(tmp_path / "bench", PCIE, "ar")
    (run / "server_info.json").write_text(json.dumps({"target": SGLANG_SERVER_INFO}))
    (series,) = load_series([run])
    assert (series.fact("engine"), series.fact("hardware")) == ("sglang 0.5.23", "rtx-pro-6000-x8")


def test_throughput_shows_half_the_range_of_its_repeats() -> None:
    """Two rounds that made 90 and 110 tok/s: their mean, and half their range as a share of it (10%); one
    repeat has no range to show."""
    from specdeploy.report.columns import tok_s_text
    from specdeploy.report.rows import ReportRow

    two = ReportRow.model_construct(output_tok_s=100.0, output_tok_s_by_repeat=[110.0, 90.0])
    one = ReportRow.model_construct(output_tok_s=1234.5, output_tok_s_by_repeat=[1234.5])
    assert tok_s_text(two) == "100.0 ±10%"
    assert tok_s_text(one) == "1,234.5"
