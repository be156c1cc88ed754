"""The engine loop in a process of its own, so that the HTTP server's event loop and the engine stop sharing
one interpreter.

SGLang runs its scheduler apart from its HTTP server for the same reason. Behind one interpreter, tiny-code's
engines made 15,000-23,000 tok/s at 16 and 64 streams on an H200 where they made 57,000-85,000 alone, and the same
server moved by 5-15% between runs (benchmarks/results/h200-2026-12-04-auto-additive).

The parent sends ("submit", id, prompt ids, sampling params), ("cancel", id), ("state", token), ("reset",) and
("stop",) down a pipe. The child loads the engine itself (`EngineRecipe`: paths and settings, no weights cross
the pipe), answers ("ready", None) once it is built or ("failed", why), then ("outcomes", outcomes, running
requests) after every iteration (each step as a plain tuple, `wire_outcomes`) and ("state", token, state) when
asked. In the parent a sender thread writes
the commands (queued, so the event loop never waits on the pipe) and a reader thread hands the outcomes to their
jobs; if the child dies, its jobs fail with its exit code and /health answers 503.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import queue
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from specdeploy.engine.request import Step
from specdeploy.errors import SpecdeployError
from specdeploy.server.engine_loop import BatchingEngine, EngineLoop, Outcome
from specdeploy.server.worker import EngineClient, Job

log = logging.getLogger(__name__)

STARTUP_POLL_S = 0.5  # how often the parent checks that the child still lives while it loads
STATE_TIMEOUT_S = 60.0  # the longest /server_info waits for the engine's state (an iteration, at most)


WireOutcome = tuple[int, "tuple[list[int], int, str | None] | str | None", "tuple[int, float] | None"]


def wire_outcomes(outcomes: list[Outcome]) -> list[WireOutcome]:
    """Outcomes with each step as a plain tuple, for the pipe: for an iteration of 64 requests, pickling their
    Steps (dataclasses) took 49.9 us of the engine process, the busiest at 64 requests, and making and pickling
    the tuples 22.8 (`benchmarks/pipe_outcomes.py`, a 2-core CPU)."""
    return [
        (rid, (s.token_ids, s.verified_tokens, s.finish_reason) if isinstance(s, Step) else s, adaptive)
        for rid, s, adaptive in outcomes
    ]


def read_outcomes(outcomes: list[WireOutcome]) -> list[Outcome]:
    """`wire_outcomes`' inverse."""
    return [(rid, Step(*s) if isinstance(s, tuple) else s, adaptive) for rid, s, adaptive in outcomes]


@dataclass(frozen=True)
class EngineRecipe:
    """What the engine process builds: `runtime.load_engine`'s arguments and the batch engine's settings."""

    target: Path
    draft: Path | None
    mode: str
    budget: int | None
    device: str
    dtype: str
    threads: int | None
    context_length: int | None
    max_running: int
    policy_budgets: tuple[int, ...] | None = None  # --budget auto: the budgets the policy picks from

    def engine_maker(self) -> Callable[[], BatchingEngine]:
        """Load the weights (once) and return what builds a batch engine over them (again after a failure;
        an adaptive budget's policy keeps what it learnt)."""
        from specdeploy.engine.budget import BudgetPolicy
        from specdeploy.engine.runtime import load_engine

        engine = load_engine(self.target, self.draft, self.mode, self.budget, device=self.device,
                             dtype=self.dtype, threads=self.threads, context_length=self.context_length)  # fmt: skip
        policy = BudgetPolicy(list(self.policy_budgets)) if self.policy_budgets else None
        return lambda: engine.batch_engine(self.max_running, policy)


def run_engine(conn: Connection, recipe: EngineRecipe) -> None:
    """The engine process: build the engine, then take commands between iterations until told to stop (or the
    parent is gone)."""
    # Ctrl-C reaches the whole process group: the parent stops the child (after ending its requests cleanly)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        loop = EngineLoop(recipe.engine_maker())
    except BaseException as exc:  # noqa: BLE001 - whatever stops the engine from starting goes to the parent
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    try:
        while True:
            timeout = 0 if loop.busy else None  # idle: wait for a command
            while conn.poll(timeout):
                if not _handle(conn, loop, conn.recv()):
                    return
                timeout = 0 if loop.busy else None
            if loop.busy:
                outcomes = loop.iterate()
                conn.send(("outcomes", wire_outcomes(outcomes), loop.engine.num_running))
    except (EOFError, BrokenPipeError, ConnectionResetError):  # the parent is gone
        return


def _handle(conn: Connection, loop: EngineLoop, message: tuple) -> bool:
    """One command from the parent; False for "stop"."""
    kind = message[0]
    if kind == "submit":
        _, rid, prompt_ids, params = message
        refused = loop.admit(rid, prompt_ids, params)
        if refused is not None:
            conn.send(
                (
                    "outcomes",
                    wire_outcomes([(rid, refused, None), (rid, None, None)]),
                    loop.engine.num_running,
                )
            )
    elif kind == "cancel":
        loop.cancel(message[1])
    elif kind == "state":
        conn.send(("state", message[1], loop.state()))
    elif kind == "reset":
        loop.reset_loop_times()
    elif kind == "stop":
        return False
    return True


