"""The runner end to end against loopback servers: paired baseline, files, death mid-cell, resume."""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path

import pytest

from specdeploy.bench.fakeserver import FakeServer, ServerThread, StreamPlan
from specdeploy.bench.results import INCOMPLETE_FILE, SUMMARY_SCHEMA, RequestRecord, RunDirectory
from specdeploy.bench.runner import BenchConfig, labelled_from_server, run
from specdeploy.errors import SpecdeployError

GAP = 0.01


def custom_prompts(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "prompts.jsonl"
    rows = [{"prompt": f"question {i}"} for i in range(n)]
    rows.append(
        {"id": "two-turns", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}
    )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def config(url: str, data: Path, **overrides: object) -> BenchConfig:
    values = dict(
        url=url,
        dataset="custom",
        data_dir=str(data),
        concurrency=[1, 3],
        warmup=1,
        max_new_tokens=16,
        chat_template=False,
        mode="dflash",
    )
    values.update(overrides)
    return BenchConfig(**values)


def test_paired_baseline_gives_speedup_tau_and_match(tmp_path: Path) -> None:
    # Same pace per chunk; the target sends 2 tokens per chunk, so it is twice as fast per token.
    target = ServerThread(
        FakeServer(StreamPlan(ttft_s=GAP, gap_s=GAP, tokens_per_chunk=2, output_tokens=16))
    ).start()
    baseline = ServerThread(
        FakeServer(StreamPlan(ttft_s=GAP, gap_s=GAP, tokens_per_chunk=1, output_tokens=16))
    ).start()
    try:
        data = custom_prompts(tmp_path, 5)
        summary = run(config(target.url, data, baseline_url=baseline.url, repeats=2), tmp_path / "run")
    finally:
        target.stop()
        baseline.stop()
    assert target.server.flushes == baseline.server.flushes == 4  # one per cell
    run_dir = RunDirectory(tmp_path / "run")
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["schema"] == SUMMARY_SCHEMA
    assert run_dir.read_server_info()["baseline"]["plan"]["tokens_per_chunk"] == 1
    assert run_dir.read_manifest().options["baseline_url"] == baseline.url
    assert len(summary.cells) == 8
    cell = summary.cells["target/custom/dflash/c3/rep1"]
    assert cell.metrics.n_requests == 7 and cell.metrics.n_errors == 0  # 6 prompts, one with two turns
    assert cell.metrics.tau.mean == pytest.approx(2.0)
    assert summary.cells["baseline/custom/-/c3/rep1"].metrics.tau.mean == pytest.approx(1.0)
    assert cell.comparison.baseline_cell == "baseline/custom/-/c3/rep1"
    assert cell.comparison.output_match_rate == 1.0 and cell.comparison.n_compared == 7
    for point in ("target/custom/dflash/c1", "target/custom/dflash/c3"):
        assert summary.speedups[point].baseline_cell == point.replace("target", "baseline").replace(
            "dflash", "-"
        )
        pooled = summary.speedups[point].speedup
        assert pooled.n_pairs == 14
        assert 1.5 < pooled.estimate < 2.2 and pooled.low <= pooled.estimate <= pooled.high
    records = run_dir.read_records("target/custom/dflash/c1/rep0")
    second_turn = next(r for r in records if r.prompt_id == "two-turns" and r.turn == 1)
    assert (
        second_turn.ok
        and second_turn.start_ns > next(r for r in records if r.prompt_id == "two-turns").start_ns
    )


def test_server_death_keeps_records_and_resume_fills_the_gap(tmp_path: Path) -> None:
    plan = StreamPlan(ttft_s=GAP, gap_s=GAP, tokens_per_chunk=2, output_tokens=8)
    first = ServerThread(FakeServer(plan)).start()
    port = first.port
    # 1 warmup + 7 requests in cell c1; die during the 4th request of cell c3.
    first.server.on_request = lambda n: n == 12 and threading.Thread(target=first.stop).start()
    data = custom_prompts(tmp_path, 5)
    out = tmp_path / "run"
    with pytest.raises(SpecdeployError, match="stopped answering during cell target/custom/dflash/c3/rep0"):
        run(config(first.url, data), out)
    run_dir = RunDirectory(out)
    assert run_dir.finished_cells() == {"target/custom/dflash/c1/rep0"}
    kept = [
        RequestRecord.model_validate_json(line) for line in (out / INCOMPLETE_FILE).read_text().splitlines()
    ]
    assert kept and {r.cell for r in kept} == {"target/custom/dflash/c3/rep0"}
    assert any(r.error for r in kept) and any(r.ok for r in kept)

    with pytest.raises(SpecdeployError, match="differ from the run"):
        run(config(first.url, data, max_new_tokens=8), out, resume=True)
    second = ServerThread(FakeServer(plan), port=port).start()
    try:
        summary = run(config(second.url, data), out, resume=True)
    finally:
        second.stop()
    assert set(summary.cells) == {"target/custom/dflash/c1/rep0", "target/custom/dflash/c3/rep0"}
    assert second.server.requests == 1 + 7  # warmup and the missing cell only
    keys = Counter((r.cell, r.prompt_id, r.turn) for r in run_dir.read_records())
    assert len(keys) == 14 and set(keys.values()) == {1}
    assert all(r.ok for r in run_dir.read_records())


def test_torn_write_is_recovered_on_resume(tmp_path: Path) -> None:
    server = ServerThread(FakeServer(StreamPlan(ttft_s=GAP, gap_s=GAP, output_tokens=4))).start()
    try:
        data = custom_prompts(tmp_path, 2)
        out = tmp_path / "run"
        run(config(server.url, data, concurrency=[2]), out, deployment={"plan": "argv"})
        assert RunDirectory(out).read_manifest().deployment == {"plan": "argv"}
        with pytest.raises(SpecdeployError, match="already holds a run"):
            run(config(server.url, data, concurrency=[2]), out)
        lines = (out / "requests.jsonl").read_text().splitlines()
        stray = json.loads(lines[0]) | {"cell": "target/custom/dflash/c4/rep0"}
        with (out / "requests.jsonl").open(
            "a"
        ) as f:  # a cell that crashed before its summary, and a torn line
            f.write(json.dumps(stray) + "\n" + lines[1][:40])
        summary = run(config(server.url, data, concurrency=[2]), out, resume=True)
    finally:
        server.stop()
    assert list(summary.cells) == ["target/custom/dflash/c2/rep0"]
    assert (out / "requests.jsonl").read_text().splitlines() == lines


def test_poisson_rate_cell_and_baseline_run_directory(tmp_path: Path) -> None:
    plan = StreamPlan(ttft_s=GAP, gap_s=GAP, tokens_per_chunk=1, output_tokens=6)
    server = ServerThread(FakeServer(plan)).start()
    try:
        data = custom_prompts(tmp_path, 4)
        ar = run(config(server.url, data, concurrency=[], request_rates=[50.0], mode="ar"), tmp_path / "ar")
        spec = run(
            config(server.url, data, concurrency=[], request_rates=[50.0], baseline_run=str(tmp_path / "ar")),
            tmp_path / "spec",
        )
    finally:
        server.stop()
    assert list(ar.cells) == ["target/custom/ar/rate50/rep0"]
    comparison = spec.cells["target/custom/dflash/rate50/rep0"].comparison
    assert comparison.baseline_cell == "target/custom/ar/rate50/rep0"
    assert comparison.n_compared == 6 and comparison.output_match_rate == 1.0
    assert 0.7 < comparison.speedup.estimate < 1.4  # the same server on both sides


def test_bad_options_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SpecdeployError, match="not a server URL"):
        run(config("localhost:30000", tmp_path), tmp_path / "x")
    with pytest.raises(SpecdeployError, match="nothing to resume"):
        run(config("http://127.0.0.1:9", tmp_path), tmp_path / "x", resume=True)
    with pytest.raises(SpecdeployError, match="no server answers"):
        run(config("http://127.0.0.1:9", custom_prompts(tmp_path, 1)), tmp_path / "x")


