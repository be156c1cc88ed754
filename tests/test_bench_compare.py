"""`bench-selftest --compare`: judging a client by the server's log, and the table when clients are missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specdeploy.bench.compare import judge, log_itl_ms
from specdeploy.bench.fakeserver import StreamPlan
from specdeploy.bench.other_clients import CHUNK, MEAN, TOKEN, CellSpec, ClientReport, external_clients
from specdeploy.cli import app
from specdeploy.errors import SpecdeployError

PLAN = StreamPlan(ttft_s=0.02, gap_s=0.01, tokens_per_chunk=4, output_tokens=12)
MS = 1_000_000


def logged(start_ms: float) -> dict:
    """A request the server received at start_ms and answered in 3 chunks of 4 tokens, 20 ms then 10 ms apart."""
    writes = [start_ms + 20, start_ms + 30, start_ms + 42]  # the last gap is 12 ms: the server ran late
    return {
        "received_ns": int(start_ms * MS),
        "writes_ns": [int(w * MS) for w in writes],
        "tokens": [4, 8, 12],
    }


ENTRIES = [logged(0), logged(50)]
CELL = CellSpec("http://x", "m", 2, 2, 12, ("p", "p"), Path("."), Path("."))


def test_the_log_spreads_each_chunk_gap_over_its_tokens_or_averages_per_request() -> None:
    assert log_itl_ms([logged(0)], TOKEN) == pytest.approx([2.5] * 4 + [3.0] * 4)
    assert log_itl_ms([logged(0)], MEAN) == pytest.approx([22 / 8])


def test_a_client_is_judged_by_the_log_not_by_itself() -> None:
    # The client saw every first chunk 1.5 ms late and every token 0.25 ms apart more than the server wrote them.
    report = ClientReport(completed=2, errors=0, ttft_ms=[21.5, 21.5], itl_ms=[2.75] * 8 + [3.25] * 8)
    row = judge("c", TOKEN, report, ENTRIES, cpu_s=0.004, cell=CELL, plan=PLAN)
    assert row.ttft_error_ms == pytest.approx((1.5, 1.5))
    assert row.itl_error_ms == pytest.approx((0.25, 0.25))
    assert row.requests_per_s == pytest.approx(
        2 / 0.092
    )  # from the first arrival (0) to the last write (92 ms)
    assert row.ideal_requests_per_s == pytest.approx(2 / PLAN.request_s)
    assert row.cpu_ms_per_request == pytest.approx(2.0)


def test_a_per_chunk_itl_is_judged_against_tokens_and_a_mean_against_means() -> None:
    chunk_gaps = ClientReport(completed=2, errors=0, ttft_ms=[20, 20], itl_ms=[10, 12, 10, 12])
    per_chunk = judge("c", CHUNK, chunk_gaps, ENTRIES, None, CELL, PLAN)
    assert per_chunk.itl_error_ms[0] == pytest.approx(11 - 2.75)  # the chunk gap is 4 tokens' time
    means = ClientReport(completed=2, errors=0, ttft_ms=[20, 20], itl_ms=[22 / 8, 22 / 8])
    assert judge("c", MEAN, means, ENTRIES, None, CELL, PLAN).itl_error_ms == pytest.approx((0, 0))


def test_sglang_means_both_of_its_backends_and_unknown_names_are_refused() -> None:
    assert [c.name for c in external_clients(["sglang", "aiperf", "sglang"])] == [
        "sglang",
        "sglang-oai",
        "aiperf",
    ]
    with pytest.raises(SpecdeployError, match="unknown: vegeta"):
        external_clients(["aiperf", "vegeta"])


def test_missing_clients_are_named_with_their_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "PATH", str(tmp_path)
    )  # neither aiperf nor guidellm on it, nor in the empty clients dir
    args = ["bench-selftest", "--concurrency", "2", "--rounds", "1", "--ttft-ms", "5", "--gap-ms", "2"]
    args += [
        "--output-tokens",
        "8",
        "--compare",
        "aiperf,guidellm",
        "--clients-dir",
        str(tmp_path / "clients"),
    ]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out["missing"]) == {"aiperf", "guidellm"}
    assert f"{tmp_path / 'clients'}/aiperf/bin/pip install aiperf==0.13.0" in out["missing"]["aiperf"]
    assert [row["client"] for row in out["rows"]] == ["specdeploy", "specdeploy-oai"]
    for row in out["rows"]:
        assert row["completed"] == row["planned"] == 2
        assert row["ttft_error_ms"] is not None and row["cpu_ms_per_request"] > 0
    table = CliRunner().invoke(app, args, env={"COLUMNS": "200", "PATH": str(tmp_path)})
    assert table.exit_code == 0, table.output
    assert "aiperf: not installed, skipped; install it with:" in table.output
    assert "specdeploy-oai" in table.output and "req/s (plan)" in table.output
