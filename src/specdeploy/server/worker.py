"""One worker thread runs the batch-1 decoder over a FIFO queue of jobs; steps flow back to the event loop.

The decoder is synchronous and CPU-bound, so it never runs on the event loop. Each job owns an asyncio
queue that the worker feeds through `call_soon_threadsafe`; a job's consumer cancels it (client gone, stop
string matched) and the worker notices before the next step.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from specdeploy.engine.decode import Decoder, SamplingParams, Step
from specdeploy.server.api_errors import ApiError

log = logging.getLogger(__name__)


class JobFailed(Exception):
    """The decoder raised while running a job; carries the original exception."""


@dataclass
class Job:
    prompt_ids: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    steps: asyncio.Queue = field(default_factory=asyncio.Queue)  # Step | JobFailed | None (done)
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None

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


class EngineWorker:
    """A FIFO queue in front of one decoder, with a bound on how many jobs may wait or run at once."""

    def __init__(self, decoder: Decoder, max_queued: int) -> None:
        if max_queued < 1:
            raise ValueError(f"max_queued must be at least 1, got {max_queued}")
        self.decoder = decoder
        self.max_queued = max_queued
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._running = 0
        self._stopping = threading.Event()
        self._exited = False  # set under the lock once the thread takes no more jobs
        self._idle = threading.Condition(self._lock)
        self.last_step_at = 0.0  # perf_counter of the latest step any job made, for /health_generate
        self._thread = threading.Thread(target=self._run, name="specdeploy-engine", daemon=True)

    @property
    def num_waiting(self) -> int:
        return self._waiting

    @property
    def num_running(self) -> int:
        return self._running

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping.is_set()

    def start(self) -> None:
        self._thread.start()

    def submit(self, prompt_ids: list[int], params: SamplingParams, bypass_limit: bool = False) -> Job:
        """Queue a job behind all earlier ones; refuse with 503 when the queue is full or shutting down."""
        if self._stopping.is_set():
            raise ApiError("The server is shutting down; send the request to another replica.", 503)
        job = Job(prompt_ids, params, asyncio.get_running_loop())
        with self._lock:
            if not bypass_limit and self._waiting + self._running >= self.max_queued:
                raise ApiError(
                    f"The request queue is full ({self.max_queued} requests waiting or running); "
                    "retry later or start the server with a larger --max-queued-requests.",
                    503,
                )
            if self._exited:
                raise ApiError("The server is shutting down; send the request to another replica.", 503)
            self._waiting += 1
            # put under the lock: the worker cannot finish its last drain between the check and the put
            self._jobs.put(job)
        return job

    def wait_idle(self, timeout: float) -> bool:
        """Block until nothing waits or runs (True), or until `timeout` seconds pass (False)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._waiting + self._running == 0, timeout)

    def request_stop(self) -> None:
        """Stop after the current step, without waiting: queued jobs end without output, the thread exits.

        Safe inside a signal handler: it only sets an Event and puts on a SimpleQueue (reentrant).
        """
        self._stopping.set()
        self._jobs.put(None)

    def stop(self, timeout: float = 10.0) -> None:
        """`request_stop`, then wait for the thread to exit."""
        self.request_stop()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                break
            with self._lock:
                self._waiting -= 1
                self._running += 1
            try:
                if not (job.cancelled.is_set() or self._stopping.is_set()):
                    self._decode(job)
            finally:
                job._deliver(None)
                with self._idle:
                    self._running -= 1
                    self._idle.notify_all()
        with self._lock:
            self._exited = True
        self._drain()

    def _decode(self, job: Job) -> None:
        job.started_at = time.perf_counter()
        steps = self.decoder.stream(job.prompt_ids, job.params)
        try:
            for step in steps:
                self.last_step_at = time.perf_counter()
                job._deliver(step)
                if job.cancelled.is_set() or self._stopping.is_set():
                    break
        except Exception as exc:  # any decoder failure ends this job only, never the worker
            log.exception("generation failed")
            job._deliver(JobFailed(f"{type(exc).__name__}: {exc}"))
        finally:
            steps.close()

    def _drain(self) -> None:
        """After a stop, end every job still queued so that no consumer waits forever."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                with self._idle:
                    self._waiting -= 1
                    self._idle.notify_all()
                job._deliver(None)
