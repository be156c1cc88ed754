"""SIGTERM unwinds a command as Ctrl-C does, also while a benchmark's event loop runs."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from specdeploy.interrupts import sigterm_as_interrupt


def test_sigterm_raises_keyboard_interrupt_and_the_previous_handler_comes_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    reached = []
    with pytest.raises(KeyboardInterrupt), sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        reached.append("after the signal")
    assert reached == [] and signal.getsignal(signal.SIGTERM) is before


def test_sigterm_inside_asyncio_run_cancels_its_main_task_before_the_interrupt_comes_out() -> None:
    """As Ctrl-C does under `asyncio.run`: the coroutine runs on to its next await and is cancelled there (its
    cleanup runs as for any cancellation), then KeyboardInterrupt leaves `asyncio.run`. A KeyboardInterrupt raised
    where the signal lands would cut the coroutine mid-statement, outside asyncio's cancellation."""
    seen = []

    async def benchmark() -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 0.2
            while time.monotonic() < deadline:  # no await: the signal's handler runs in here
                pass
            seen.append("ran to its await")
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt), sigterm_as_interrupt():
        asyncio.run(benchmark())
    assert seen == ["ran to its await", "cancelled"] and time.monotonic() - started < 5