class EngineProcess(EngineClient):
    """The engine loop in a child process (spawned: CUDA state is never inherited), fed through a pipe."""

    def __init__(self, recipe: EngineRecipe, max_queued: int) -> None:
        """Start the child and wait until its engine is built (weights loaded, graphs captured, the adaptive
        budget's step cost measured)."""
        super().__init__(max_queued)
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=run_engine, args=(child, recipe), name="specdeploy-engine",
                                        daemon=True)  # fmt: skip
        self._process.start()
        child.close()  # the child holds its end: EOF here once it exits
        # commands wait here for the sender thread: putting never blocks (the event loop submits and cancels;
        # a pipe filled by a burst of requests would hold it until the child's next iteration read them) and
        # is reentrant (a signal handler stops the server)
        self._outbox: queue.SimpleQueue[tuple | None] = queue.SimpleQueue()
        self._running = 0  # running requests, as the child last said
        self._states: dict[int, asyncio.Future] = {}
        self._gone: str | None = None  # why the child is gone, once the reader knows
        self._reader = threading.Thread(target=self._read, name="specdeploy-engine-reader", daemon=True)
        self._sender = threading.Thread(target=self._send_all, name="specdeploy-engine-sender", daemon=True)
        while not self._conn.poll(STARTUP_POLL_S):
            if not self._process.is_alive():
                raise SpecdeployError(
                    f"the engine process exited with code {self._process.exitcode} while starting; "
                    "see the log above for why"
                )
        kind, why = self._conn.recv()
        if kind != "ready":
            self._process.join(10)
            raise SpecdeployError(f"the engine process could not start: {why}")

    @property
    def alive(self) -> bool:
        return self._reader.is_alive() and self._process.is_alive() and not self._stopping.is_set()

    def start(self) -> None:
        self._reader.start()
        self._sender.start()

    async def engine_state(self) -> dict[str, Any]:
        """`EngineLoop.state` from the child, between two of its iterations."""
        future = asyncio.get_running_loop().create_future()
        token = next(self._ids)
        self._states[token] = future
        if self._gone is not None:  # registered after the reader failed the waiters: no state will come
            _fail(future, SpecdeployError(self._gone))
        self._post(("state", token))
        try:
            return await asyncio.wait_for(future, STATE_TIMEOUT_S)
        finally:
            self._states.pop(token, None)

    def reset_loop_times(self) -> None:
        self._post(("reset",))

    def request_stop(self) -> None:
        """Tell the child to stop after its current iteration; unfinished jobs end without further output.

        Safe inside a signal handler: it only sets an Event and puts on a SimpleQueue (reentrant)."""
        self._stopping.set()
        self._post(("stop",))

    def stop(self, timeout: float = 10.0) -> None:
        """`request_stop`, then wait for the child to exit (killed after `timeout`) and the reader to end."""
        self.request_stop()
        self._process.join(timeout)
        if self._process.is_alive():
            log.warning("the engine process did not stop within %.0f s: killing it", timeout)
            self._process.kill()
            self._process.join(timeout)
        self._outbox.put(None)  # the sender's end
        for thread in (self._reader, self._sender):
            if thread.is_alive():
                thread.join(timeout)

    def _send(self, job: Job) -> None:
        job.on_cancel = lambda: self._post(("cancel", job.rid))
        self._post(("submit", job.rid, job.prompt_ids, job.params))

    def _engine_running(self) -> int:
        return self._running

    def _post(self, message: tuple) -> None:
        """Queue a command for the child (dropped once it is gone: its reader then ends every job)."""
        self._outbox.put(message)

    def _send_all(self) -> None:
        """The sender thread: queued commands down the pipe, in order, until `stop`."""
        while (message := self._outbox.get()) is not None:
            try:
                self._conn.send(message)
            except (OSError, EOFError, ValueError):  # the child is gone: what is left is dropped
                pass

    def _read(self) -> None:
        """The reader thread: the child's outcomes to their jobs, its states to their waiters, until it exits."""
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "outcomes":
                _, outcomes, self._running = message
                self._deliver(read_outcomes(outcomes))
            elif message[0] == "state":
                _, token, state = message
                future = self._states.get(token)
                if future is not None:
                    future.get_loop().call_soon_threadsafe(_resolve, future, state)
        self._process.join(1)
        code = self._process.exitcode
        self._running = 0
        stopped = self._stopping.is_set() and code == 0
        why = self._gone = f"the engine process exited (code {code})"
        for future in list(self._states.values()):  # /server_info waiting on a state that will not come
            future.get_loop().call_soon_threadsafe(_fail, future, SpecdeployError(why))
        self._end_all(None if stopped else why)


def _resolve(future: asyncio.Future, value: Any) -> None:
    if not future.done():  # its waiter may have timed out
        future.set_result(value)


def _fail(future: asyncio.Future, error: Exception) -> None:
    if not future.done():
        future.set_exception(error)
