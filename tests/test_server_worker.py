"""The engine worker alone: requests batched together, cancellation, engine failures, shutdown with jobs queued."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from specdeploy.engine.decode import SamplingParams, Step
from specdeploy.errors import SpecdeployError
from specdeploy.server.api_errors import ApiError
from specdeploy.server.generation import Generation, SpecSettings
from specdeploy.server.params import RequestParams
from specdeploy.server.service import EngineService
from specdeploy.server.worker import EngineWorker, Job, JobFailed


@dataclass(eq=False)
class ScriptedRequest:
    token: int
    steps: int
    done: int = 0
    finished: bool = False
    cancelled: bool = False
    budgets: list[int] = field(default_factory=list)


@dataclass
class ScriptedEvent:
    request: ScriptedRequest
    step: Step


class ScriptedEngine:
    """Each iteration admits waiting requests up to `max_running` and gives every running one a one-token
    step; a negative prompt breaks the engine. Records admissions and how many ran together."""

    def __init__(self, steps: int = 3, max_running: int = 4, gate: threading.Event | None = None) -> None:
        self.steps, self.max_running, self.gate = steps, max_running, gate
        self.waiting: list[ScriptedRequest] = []
        self.running: list[ScriptedRequest] = []
        self.admitted: list[int] = []
        self.batch_sizes: list[int] = []

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def idle(self) -> bool:
        return not (self.waiting or self.running)

    def submit(self, prompt_ids, params) -> ScriptedRequest:
        if prompt_ids[0] == 99:
            raise SpecdeployError("that prompt is refused")
        request = ScriptedRequest(prompt_ids[0], self.steps)
        self.waiting.append(request)
        return request

    def cancel(self, request) -> None:
        request.cancelled = True

    def iterate(self) -> list[ScriptedEvent]:
        self.running = [r for r in self.running if not (r.finished or r.cancelled)]
        self.waiting = [r for r in self.waiting if not r.cancelled]
        while self.waiting and len(self.running) < self.max_running:
            request = self.waiting.pop(0)
            self.admitted.append(request.token)
            self.running.append(request)
        if any(r.token < 0 for r in self.running):
            raise RuntimeError("the engine broke")
        if self.gate is not None and any(r.done > 0 for r in self.running):
            self.gate.wait(5)  # the first step always comes: a job is visibly running
        self.batch_sizes.append(len(self.running))
        events = []
        for request in self.running:
            request.done += 1
            request.finished = request.done == request.steps
            events.append(
                ScriptedEvent(
                    request,
                    Step([request.token], int(request.done > 1), "length" if request.finished else None),
                )
            )
        return events


async def drain(job) -> list[Step | JobFailed]:
    items = []
    try:
        async for step in job:
            items.append(step)
    except JobFailed as exc:
        items.append(exc)
    return items


def test_requests_are_admitted_in_arrival_order_and_run_together() -> None:
    engine = ScriptedEngine(steps=3, max_running=4)
    worker = EngineWorker(lambda: engine, max_queued=16)
    worker.start()

    async def main() -> list[list]:
        jobs = [worker.submit([i], SamplingParams()) for i in range(10)]
        return await asyncio.gather(*(drain(job) for job in jobs))

    results = asyncio.run(main())
    worker.stop()
    assert engine.admitted == list(range(10))
    assert [[s.token_ids[0] for s in steps] for steps in results] == [[i] * 3 for i in range(10)]
    assert max(engine.batch_sizes) > 1 and max(engine.batch_sizes) <= 4


def test_an_iterations_steps_and_endings_reach_the_event_loop_in_one_wake_up() -> None:
    # every wake-up of a busy event loop can hold the engine thread up to the interpreter's switch interval
    engine = ScriptedEngine(steps=3, max_running=4)
    worker = EngineWorker(lambda: engine, max_queued=16)
    wake_ups = []

    async def main() -> list[list]:
        loop = asyncio.get_running_loop()
        call_soon_threadsafe = loop.call_soon_threadsafe

        def counted(callback, *args):
            wake_ups.append(threading.current_thread().name)
            return call_soon_threadsafe(callback, *args)

        loop.call_soon_threadsafe = counted
        jobs = [worker.submit([i], SamplingParams()) for i in range(4)]
        worker.start()  # after the submissions: all four run in the same three iterations
        return await asyncio.gather(*(drain(job) for job in jobs))

    results = asyncio.run(main())
    worker.stop()
    assert [[s.token_ids[0] for s in steps] for steps in results] == [[i] * 3 for i in range(4)]
    assert engine.batch_sizes[:3] == [4, 4, 4]
    # three iterations of four steps each, the endings delivered with the last one's steps
    assert wake_ups.count("specdeploy-engine") == 3


def test_cancelled_refused_and_failing_jobs_do_not_stop_the_worker() -> None:
    gate = threading.Event()
    engines: list[ScriptedEngine] = []

    def make() -> ScriptedEngine:
        engines.append(ScriptedEngine(steps=50, max_running=1, gate=gate))
        return engines[-1]

    worker = EngineWorker(make, max_queued=16)
    worker.start()

    async def main():
        running = worker.submit([1], SamplingParams())
        waiting = worker.submit([2], SamplingParams())
        refused = worker.submit([99], SamplingParams())
        waiting.cancel()  # cancelled before it starts: never decoded
        first = await running.steps.get()
        running.cancel()  # cancelled mid-generation: stops after the current step
        gate.set()
        cut, dropped, denied = await drain(running), await drain(waiting), await drain(refused)
        failing = worker.submit([-1], SamplingParams())
        broken = await drain(failing)
        after = await drain(worker.submit([3], SamplingParams()))
        return first, cut, dropped, denied, broken, after

    first, cut, dropped, denied, broken, after = asyncio.run(main())
    worker.stop()
    assert first.token_ids == [1] and len(cut) <= 1
    assert dropped == [] and 2 not in engines[0].admitted
    assert len(denied) == 1 and "that prompt is refused" in str(denied[0])
    assert len(broken) == 1 and isinstance(broken[0], JobFailed) and "the engine broke" in str(broken[0])
    assert len(engines) == 2  # a fresh engine after the failure, which then serves the next job whole
    assert len(after) == 50 and worker.num_running == 0


def test_queue_limit_and_shutdown_end_every_waiting_job() -> None:
    gate = threading.Event()
    engine = ScriptedEngine(steps=5, max_running=1, gate=gate)
    worker = EngineWorker(lambda: engine, max_queued=3)
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


class ByteTokenizer:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def test_steps_queued_while_the_server_was_behind_reach_the_stream_as_one_event() -> None:
    # SGLang's tokenizer manager streams a request's latest output alike when it falls behind
    recorded: list[Generation] = []
    service = SimpleNamespace(stats=SimpleNamespace(record=lambda gen, first_step_at: recorded.append(gen)))

    async def main() -> list[list[int]]:
        gen = Generation(
            ByteTokenizer(), [1], RequestParams(SamplingParams(max_new_tokens=6)), SpecSettings(2)
        )
        job = Job([1], gen.params.sampling, asyncio.get_running_loop())
        for step in (Step([104], 0, None), Step([105, 33], 1, None), Step([33], 1, None)):
            job.steps.put_nowait(step)
        follow = EngineService.follow(service, gen, job)
        yielded = [await anext(follow)]
        job.steps.put_nowait(Step([63, 63], 1, "length"))
        yielded += [added async for added in follow]
        return yielded

    assert asyncio.run(main()) == [[104, 105, 33, 33], [63, 63]]
    assert (
        recorded[0].text == "hi!!??"
        and recorded[0].verify_ct == 3
        and recorded[0].accept_lengths == [2, 1, 2]
    )
