"""The engine side of serving: requests by id into the batching engine, each iteration's outcome by id out.

It knows nothing of how requests arrive or where outcomes go: the worker thread (`server.worker`) and the
engine process (`server.engine_process`) each drive one, between iterations taking in new requests and
cancellations and handing on what an iteration made.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from specdeploy.engine.decode import SamplingParams, Step
from specdeploy.errors import SpecdeployError

log = logging.getLogger(__name__)

# what an iteration hands on for one request: its step, why it failed (it leaves), or None (it has ended),
# and with an adaptive budget the step's (budget, tokens predicted)
Outcome = tuple[int, "Step | str | None", "tuple[int, float] | None"]


class BatchingEngine(Protocol):
    """What serving needs of `engine.batch.BatchEngine`."""

    num_running: int
    num_waiting: int
    graphs_captured: int  # CUDA graphs captured when it was built
    startup_s: float  # seconds spent building it beyond loading: graph capture, step-cost measurement

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> Any: ...

    def cancel(self, request: Any) -> None: ...

    def iterate(self) -> list[Any]: ...


class EngineLoop:
    def __init__(self, make_engine: Callable[[], BatchingEngine]) -> None:
        """`make_engine` builds the engine, again after an engine failure (whose state is then unknown)."""
        self.make_engine = make_engine
        self.engine = make_engine()
        self.held: dict[int, Any] = {}  # request id -> the engine's request
        self._ids: dict[Any, int] = {}  # the engine's request -> its id
        # seconds from one iteration's end to the next one's start while requests were held (handing on
        # outcomes, taking new requests), and the iterations counted, since start or `reset_loop_times`
        self._between_s, self._between_count = 0.0, 0
        self._iterated_at: float | None = None  # the last iteration's end, while requests stay held
        # from admission to the iteration that made a request's first token: request id -> admitted at, and
        # the seconds summed and requests counted since start or `reset_loop_times`
        self._admitted_at: dict[int, float] = {}
        self._first_s, self._first_count = 0.0, 0

    @property
    def busy(self) -> bool:
        return bool(self.held)

    def admit(self, rid: int, prompt_ids: list[int], params: SamplingParams) -> str | None:
        """Queue a request in the engine; why it was refused (it then never runs), or None."""
        try:
            request = self.engine.submit(prompt_ids, params)
        except Exception as exc:  # refused or failed on admission: this request alone ends
            return str(exc) if isinstance(exc, SpecdeployError) else f"{type(exc).__name__}: {exc}"
        self.held[rid] = request
        self._ids[request] = rid
        self._admitted_at[rid] = time.perf_counter()
        return None

    def cancel(self, rid: int) -> None:
        """Stop a request (it leaves at the next iteration); unknown ids (already ended) are ignored."""
        request = self.held.get(rid)
        if request is not None:
            self.engine.cancel(request)

    def iterate(self) -> list[Outcome]:
        """One engine iteration: each step made, each request failed alone, then each request that ended."""
        if self._iterated_at is not None:
            self._between_s += time.perf_counter() - self._iterated_at
            self._between_count += 1
        try:
            events = self.engine.iterate()
        # the batched step failed, with no one request to blame: its requests end, never the loop
        except Exception as exc:
            log.exception("generation failed")
            outcomes: list[Outcome] = [(rid, f"{type(exc).__name__}: {exc}", None) for rid in self.held]
            self.release_all()
            self.engine = self.make_engine()
            return outcomes
        # what follows, handing on the outcomes, is the server's work
        self._iterated_at = now = time.perf_counter()
        outcomes = []
        for event in events:
            rid = self._ids[event.request]
            admitted = self._admitted_at.pop(rid, None)
            if admitted is not None and event.step is not None:  # this request's first token
                self._first_s += now - admitted
                self._first_count += 1
            if event.step is None:  # this request alone failed; the others go on
                log.error("a request failed: %s", event.error)
                outcomes.append((rid, event.error, None))
                continue
            adaptive = None
            if event.step.verified_tokens and getattr(event.request, "budgets", None):
                adaptive = (event.request.budgets[-1], event.request.predicted[-1])
            outcomes.append((rid, event.step, adaptive))
        ended = [rid for rid, request in self.held.items() if request.finished or request.cancelled]
        for rid in ended:
            del self._ids[self.held.pop(rid)]
            self._admitted_at.pop(rid, None)
            outcomes.append((rid, None, None))
        if not self.held:
            self._iterated_at = None  # the wait for requests is not the server's work
        return outcomes

    def release_all(self) -> list[int]:
        """Forget every held request (after a failure, or when stopping); their ids."""
        rids = list(self.held)
        self.held.clear()
        self._ids.clear()
        self._admitted_at.clear()
        self._iterated_at = None
        return rids

    def state(self) -> dict[str, Any]:
        """What /server_info shows of the engine: its loop's times, the budget policy, its start-up."""
        engine = self.engine
        state: dict[str, Any] = {
            "num_running": engine.num_running,
            "num_waiting": engine.num_waiting,
            "graphs_captured": engine.graphs_captured,
            "startup_s": engine.startup_s,
            "loop": None,
            "policy": None,
        }
        loop = getattr(engine, "loop", None)
        if loop is not None:
            times = loop.describe()
            times["ms_per_iteration"]["server_between_iterations"] = round(
                1e3 * self._between_s / max(self._between_count, 1), 4
            )
            # the rest of the time no request was held: below 1 under many concurrent clients, the requests spent
            # that time outside the engine (in the server, the client, or between them)
            elapsed = time.perf_counter() - loop.started
            busy = loop.seconds["iterate"] + self._between_s
            times["busy_share"] = round(min(1.0, busy / elapsed), 3) if elapsed > 0 else None
            times["ms_admitted_to_first_token"] = (
                round(1e3 * self._first_s / self._first_count, 3) if self._first_count else None
            )
            state["loop"] = times
        policy = getattr(engine, "policy", None)
        if policy is not None:
            state["policy"] = policy.describe()
        return state

    def reset_loop_times(self) -> None:
        """Start the loop's times afresh (SGLang's /flush_cache restarts its counters alike)."""
        if hasattr(self.engine, "loop"):
            self.engine.loop = type(self.engine.loop)()
        self._between_s, self._between_count = 0.0, 0
        self._first_s, self._first_count = 0.0, 0
