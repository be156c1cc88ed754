"""SIGTERM handled like Ctrl-C, for commands that start servers and must stop them on the way out."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (`kill`, `timeout`, a batch scheduler) is handled as Ctrl-C is, by the SIGINT handler in force when
    it arrives, so `finally` blocks that stop servers run either way (a server in its own process group would
    otherwise outlive its command). Outside an event loop that is Python's, which raises KeyboardInterrupt; while
    `asyncio.run` runs a benchmark it is asyncio's, which cancels the main task first, so that the loop's tasks
    unwind by CancelledError and the interrupt comes out of `asyncio.run` once they have (a KeyboardInterrupt
    raised within the loop's own code can leave it unable to close its tasks, and the command hanging)."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        handler = signal.getsignal(signal.SIGINT)
        if not callable(handler):  # SIGINT ignored or left to the system: unwind as Python's own handler does
            raise KeyboardInterrupt
        handler(signal.SIGINT, frame)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
