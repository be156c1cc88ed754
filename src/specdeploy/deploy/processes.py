"""Find and signal a server's process group again from a later command, without ever hitting a stranger.

A recorded pid alone is not enough: after the server exits (or the machine reboots) the number can
belong to an unrelated process. The leader's start time and the boot id pin down the process we started.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from pydantic import BaseModel

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class ProcessIdentity(BaseModel):
    pid: int  # also the process group id: servers start in a new session
    start_ticks: int | None  # from /proc/PID/stat; None where /proc is not available
    boot_id: str | None


def _stat_fields(pid: int | str) -> list[str] | None:
    """/proc/PID/stat from field 3 (state) on; None if unknown or gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: count fields after the last ")".
    return stat.rsplit(")", 1)[1].split()


def start_ticks(pid: int) -> int | None:
    """When `pid` started, in clock ticks since boot (Linux); None if unknown or gone."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def _live_group_members(pgid: int) -> list[int] | None:
    """Pids in group `pgid` that are not zombies (a container's pid 1 may never reap them); None without /proc."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    members = []
    for entry in proc.iterdir():
        fields = _stat_fields(entry.name) if entry.name.isdigit() else None
        if fields and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def boot_id() -> str | None:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return None


def identify(pid: int) -> ProcessIdentity:
    return ProcessIdentity(pid=pid, start_ticks=start_ticks(pid), boot_id=boot_id())


def _reap(pid: int) -> None:
    """Collect the exit status when the process is our own child, so that it does not linger as a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # started by an earlier command: init reaps it


def _pid_is_ours(identity: ProcessIdentity) -> bool:
    """False when the pid now names another process (reused after ours exited, or after a reboot)."""
    if identity.boot_id is not None and identity.boot_id != boot_id():
        return False
    ticks = start_ticks(identity.pid)
    return ticks is None or identity.start_ticks is None or ticks == identity.start_ticks


def leader_alive(identity: ProcessIdentity) -> bool:
    _reap(identity.pid)
    fields = _stat_fields(identity.pid)
    if fields is not None:
        return fields[0] != "Z" and _pid_is_ours(identity)
    try:
        os.kill(identity.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return _pid_is_ours(identity)
    return _pid_is_ours(identity)


def group_alive(identity: ProcessIdentity) -> bool:
    """Any process left in the server's group: workers can outlive a crashed leader and hold GPUs."""
    # While any member lives, Linux keeps the group id from being reused as a pid, so this cannot be a
    # stranger's group unless the leader's pid names a different process now.
    if not _pid_is_ours(identity):
        return False
    _reap(identity.pid)
    members = _live_group_members(identity.pid)
    if members is not None:
        return bool(members)
    try:
        os.killpg(identity.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(identity: ProcessIdentity, grace_s: float) -> None:
    """SIGTERM to the whole group, SIGKILL to whatever is left after `grace_s` seconds."""
    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        if not group_alive(identity):
            return
        try:
            os.killpg(identity.pid, signum)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while group_alive(identity) and time.monotonic() < deadline:
            time.sleep(0.05)
