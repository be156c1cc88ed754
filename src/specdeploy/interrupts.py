"""SIGTERM handled like Ctrl-C, for commands that start servers and must stop them on the way out."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (`kill`, `timeout`, a batch scheduler) unwinds like Ctrl-C, so `finally` blocks that stop
    servers run either way; a server in its own process group would otherwise outlive its command."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
