"""The engine loop's own account of an interval: how full its steps were, how much of the time it worked, and how
long requests waited from admission to their first token."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from specdeploy.engine.request import Step
from specdeploy.engine.runtime import load_engine
from specdeploy.engine.sampling import SamplingParams
from specdeploy.server.engine_loop import EngineLoop


def test_the_loop_reports_its_mean_running_requests_busy_share_and_wait_for_a_first_token(
    random_pair: tuple[Path, Path],
) -> None:
    engine = load_engine(random_pair[0], None, "ar")
    loop = EngineLoop(lambda: engine.batch_engine(4, None))
    loop.reset_loop_times()
    started = time.perf_counter()
    time.sleep(0.3)  # no request held: not the loop's work
    admitted: dict[int, float] = {}
    for rid, new in enumerate((5, 9, 12)):  # different lengths: the batch thins out as they finish
        loop.admit(rid, [3, 1, 4, 1, 5], SamplingParams(max_new_tokens=new, ignore_eos=True))
        admitted[rid] = time.perf_counter()
    time.sleep(0.05)  # held, not yet iterated: part of their wait for a first token, not of the loop's work
    worked = 0.0
    waits: list[float] = []
    step_rows: list[int] = []
    while loop.busy:
        began = time.perf_counter()
        outcomes = loop.iterate()
        ended = time.perf_counter()
        worked += ended - began
        waits += [
            ended - admitted.pop(rid) for rid, o, _ in outcomes if isinstance(o, Step) and rid in admitted
        ]
        rows = sum(isinstance(o, Step) and o.verified_tokens > 0 for _, o, _ in outcomes)
        if rows:
            step_rows.append(rows)
    elapsed = time.perf_counter() - started
    described = loop.state()["loop"]
    # every new token after a request's first came from one step with that request's row in it
    assert sum(step_rows) == 4 + 8 + 11
    assert described["steps"] == len(step_rows)
    assert described["mean_running_requests"] == pytest.approx(sum(step_rows) / len(step_rows), abs=0.005)
    assert described["busy_share"] == pytest.approx(worked / elapsed, abs=0.05)
    assert described["busy_share"] < 1 - 0.25 / elapsed  # the idle 0.3 s are not counted
    assert len(waits) == 3 and min(waits) >= 0.05
    assert described["ms_admitted_to_first_token"] == pytest.approx(1e3 * sum(waits) / 3, abs=5.0)
    loop.reset_loop_times()
    assert loop.state()["loop"]["ms_admitted_to_first_token"] is None  # none since the reset
