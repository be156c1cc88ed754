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
