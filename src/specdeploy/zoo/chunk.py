"""When one invocation of `zoo train` must stop: its time limit, or SIGTERM / Ctrl-C.

Training loops ask `ChunkLimit.reached()` between steps; on True they write their checkpoint and return, so
the next invocation resumes exactly there. A second Ctrl-C interrupts at once (the last checkpoint stays).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class ChunkLimit:
    def __init__(self, max_seconds: float | None) -> None:
        self.deadline = None if max_seconds is None else time.monotonic() + max_seconds
        self.signal_name: str | None = None

    def reached(self) -> bool:
        return self.signal_name is not None or (
            self.deadline is not None and time.monotonic() >= self.deadline
        )

    @property
    def reason(self) -> str:
        return f"{self.signal_name} received" if self.signal_name else "time limit of this invocation"

    @contextmanager
    def catching_signals(self) -> Iterator[ChunkLimit]:
        """SIGTERM and the first SIGINT ask the loops to checkpoint and stop; the handlers are restored after."""

        def ask_to_stop(signum: int, frame: FrameType | None) -> None:
            if self.signal_name == "SIGINT" and signum == signal.SIGINT:
                raise KeyboardInterrupt  # a second Ctrl-C: the user does not want to wait
            self.signal_name = signal.Signals(signum).name

        previous = {sig: signal.signal(sig, ask_to_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
