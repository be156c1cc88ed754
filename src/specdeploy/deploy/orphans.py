"""Servers whose command was killed before it could stop them: found and stopped, whatever killed it.

A command that promises to stop the servers it starts (campaign, demo) leaves a lease for each
(`deploy.leases`): a small file naming the server's deployment directory and the command's process. Ctrl-C and
SIGTERM unwind normally and remove the lease; SIGKILL (or an OOM kill, or a lost terminal) cannot. Then two things
stop the server:

- a watchdog process the command started beside itself, in its own session, which outlives the kill and
  stops the command's servers within seconds of its death;
- failing that (the watchdog was killed too), the next `specdeploy` command of any kind, which stops every
  server whose lease names a dead process, and says so.

This module stays light at import (no httpx; of the deploy modules only `leases` and `processes`, the deployment
itself when a server is to be stopped): `specdeploy --help` runs `reap_orphans` too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from specdeploy.deploy.leases import leases
from specdeploy.deploy.processes import ProcessIdentity, identify, leader_alive
from specdeploy.errors import SpecdeployError

WATCH_POLL_S = 2.0


def reap_orphans(say: Callable[[str], None], owner_pid: int | None = None) -> list[Path]:
    """Stop every leased server whose owner is dead (only `owner_pid`'s, when given); returns their
    deployment directories."""
    reaped = []
    for path, deploy_dir, owner in leases():
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
