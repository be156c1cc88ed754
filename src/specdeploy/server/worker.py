"""One worker thread drives the batching engine; each request's steps flow back to the event loop.

The engine is synchronous and compute-bound, so it never runs on the event loop. Between engine iterations
the worker takes newly queued jobs into the engine (requests join and leave between steps), tells it which
jobs were cancelled (client gone, stop string matched), and hands every event to its job's asyncio queue
through `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from specdeploy.engine.decode import SamplingParams, Step
from specdeploy.errors import SpecdeployError
from specdeploy.server.api_errors import ApiError

log = logging.getLogger(__name__)


class JobFailed(Exception):
    """The engine raised while running a job; carries the original exception."""


class BatchingEngine(Protocol):
    """What the worker needs of `engine.batch.BatchEngine`."""

    num_running: int
    num_waiting: int
    idle: bool
    graphs_captured: int  # CUDA graphs captured when it was built
    startup_s: float  # seconds spent building it beyond loading: graph capture, step-cost measurement

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> Any: ...

    def cancel(self, request: Any) -> None: ...

    def iterate(self) -> list[Any]: ...


@dataclass
class Job:
    prompt_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    steps: asyncio.Queue = field(default_factory=asyncio.Queue)  # Step | JobFailed | None (done)
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None
    budgets: list[int] = field(default_factory=list)  # the DDTree budget of each step, when it varies
    predicted: list[float] = field(default_factory=list)  # the tokens predicted for each step, when it varies

    def cancel(self) -> None:
        self.cancelled.set()

    async def __aiter__(self) -> AsyncIterator[Step]:
        while True:
            item = await self.steps.get()
            if item is None:
                return
            if isinstance(item, JobFailed):
                raise item
            yield item

    def _deliver(self, item: Step | JobFailed | None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.steps.put_nowait, item)
        except RuntimeError:  # the event loop is already closed: nobody is listening any more
            self.cancel()


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


class EngineWorker:
    """A queue in front of the batching engine, with a bound on how many jobs may wait or run at once."""

    def __init__(self, make_engine: Callable[[], BatchingEngine], max_queued: int) -> None:
        """`make_engine` builds the engine, again after an engine failure (whose state is then unknown)."""
        if max_queued < 1:
            raise ValueError(f"max_queued must be at least 1, got {max_queued}")
        self.make_engine = make_engine
        self.engine = make_engine()
        self.max_queued = max_queued
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._queued = 0  # submitted jobs the engine has not taken yet
        self._in_engine = 0  # jobs the engine holds (waiting inside it, prefilling or running)
        self._stopping = threading.Event()
        self._exited = False  # set under the lock once the thread takes no more jobs
        self.last_step_at = 0.0  # perf_counter of the latest step any job made, for /health_generate
        # seconds from one iteration's end to the next one's start while jobs were held (delivering events,
        # taking new jobs), and the iterations counted, since start or `reset_loop_times`
        self._between_s, self._between_count = 0.0, 0
        self._thread = threading.Thread(target=self._run, name="specdeploy-engine", daemon=True)

    @property
    def num_waiting(self) -> int:
        return self._queued + (0 if self._exited else self.engine.num_waiting)

    @property
    def num_running(self) -> int:
        return 0 if self._exited else self.engine.num_running

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping.is_set()

    def start(self) -> None:
        self._thread.start()

    def loop_times(self) -> dict | None:
        """The engine's `LoopTimes` with the worker's own time between iterations added (None for an engine
        that keeps none)."""
        loop = getattr(self.engine, "loop", None)
        if loop is None:
            return None
        times = loop.describe()
        times["ms_per_iteration"]["server_between_iterations"] = round(
            1e3 * self._between_s / max(self._between_count, 1), 4
        )
        return times

    def reset_loop_times(self) -> None:
        """Start `loop_times` afresh (SGLang's /flush_cache restarts its counters alike)."""
        if hasattr(self.engine, "loop"):
            self.engine.loop = type(self.engine.loop)()
        self._between_s, self._between_count = 0.0, 0

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> Job:
        """Queue a job behind all earlier ones; refuse with 503 when the queue is full or shutting down."""
        if self._stopping.is_set():
            raise ApiError("The server is shutting down; send the request to another replica.", 503)
        job = Job(prompt_ids, params, asyncio.get_running_loop())
        with self._lock:
            if self._queued + self._in_engine >= self.max_queued:
                raise ApiError(
                    f"The request queue is full ({self.max_queued} requests waiting or running); "
                    "retry later or start the server with a larger --max-queued-requests.",
                    503,
                )
            if self._exited:
                raise ApiError("The server is shutting down; send the request to another replica.", 503)
            self._queued += 1
            # put under the lock: the worker cannot finish its last drain between the check and the put
            self._jobs.put(job)
        return job

    @property
    def idle(self) -> bool:
        """Nothing waits or runs."""
        with self._lock:
            return self._queued + self._in_engine == 0

    def request_stop(self) -> None:
        """Stop after the current iteration, without waiting: unfinished jobs end without further output.

        Safe inside a signal handler: it only sets an Event and puts on a SimpleQueue (reentrant).
        """
        self._stopping.set()
        self._jobs.put(None)

    def stop(self, timeout: float = 10.0) -> None:
        """`request_stop`, then wait for the thread to exit."""
        self.request_stop()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ------------------------------------------------------------------------------------ the thread

    def _run(self) -> None:
        held: dict[Any, Job] = {}  # engine request -> its job
        iterated_at: float | None = None  # the last iteration's end, while jobs stay held
        while not self._stopping.is_set():
            if not self._take(held, block=not held):
                break
            for request, job in held.items():
                if job.cancelled.is_set():
                    self.engine.cancel(request)
            if not held:
                iterated_at = None  # the wait for jobs is not the server's work
                continue
            if iterated_at is not None:
                self._between_s += time.perf_counter() - iterated_at
                self._between_count += 1
            try:
                events = self.engine.iterate()
            # the batched step failed, with no one request to blame: its jobs end, never the worker
            except Exception as exc:
                log.exception("generation failed")
                for job in held.values():
                    job._deliver(JobFailed(f"{type(exc).__name__}: {exc}"))
                self._release(held, list(held))
                self.engine = self.make_engine()
                continue
            iterated_at = time.perf_counter()  # what follows, delivering the events, is the server's work
            if events:
                self.last_step_at = iterated_at
            items: list[tuple[Job, Step | JobFailed | None]] = []
            for event in events:
                job = held[event.request]
                if event.step is None:  # this request alone failed; the others go on
                    log.error("a request failed: %s", event.error)
                    items.append((job, JobFailed(event.error)))
                    continue
                if event.step.verified_tokens and getattr(event.request, "budgets", None):
                    job.budgets.append(event.request.budgets[-1])
                    job.predicted.append(event.request.predicted[-1])
                items.append((job, event.step))
            ended = [r for r in held if r.finished or r.cancelled]
            items += [(held[r], None) for r in ended]
            _deliver_all(items)
            self._release(held, ended, closed=True)
        with self._lock:
            self._exited = True
        self._release(held, list(held))
        self._drain()

    def _take(self, held: dict[Any, Job], block: bool) -> bool:
        """Move queued jobs into the engine (waiting for one when `block`); False once told to stop."""
        while True:
            try:
                job = self._jobs.get() if block else self._jobs.get_nowait()
            except queue.Empty:
                return True
            block = False
            if job is None:
                return False
            with self._lock:
                self._queued -= 1
            if job.cancelled.is_set():
                self._close(job)
                continue
            try:
                request = self.engine.submit(job.prompt_ids, job.params)
            except Exception as exc:  # refused or failed on admission: this job alone ends
                job._deliver(
                    JobFailed(
                        str(exc) if isinstance(exc, SpecdeployError) else f"{type(exc).__name__}: {exc}"
                    )
                )
                self._close(job)
                continue
            job.started_at = time.perf_counter()
            held[request] = job
            with self._lock:
                self._in_engine += 1

    def _release(self, held: dict[Any, Job], requests: list[Any], closed: bool = False) -> None:
        """Let go of the jobs of `requests`, ending each one's stream unless `closed` (already ended)."""
        for request in requests:
            job = held.pop(request)
            with self._lock:
                self._in_engine -= 1
            if not closed:
                self._close(job)

    def _close(self, job: Job) -> None:
        job._deliver(None)

    def _drain(self) -> None:
        """After a stop, end every job still queued so that no consumer waits forever."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                with self._lock:
                    self._queued -= 1
                self._close(job)
