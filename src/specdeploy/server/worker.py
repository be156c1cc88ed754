"""The engine loop (`server.engine_loop`) behind a bounded job queue; each job's steps flow back to its event loop.

The engine is synchronous and compute-bound, so it never runs on the event loop: `EngineWorker` runs the loop
in a thread of this process, `engine_process.EngineProcess` in a process of its own. Between engine iterations
the loop takes newly queued jobs into the engine (requests join and leave between steps) and the cancelled
ones out (client gone, stop string matched), and every iteration's steps reach their jobs' asyncio queues in
one `call_soon_threadsafe` per event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from specdeploy.engine.decode import SamplingParams, Step
from specdeploy.server.api_errors import ApiError
from specdeploy.server.engine_loop import BatchingEngine, EngineLoop, Outcome


class JobFailed(Exception):
    """The engine raised while running a job; carries the original exception."""


@dataclass
class Job:
    prompt_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    rid: int = 0  # the request's id on the engine side
    steps: asyncio.Queue = field(default_factory=asyncio.Queue)  # Step | JobFailed | None (done)
    cancelled: threading.Event = field(default_factory=threading.Event)
    on_cancel: Callable[[], None] | None = None  # tells an engine in another process
    budgets: list[int] = field(default_factory=list)  # the DDTree budget of each step, when it varies
    predicted: list[float] = field(default_factory=list)  # the tokens predicted for each step, when it varies
    first_step_at: float | None = None  # when the engine side handed its first step over (perf_counter)

    def cancel(self) -> None:
        if not self.cancelled.is_set():
            self.cancelled.set()
            if self.on_cancel is not None:
                self.on_cancel()

    async def __aiter__(self) -> AsyncIterator[Step]:
        while True:
            item = await self.steps.get()
            if item is None:
                return
            if isinstance(item, JobFailed):
                raise item
            yield item


def _deliver_all(items: list[tuple[Job, Step | JobFailed | None]]) -> None:
    """Hand an iteration's items to their jobs with one wake-up of each event loop, not one per item: every
    wake-up lets the busy event loop take the interpreter from the engine thread (up to the switch interval)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Job, Step | JobFailed | None]]] = {}
    for job, item in items:
        by_loop.setdefault(job.loop, []).append((job, item))
    for loop, batch in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, batch)
        except RuntimeError:  # the event loop is already closed: nobody is listening any more
            for job, _ in batch:
                job.cancel()


def _put_all(batch: list[tuple[Job, Step | JobFailed | None]]) -> None:
    for job, item in batch:
        job.steps.put_nowait(item)


