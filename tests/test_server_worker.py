"""The engine worker alone: FIFO order, cancellation, decoder failures, shutdown with jobs still queued."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from specdeploy.engine.decode import SamplingParams, Step
from specdeploy.server.api_errors import ApiError
from specdeploy.server.worker import EngineWorker, JobFailed


class ScriptedDecoder:
    """Yields `steps` one-token steps per prompt; records the order prompts were served in."""

    def __init__(self, steps: int = 3, gate: threading.Event | None = None) -> None:
        self.steps, self.gate, self.served = steps, gate, []

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[Step]:
        self.served.append(prompt_ids[0])
        if prompt_ids[0] < 0:
            raise RuntimeError("the decoder broke")
        for i in range(self.steps):
            if self.gate is not None and i > 0:  # the first step always comes: the job is visibly running
                self.gate.wait(5)
            yield Step([prompt_ids[0]], 0 if i == 0 else 1, "length" if i == self.steps - 1 else None)


async def drain(job) -> list[Step | JobFailed]:
    items = []
    try:
        async for step in job:
            items.append(step)
    except JobFailed as exc:
        items.append(exc)
    return items


def test_jobs_are_served_in_arrival_order() -> None:
    decoder = ScriptedDecoder()
    worker = EngineWorker(decoder, max_queued=16)
    worker.start()

    async def main() -> list[list]:
        jobs = [worker.submit([i], SamplingParams()) for i in range(10)]
        return await asyncio.gather(*(drain(job) for job in jobs))

    results = asyncio.run(main())
    worker.stop()
    assert decoder.served == list(range(10))
    assert [[s.token_ids[0] for s in steps] for steps in results] == [[i] * 3 for i in range(10)]


def test_cancelled_and_failing_jobs_do_not_stop_the_worker() -> None:
    gate = threading.Event()
    decoder = ScriptedDecoder(steps=50, gate=gate)
    worker = EngineWorker(decoder, max_queued=16)
    worker.start()

    async def main():
        running = worker.submit([1], SamplingParams())
        waiting = worker.submit([2], SamplingParams())
        failing = worker.submit([-1], SamplingParams())
        last = worker.submit([3], SamplingParams())
        waiting.cancel()  # cancelled before it starts: never decoded
        first = await running.steps.get()
        running.cancel()  # cancelled mid-generation: stops after the current step
        gate.set()
        return first, await drain(running), await drain(waiting), await drain(failing), await drain(last)

    first, running, waiting, failing, last = asyncio.run(main())
    worker.stop()
    assert first.token_ids == [1] and len(running) <= 1
    assert waiting == [] and 2 not in decoder.served
    assert len(failing) == 1 and isinstance(failing[0], JobFailed) and "the decoder broke" in str(failing[0])
    assert len(last) == 50


def test_queue_limit_and_shutdown_end_every_waiting_job() -> None:
    gate = threading.Event()
    worker = EngineWorker(ScriptedDecoder(steps=5, gate=gate), max_queued=3)
    worker.start()

    async def main():
        jobs = [worker.submit([i], SamplingParams()) for i in range(3)]
        with pytest.raises(ApiError) as full:
            worker.submit([9], SamplingParams())
        assert full.value.status == 503
        await asyncio.sleep(0.05)
        stopper = threading.Thread(target=worker.stop)
        stopper.start()
        gate.set()
        results = await asyncio.wait_for(asyncio.gather(*(drain(job) for job in jobs)), 10)
        stopper.join()
        return results

    results = asyncio.run(main())
    assert len(results[0]) <= 2  # stopped after the step under way
    assert results[1] == [] and results[2] == []  # the queued ones end without output
    assert not worker.alive and worker.num_waiting == 0 and worker.num_running == 0
