"""Helpers for the zoo's tests: a tiny training run's settings, a code snippet and a fake installed package."""

from __future__ import annotations

import base64
import hashlib
import importlib
from pathlib import Path

import pytest

from specdeploy.zoo.settings import TrainSettings

# A run that trains every stage in a few CPU seconds; steps end every stage (the minutes never do), so its
# schedule and results are the same however it is cut into chunks.
TINY_SETTINGS = TrainSettings(
    scale=0.25,
    target_minutes=1000.0,
    target_steps=24,
    target_batch=4,
    seq_len=64,
    target_lr=3e-3,
    rollouts=12,
    rollout_batch=4,
    rollout_prompt=16,
    rollout_new_tokens=40,
    draft_minutes=1000.0,
    draft_steps=8,
    draft_batch=4,
    blocks_per_sequence=4,
)

CODE = "def add(a, b):\n    return a + b\n\n\nclass Box:\n    def __init__(self, item):\n        self.item = item\n"


def install_fake_package(
    site: Path, modules: dict[str, bytes], monkeypatch: pytest.MonkeyPatch, version: str = "1.2.0"
) -> Path:
    """A distribution `zoofake` as pip leaves it in site-packages (its files and a RECORD with their hashes),
    importable for the rest of the test; returns the site folder."""
    info = site / f"zoofake-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: zoofake\nVersion: {version}\n")
    record = []
    for name, data in modules.items():
        path = site / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record += [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,", "../../bin/zoofake-cli.py,,"]
    (info / "RECORD").write_text("\n".join(record) + "\n")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    return site
