"""CPU time of a process and of its whole tree, read from /proc (Linux), and a sampler of it over time.

Other benchmark clients spend seconds of CPU importing their libraries and writing reports: only the CPU
spent while their measured requests ran is theirs to compare. The sampler records the tree's CPU on
time.monotonic_ns, the loopback server's clock, so that the curve can be read at the first measured
request's arrival and at its last chunk.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of one process."""
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def _children(pid: int) -> list[int]:
    children: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            children += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass
    return children


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU time of a process and all its descendants, those already reaped included (cutime, cstime)."""
    root = _stat_fields(pid)
    if root is None:
        return None
    total = 0.0
    for fields in [root, *map(_stat_fields, _descendants(pid))]:
        if fields is not None:  # a process may exit while the tree is walked
            total += sum(int(f) for f in fields[11:15]) / CLOCK_TICKS  # utime, stime, cutime, cstime
    return total


def _descendants(pid: int) -> list[int]:
    found, pending = [], _children(pid)
    while pending:
        child = pending.pop()
        found.append(child)
        pending += _children(child)
    return found


class CpuSampler:
    """Samples a process tree's CPU seconds every `period_s` in a background thread."""

    def __init__(self, pid: int, period_s: float = 0.02) -> None:
        self.pid = pid
        self.period_s = period_s
        self.times_ns: list[int] = []
        self.cpu_s: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while True:
            cpu = tree_cpu_seconds(self.pid)
            if cpu is not None:
                self.times_ns.append(time.monotonic_ns())
                self.cpu_s.append(cpu)
            if self._stop.wait(self.period_s):
                return

    def between(self, start_ns: int, end_ns: int) -> float | None:
        """CPU seconds the tree spent from start_ns to end_ns, interpolated between samples."""
        import numpy as np  # here, not at module level: numpy slows `specdeploy --help`

        if len(self.times_ns) < 2 or not self.times_ns[0] <= start_ns < end_ns <= self.times_ns[-1]:
            return None
        at = np.interp([start_ns, end_ns], self.times_ns, self.cpu_s)
        return float(at[1] - at[0])
