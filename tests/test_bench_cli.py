"""`specdeploy bench` and `specdeploy bench-selftest` through the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specdeploy.bench.fakeserver import FakeServer, ServerThread, StreamPlan
from specdeploy.cli import app, main


def test_bench_command_prints_tables_and_writes_the_run(tmp_path: Path) -> None:
    target = ServerThread(
        FakeServer(StreamPlan(ttft_s=0.01, gap_s=0.01, tokens_per_chunk=3, output_tokens=9))
    ).start()
    baseline = ServerThread(
        FakeServer(StreamPlan(ttft_s=0.01, gap_s=0.01, tokens_per_chunk=1, output_tokens=9))
    ).start()
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(3)))
    args = ["bench", "--url", target.url, "--baseline-url", baseline.url, "--dataset", "custom"]
    args += ["--data-dir", str(prompts), "--no-chat-template", "--concurrency", "1,2", "--mode", "ddtree"]
    args += ["--budget", "8", "--out", str(tmp_path / "run")]
    try:
        result = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
        as_json = CliRunner().invoke(app, [*args[:-2], "--out", str(tmp_path / "run2"), "--json"])
    finally:
        target.stop()
        baseline.stop()
    assert result.exit_code == 0, result.output
    assert "target custom ddtree b=8" in result.output and "speedup per load point" in result.output
    assert (tmp_path / "run" / "requests.jsonl").is_file() and (tmp_path / "run" / "manifest.json").is_file()
    summary = json.loads(as_json.stdout)
    assert summary["schema"] == "specdeploy.summary/1"
    assert summary["cells"]["target/custom/ddtree/b8/c2/rep0"]["metrics"]["tau"]["mean"] == pytest.approx(3.0)


def test_bench_errors_are_one_line_with_status_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        "sys.argv",
        ["specdeploy", "bench", "--url", "http://127.0.0.1:9", "--dataset", "gsm8k", "--route", "grpc"],
    )
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr().err.strip() == "error: --route must be generate, chat or completions, got 'grpc'"
    )


def test_selftest_reports_a_sustained_rate_close_to_the_truth() -> None:
    args = [
        "bench-selftest",
        "--concurrency",
        "1,8",
        "--ttft-ms",
        "10",
        "--gap-ms",
        "5",
        "--output-tokens",
        "16",
    ]
    result = CliRunner().invoke(app, [*args, "--rounds", "2", "--json"])
    assert result.exit_code == 0, result.output
    levels = json.loads(result.stdout)["levels"]
    assert [level["concurrency"] for level in levels] == [1, 8]
    for level in levels:
        assert level["errors"] == 0 and level["requests"] == 2 * level["concurrency"]
        assert level["tokens_per_s"] > 0.3 * level["ideal_tokens_per_s"]
        assert level["chunk_lag_ms"]["n"] == level["requests"] * 4
        assert abs(level["chunk_lag_ms"]["p50"]) < 20
