"""Servers whose command was killed before it could stop them: found and stopped, whatever killed it.

A command that promises to stop the servers it starts (campaign, demo) leaves a lease for each: a small file
naming the server's deployment directory and the command's process. Ctrl-C and SIGTERM unwind normally and
remove the lease; SIGKILL (or an OOM kill, or a lost terminal) cannot. Then two things stop the server:

- a watchdog process the command started beside itself, in its own session, which outlives the kill and
  stops the command's servers within seconds of its death;
- failing that (the watchdog was killed too), the next `specdeploy` command of any kind, which stops every
  server whose lease names a dead process, and says so.

This module stays light at import (no httpx, no deploy modules): `specdeploy --help` runs `reap_orphans` too.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from specdeploy.deploy.processes import ProcessIdentity, identify, leader_alive
from specdeploy.errors import SpecdeployError

LEASES_ENV = "SPECDEPLOY_LEASES"  # where leases live (tests point it at a temporary directory)
WATCH_POLL_S = 2.0


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


def _leases() -> Iterator[tuple[Path, Path, ProcessIdentity]]:
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


def reap_orphans(say: Callable[[str], None], owner_pid: int | None = None) -> list[Path]:
    """Stop every leased server whose owner is dead (only `owner_pid`'s, when given); returns their
    deployment directories."""
    reaped = []
    for path, deploy_dir, owner in _leases():
        if (owner_pid is not None and owner.pid != owner_pid) or leader_alive(owner):
            continue
        try:
            stopped = _stop_if_running(deploy_dir)
        except (SpecdeployError, OSError) as exc:  # never let one bad record stop every command
            say(f"could not stop the server in {deploy_dir} ({exc}): `specdeploy down {deploy_dir}`")
            stopped = False
        if stopped:
            reaped.append(deploy_dir)
            say(
                f"stopped a server left running by a killed specdeploy command (pid {owner.pid}): {deploy_dir}; "
                "a campaign continues with --resume"
            )
        path.unlink(missing_ok=True)
    return reaped


def _stop_if_running(deploy_dir: Path) -> bool:
    from specdeploy.deploy.deployment import deploy_down, load_deployment
    from specdeploy.deploy.launchers import get_launcher
    from specdeploy.deploy.manifest import STATE_FILE

    if not (deploy_dir / STATE_FILE).is_file():
        return False  # killed before the launcher started anything
    deployment = load_deployment(deploy_dir)
    if deployment.record.state not in ("starting", "running"):
        return False
    alive = get_launcher(deployment.handle.launcher).is_running(deployment.handle)
    deploy_down(
        deployment
    )  # also when the leader is gone: its workers may hold the GPUs, and the state says so
    return alive


@contextmanager
def orphan_watch() -> Iterator[ProcessIdentity]:
    """This process as the owner of the servers it leases, with a watchdog that stops them if it is killed."""
    owner = identify(os.getpid())
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "specdeploy.deploy.orphans", str(owner.pid)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a kill of this command's process group leaves the watchdog standing
    )
    try:
        yield owner
    finally:
        watchdog.kill()  # the command stops its own servers on any way out it lives through
        watchdog.wait()


def watch(owner_pid: int) -> None:
    """The watchdog: wait for the owner to die, then stop the servers it leased."""
    owner = identify(owner_pid)
    while leader_alive(owner):
        time.sleep(WATCH_POLL_S)
    reap_orphans(lambda _: None, owner_pid)


if __name__ == "__main__":
    watch(int(sys.argv[1]))
