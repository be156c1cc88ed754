"""Fixtures shared across test modules."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def random_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny random Qwen3 target and DFlash drafter (block size 8), written once per test session."""
    from specdeploy.zoo.random_pair import write_random_pair

    return write_random_pair(tmp_path_factory.mktemp("random_pair"), "qwen3", seed=0, block_size=8)