class EngineClient(ABC):
    """A bounded queue of jobs in front of an engine loop (`server.engine_loop`), and the delivery of each
    iteration's outcomes to their jobs' event loops. Subclasses carry jobs to the loop and outcomes back:
    `EngineWorker` runs it in a thread of this process, `engine_process.EngineProcess` in a process of its
    own."""

    def __init__(self, max_queued: int) -> None:
        if max_queued < 1:
            raise ValueError(f"max_queued must be at least 1, got {max_queued}")
        self.max_queued = max_queued
        self._lock = threading.Lock()
        self._jobs: dict[int, Job] = {}  # every job not yet ended, by request id
        self._ids = itertools.count(1)
        self._stopping = threading.Event()
        self._closed = False  # set under the lock once no job may be submitted any more
        self.last_step_at = 0.0  # perf_counter of the latest step any job made, for /health_generate

    @property
    def num_running(self) -> int:
        return min(self._engine_running(), len(self._jobs))

    @property
    def num_waiting(self) -> int:
        return len(self._jobs) - self.num_running

    @property
    def idle(self) -> bool:
        """Nothing waits or runs."""
        with self._lock:
            return not self._jobs

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> Job:
        """Queue a job behind all earlier ones; refuse with 503 when the queue is full or shutting down."""
        if self._stopping.is_set():
            raise ApiError("The server is shutting down; send the request to another replica.", 503)
        job = Job(prompt_ids, params, asyncio.get_running_loop())
        with self._lock:
            if len(self._jobs) >= self.max_queued:
                raise ApiError(
                    f"The request queue is full ({self.max_queued} requests waiting or running); "
                    "retry later or start the server with a larger --max-queued-requests.",
                    503,
                )
            if self._closed:
                raise ApiError("The server is shutting down; send the request to another replica.", 503)
            job.rid = next(self._ids)
            self._jobs[job.rid] = job
            # sent under the lock: the engine side cannot finish its last drain between the check and the send
            self._send(job)
        return job

    def _deliver(self, outcomes: list[Outcome]) -> None:
        """Hand an iteration's outcomes to their jobs (ended jobs leave the queue)."""
        items: list[tuple[Job, Step | JobFailed | None]] = []
        for rid, outcome, adaptive in outcomes:
            job = self._jobs.get(rid)
            if job is None:
                continue
            if isinstance(outcome, Step):
                self.last_step_at = time.perf_counter()
                if job.first_step_at is None:
                    job.first_step_at = self.last_step_at
                if adaptive is not None:
                    job.budgets.append(adaptive[0])
                    job.predicted.append(adaptive[1])
                items.append((job, outcome))
            elif outcome is None:  # ended
                with self._lock:
                    del self._jobs[rid]
                items.append((job, None))
            else:  # failed: its end follows
                items.append((job, JobFailed(outcome)))
        _deliver_all(items)

    def _end_all(self, failure: str | None = None) -> None:
        """After a stop, or the engine's death (`failure`: why), end every job left so that no consumer waits
        forever; none may be submitted any more."""
        with self._lock:
            self._closed = True
            jobs, self._jobs = list(self._jobs.values()), {}
        items: list[tuple[Job, Step | JobFailed | None]] = []
        for job in jobs:
            items += [(job, JobFailed(failure)), (job, None)] if failure else [(job, None)]
        _deliver_all(items)

    @property
    @abstractmethod
    def alive(self) -> bool:
        """The engine loop runs and takes jobs (/health)."""

    @abstractmethod
    def start(self) -> None:
        """Start delivering outcomes (the app's start-up)."""

    @abstractmethod
    def request_stop(self) -> None:
        """Stop after the current iteration, without waiting; safe inside a signal handler."""

    @abstractmethod
    def stop(self, timeout: float = 10.0) -> None:
        """`request_stop`, then wait for the engine loop to end."""

    @abstractmethod
    async def engine_state(self) -> dict[str, Any]:
        """`EngineLoop.state`: what /server_info shows of the engine."""

    @abstractmethod
    def reset_loop_times(self) -> None:
        """`EngineLoop.reset_loop_times` (/flush_cache)."""

    @abstractmethod
    def _send(self, job: Job) -> None:
        """Carry a new job to the engine loop (called under the queue's lock)."""

    @abstractmethod
    def _engine_running(self) -> int:
        """Requests the engine runs (prefilling included)."""


class EngineWorker(EngineClient):
    """The engine loop in a thread of this process, fed through a queue."""

    def __init__(self, make_engine: Callable[[], BatchingEngine], max_queued: int) -> None:
        """`make_engine` builds the engine, again after an engine failure (whose state is then unknown)."""
        super().__init__(max_queued)
        self.loop = EngineLoop(make_engine)
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="specdeploy-engine", daemon=True)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping.is_set()

    def start(self) -> None:
        self._thread.start()

    async def engine_state(self) -> dict[str, Any]:
        """`EngineLoop.state` (read while the engine thread may be stepping: figures of the moment)."""
        return self.loop.state()

    def reset_loop_times(self) -> None:
        self.loop.reset_loop_times()

    def request_stop(self) -> None:
        """Stop after the current iteration, without waiting: unfinished jobs end without further output.

        Safe inside a signal handler: it only sets an Event and puts on a SimpleQueue (reentrant).
        """
        self._stopping.set()
        self._queue.put(None)

    def stop(self, timeout: float = 10.0) -> None:
        """`request_stop`, then wait for the thread to exit."""
        self.request_stop()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _send(self, job: Job) -> None:
        self._queue.put(job)

    def _engine_running(self) -> int:
        return self.loop.engine.num_running

    # ------------------------------------------------------------------------------------ the thread

    def _run(self) -> None:
        loop = self.loop
        while not self._stopping.is_set():
            if not self._take(block=not loop.busy):
                break
            for rid in list(loop.held):
                job = self._jobs.get(rid)
                if job is None or job.cancelled.is_set():
                    loop.cancel(rid)
            if loop.busy:
                self._deliver(loop.iterate())
        loop.release_all()
        self._end_all()

    def _take(self, block: bool) -> bool:
        """Move queued jobs into the engine loop (waiting for one when `block`); False once told to stop."""
        while True:
            try:
                job = self._queue.get() if block else self._queue.get_nowait()
            except queue.Empty:
                return True
            block = False
            if job is None:
                return False
            if job.cancelled.is_set():
                self._deliver([(job.rid, None, None)])
                continue
            refused = self.loop.admit(job.rid, job.prompt_ids, job.params)
            if refused is not None:
                self._deliver([(job.rid, refused, None), (job.rid, None, None)])
