"""End to end against the reference server (`specdeploy serve`) with a random tiny pair, ar vs ddtree.

Slow: two CPU servers decode real (tiny) models; the fake-server tests cover the same logic quickly.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from specdeploy.bench.results import RunDirectory
from specdeploy.bench.runner import BenchConfig, run
from specdeploy.bench.selftest import free_port
from specdeploy.errors import SpecdeployError

pytestmark = pytest.mark.slow


@contextmanager
def reference_server(port: int, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    argv = [
        sys.executable,
        "-m",
        "specdeploy.cli",
        "serve",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *args,
    ]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert process.poll() is None, f"specdeploy serve exited with {process.returncode}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield process
    finally:
        process.kill()
        process.wait(30)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from specdeploy.zoo.random_pair import write_random_pair

    return write_random_pair(tmp_path_factory.mktemp("pair"))


def test_ar_vs_ddtree_with_a_server_killed_mid_run(pair: tuple[Path, Path], tmp_path: Path) -> None:
    target_dir, draft_dir = pair
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": p}) + "\n" for p in ("Hello there", "Write a poem", "1+1="))
    )
    ar_port, tree_port = free_port(), free_port()
    tree_args = ("--target", str(target_dir), "--draft", str(draft_dir), "--mode", "ddtree", "--budget", "8")
    config = BenchConfig(
        url=f"http://127.0.0.1:{tree_port}",
        baseline_url=f"http://127.0.0.1:{ar_port}",
        dataset="custom",
        data_dir=str(prompts),
        concurrency=[1, 2],
        max_new_tokens=12,
        warmup=1,
        mode="ddtree",
        budget=8,
    )
    out = tmp_path / "run"
    with reference_server(ar_port, "--target", str(target_dir)):
        with reference_server(tree_port, *tree_args) as tree:

            def kill_when_c1_is_done() -> None:
                summary = out / "summary.json"
                while tree.poll() is None:
                    if summary.is_file() and "baseline/custom/-/c2/rep0" in summary.read_text():
                        tree.kill()
                    time.sleep(0.05)

            watcher = threading.Thread(target=kill_when_c1_is_done, daemon=True)
            watcher.start()
            with pytest.raises(
                SpecdeployError, match="stopped answering during cell target/custom/ddtree/b8/c2"
            ):
                run(config, out)
        run_dir = RunDirectory(out)
        assert len(run_dir.finished_cells()) == 3
        with reference_server(tree_port, *tree_args):
            summary = run(config, out, resume=True)

    info = run_dir.read_server_info()
    assert (
        info["target"]["speculative_algorithm"] == "DDTREE"
        and info["baseline"]["speculative_algorithm"] is None
    )
    # read again after the resumed run's last cell, from the servers that measured it
    after = json.loads((run_dir.path / "server_info_after.json").read_text())
    assert (
        after["target"]["speculative_algorithm"] == "DDTREE"
        and after["baseline"]["speculative_algorithm"] is None
    )
    assert len(summary.cells) == 4
    # each finished cell's server state once, the failed attempt's not; each counts its own cell's work
    states = [json.loads(line) for line in (run_dir.path / "server_states.jsonl").read_text().splitlines()]
    assert sorted(state["cell"] for state in states) == sorted(summary.cells)
    for state in states:
        loop = state["internal_states"][0]["engine_loop"]
        requests = summary.cells[state["cell"]].metrics.n_requests
        assert loop["prefill_tokens"] > 0 and requests <= loop["iterations"] <= requests * 13
    for concurrency in (1, 2):
        cell = summary.cells[f"target/custom/ddtree/b8/c{concurrency}/rep0"]
        assert cell.metrics.n_errors == 0 and cell.metrics.tau.mean >= 1.0
        assert cell.comparison.n_compared == 3 and cell.comparison.speedup.estimate > 0
        # Tree verification keeps greedy outputs identical to plain decoding.
        assert cell.comparison.output_match_rate == 1.0
    keys = Counter((r.cell, r.prompt_id) for r in run_dir.read_records())
    assert len(keys) == 12 and set(keys.values()) == {1}
