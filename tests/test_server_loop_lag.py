"""The event loop's lag in /server_info: how late a timer fires while callbacks hold the loop."""

from __future__ import annotations

import asyncio
import time

from specdeploy.server.stats import ServerStats


def lag_while(block_s: float) -> dict:
    """The stats' latency after a watcher ran beside one callback that holds the loop for `block_s`."""
    stats = ServerStats(lambda: 0, lambda: 0)

    async def scenario() -> None:
        watcher = asyncio.get_running_loop().create_task(stats.watch_event_loop(period_s=0.005))
        await asyncio.sleep(0.05)
        time.sleep(block_s)  # a callback that keeps the loop from everything else
        await asyncio.sleep(0.05)
        watcher.cancel()

    asyncio.run(scenario())
    return stats.latency()


def test_a_callback_that_holds_the_loop_shows_as_its_lag() -> None:
    held = lag_while(0.12)
    # the timer due during the hold fired after it: late by the hold, less at most one period
    assert held["event_loop_lag_ms_max"] >= 0.12e3 - 5
    assert held["event_loop_lag_ms_mean"] > 0
    idle = lag_while(0.0)
    assert idle["event_loop_lag_ms_max"] < 60  # an idle loop fires its timers about on time
    assert idle["event_loop_lag_ms_mean"] < held["event_loop_lag_ms_mean"]


def test_a_flush_restarts_the_lag() -> None:
    stats = ServerStats(lambda: 0, lambda: 0)

    async def scenario() -> None:
        watcher = asyncio.get_running_loop().create_task(stats.watch_event_loop(period_s=0.005))
        await asyncio.sleep(0.03)
        time.sleep(0.05)
        await asyncio.sleep(0.02)
        assert stats.latency()["event_loop_lag_ms_max"] >= 40
        stats.flush()
        assert stats.latency()["event_loop_lag_ms_max"] is None  # no sample since the flush
        watcher.cancel()

    asyncio.run(scenario())
