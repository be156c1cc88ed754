"""Fixtures shared across test modules."""

from __future__ import annotations

import os
import stat
import sys

# Test models are tiny: one thread per process beats several fighting over CI's two cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

# SGLang 0.5.23 ships a cp311 wheel only: setup.sh installs its argument parser on Python 3.11 alone. Tests
# marked `sglang_parser` fail there when it is missing; on any other Python they are deselected, and the
# run says so in its header and summary.
SGLANG_PARSER_PYTHON = (3, 11)
SGLANG_DESELECTED = pytest.StashKey[int]()


def sglang_deselection_reason(count: int) -> str:
    return (
        f"deselected {count} sglang_parser tests: SGLang 0.5.23's parser is a cp311 wheel, which setup.sh "
        f"installs on Python {'.'.join(map(str, SGLANG_PARSER_PYTHON))} only "
        f"(this is {sys.version_info.major}.{sys.version_info.minor})"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if sys.version_info[:2] == SGLANG_PARSER_PYTHON:
        return
    marked = [item for item in items if item.get_closest_marker("sglang_parser")]
    if marked:
        items[:] = [item for item in items if not item.get_closest_marker("sglang_parser")]
        config.hook.pytest_deselected(items=marked)
        config.stash[SGLANG_DESELECTED] = len(marked)
        print(f"\n{sglang_deselection_reason(len(marked))}", file=sys.stderr)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    count = config.stash.get(SGLANG_DESELECTED, 0)
    if count:
        terminalreporter.write_line(sglang_deselection_reason(count), yellow=True, bold=True)


@pytest.fixture(scope="session")
def random_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny random Qwen3 target and DFlash drafter (block size 8), written once per test session."""
    from specdeploy.zoo.random_pair import write_random_pair

    return write_random_pair(tmp_path_factory.mktemp("random_pair"), "qwen3", seed=0, block_size=8)


@pytest.fixture
def fake_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`docker` on PATH is tests/fixtures/fake_docker.py; returns its state directory."""
    bin_dir, state = tmp_path / "bin", tmp_path / "docker-state"
    bin_dir.mkdir()
    state.mkdir()
    docker = bin_dir / "docker"
    fake = Path(__file__).parent / "fixtures" / "fake_docker.py"
    docker.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fake}" "$@"\n')
    docker.chmod(docker.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_STATE", str(state))
    return state