# /server_info as each engine answers it (the fields read; see server/routes_info.py and SGLang's server_info).
REFERENCE_DDTREE = {
    "speculative_algorithm": "DDTREE",
    "engine": {"name": "specdeploy-reference", "mode": "ddtree", "budget": 16},
}
REFERENCE_AR = {
    "speculative_algorithm": None,
    "engine": {"name": "specdeploy-reference", "mode": "ar", "budget": None},
}
SGLANG_DFLASH = {"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 8}
SGLANG_AR = {"speculative_algorithm": None}


@pytest.mark.parametrize(
    ("mode", "budget", "info", "message"),
    [
        ("dflash", None, REFERENCE_DDTREE, "--mode dflash, but the server at .* runs ddtree"),
        ("ddtree", 8, REFERENCE_DDTREE, "--budget 8, but the server at .* runs DDTree with budget 16"),
        ("ddtree", None, REFERENCE_AR, "--mode ddtree, but the server at .* runs ar"),
        ("ar", None, SGLANG_DFLASH, "--mode ar, but the server at .* runs DFLASH speculative decoding"),
        ("dflash", None, SGLANG_AR, "--mode dflash, but the server at .* runs ar"),
    ],
)
def test_mode_and_budget_that_contradict_the_server_are_refused(mode, budget, info, message):
    config = BenchConfig(url="http://127.0.0.1:1", dataset="custom", mode=mode, budget=budget)
    with pytest.raises(SpecdeployError, match=message):
        labelled_from_server(config, info)


def test_mode_and_budget_left_out_are_taken_from_the_server():
    config = BenchConfig(url="http://127.0.0.1:1", dataset="custom")
    assert labelled_from_server(config, REFERENCE_DDTREE).mode == "ddtree"
    assert labelled_from_server(config, REFERENCE_DDTREE).budget == 16
    assert labelled_from_server(config, SGLANG_AR).mode == "ar"
    # SGLang's algorithm names vary with the build: a speculating SGLang server leaves the label to the user.
    assert labelled_from_server(config, SGLANG_DFLASH).mode == ""
    given = config.model_copy(update={"mode": "dflash"})
    assert labelled_from_server(given, SGLANG_DFLASH) == given
    assert labelled_from_server(given, None) == given  # a server without /server_info: nothing to check
