"""`specdeploy demo`: reference servers for AR, DFlash and DDTree, bench against AR, a report; every server
stopped afterwards, also when the demo is interrupted."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specdeploy.bench.results import RunDirectory
from specdeploy.cli import app
from specdeploy.demo.flow import free_ports
from specdeploy.deploy.deployment import deployment_status, load_deployment
from specdeploy.deploy.manifest import STATE_FILE

SERVERS = ("ar", "dflash", "ddtree-8")


def assert_servers_stopped(out: Path, labels: tuple[str, ...]) -> None:
    for label in labels:
        deployment = load_deployment(out / "servers" / label)
        status = deployment_status(deployment)
        assert status["state"] in ("stopped", "failed") and not status["alive"], (label, status)


def test_demo_serves_benches_reports_and_stops_its_servers(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    argv = ["demo", "--num-prompts", "2", "--max-new-tokens", "16", "--repeats", "1", "--budget", "8"]
    result = CliRunner().invoke(app, [*argv, "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["report"] == str(out / "report.html") and (out / "report.html").is_file()
    rows = {row["mode"]: row for row in document["rows"]}
    assert list(rows) == ["ar", "dflash", "ddtree"] and rows["ddtree"]["budget"] == 8
    ar_run = RunDirectory(out / "ar")
    baseline = {r.prompt_id: r for r in ar_run.read_records()}
    assert len(baseline) == 2
    for mode in ("dflash", "ddtree"):
        row, run = rows[mode], RunDirectory(out / ("ddtree-8" if mode == "ddtree" else mode))
        target = run.read_records()
        assert len(target) == 2 and all(r.cell.startswith("target/") for r in target)
        assert all(
            c.comparison.baseline_cell.startswith("target/") for c in run.read_summary().cells.values()
        )
        # Greedy speculation reproduces AR exactly, and the row says so.
        assert all(r.output_text == baseline[r.prompt_id].output_text for r in target)
        assert row["greedy_match"] == 1.0
        taus = [r.spec_accept_length for r in target]
        assert row["tau"] == pytest.approx(sum(taus) / len(taus)) and row["tau"] >= 1.0
        low, high = row["speedup_ci"]
        assert low <= row["speedup"] <= high and row["tokens_per_s"] > 0
    # One AR figure: the AR run's, the baseline every speedup was paired with.
    (ar_cell,) = ar_run.read_summary().cells.values()
    assert rows["ar"]["tokens_per_s"] == pytest.approx(ar_cell.metrics.output_tok_s)
    html = (out / "report.html").read_text()
    assert "ddtree b8" in html and "dflash" in html and "<img" in html
    assert_servers_stopped(out, SERVERS)


@pytest.mark.slow
def test_demo_prints_the_table_and_the_reports_path(tmp_path: Path) -> None:
    argv = ["demo", "--prompts", "1", "--max-new-tokens", "16", "--repeats", "1", "--budget", "8"]
    result = CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "demo")])
    assert result.exit_code == 0, result.output
    for text in (
        "ddtree (budget 8)",
        "dflash",
        "baseline",
        "100%",
        f"report: {tmp_path / 'demo' / 'report.html'}",
    ):
        assert text in result.output


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_demo_stops_the_servers_it_started(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "demo"
    command = [
        sys.executable,
        "-m",
        "specdeploy.cli",
        "demo",
        "--prompts",
        "8",
        "--repeats",
        "5",
        "--out",
        str(out),
    ]
    demo = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while not any(
            deployment_status(load_deployment(d))["healthy"] for d in started_servers(out, "dflash")
        ):
            assert demo.poll() is None and time.monotonic() < deadline, (
                "the dflash server never became healthy"
            )
            time.sleep(0.5)
        os.kill(demo.pid, sig)
        output, _ = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:  # the test failed before its signal: the demo stops its servers on SIGTERM
            demo.terminate()
            demo.communicate(timeout=120)
    assert demo.returncode != 0, output
    started = tuple(d.name for d in started_servers(out))
    assert "ar" in started and "dflash" in started
    assert_servers_stopped(out, started)


def started_servers(out: Path, name: str = "*") -> list[Path]:
    """The demo's server folders in which a deployment was recorded."""
    return [d for d in (out / "servers").glob(name) if (d / STATE_FILE).is_file()]


@pytest.mark.slow
def test_the_default_demo_finishes_within_five_minutes(tmp_path: Path) -> None:
    started = time.monotonic()
    command = [sys.executable, "-m", "specdeploy.cli", "demo", "--json", "--out", str(tmp_path / "demo")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert elapsed < 300, f"the demo took {elapsed:.0f} s"
    assert [row["mode"] for row in document["rows"]] == ["ar", "dflash", "ddtree"]
    assert all(row["greedy_match"] == 1.0 for row in document["rows"][1:])


def test_servers_get_distinct_free_ports() -> None:
    ports = free_ports(3)
    assert len(set(ports)) == 3
    for port in ports:
        with socket.create_server(("127.0.0.1", port)):
            pass
