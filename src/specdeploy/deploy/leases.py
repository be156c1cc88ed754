"""Leases: a small file per server that a command promised to stop, naming the server's deployment directory and
the command's process (`deploy.orphans` stops the servers of dead owners). Taken before a server starts and
released when it stops; nothing heavy is imported here, as `specdeploy --help` reads the leases too.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from specdeploy.deploy.processes import ProcessIdentity

LEASES_ENV = "SPECDEPLOY_LEASES"  # where leases live (tests point it at a temporary directory)


def leases_dir() -> Path:
    root = os.environ.get("SPECDEPLOY_CACHE") or str(Path.home() / ".cache" / "specdeploy")
    return Path(os.environ.get(LEASES_ENV) or Path(root) / "leases")


def _lease_path(deploy_dir: Path) -> Path:
    key = hashlib.sha256(str(deploy_dir.resolve()).encode()).hexdigest()[:16]
    return leases_dir() / f"{key}.json"


def take_lease(deploy_dir: Path, owner: ProcessIdentity) -> None:
    """Record that `owner` will stop the server in `deploy_dir` (written before the server starts)."""
    path = _lease_path(deploy_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    document = {"deploy_dir": str(deploy_dir.resolve()), "owner": owner.model_dump()}
    partial.write_text(json.dumps(document) + "\n", encoding="utf-8")
    partial.replace(path)


def release_lease(deploy_dir: Path) -> None:
    _lease_path(deploy_dir).unlink(missing_ok=True)


def leases() -> Iterator[tuple[Path, Path, ProcessIdentity]]:
    """(lease file, deployment directory, owner) of every lease; unreadable ones are dropped."""
    directory = leases_dir()
    if not directory.is_dir():
        return
    for path in sorted(directory.glob("*.json")):
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
            yield path, Path(document["deploy_dir"]), ProcessIdentity.model_validate(document["owner"])
        except (OSError, ValueError, KeyError):
            path.unlink(missing_ok=True)  # half written by a killed command, or not ours: nothing to stop
