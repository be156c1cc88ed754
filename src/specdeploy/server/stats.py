"""Server-wide counters: SGLang's cumulative accept length for /server_info, and Prometheus metrics."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specdeploy.server.generation import Generation

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# how often the event loop's lag is sampled: a timer this far apart costs the loop nothing
LAG_PERIOD_S = 0.01


@dataclass
class LatencySums:
    """Requests timed, and their summed seconds: time to first token, end-to-end latency, first-token handoff."""

    requests: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    handoff: float = 0.0


@dataclass
class LagSums:
    """The event loop's lag: timers sampled, their summed and largest lateness (seconds)."""

    samples: int = 0
    total: float = 0.0
    largest: float = 0.0


class ServerStats:
    """Counts finished requests; one registry per server so that several servers can live in one process."""

    def __init__(self, queue_size: Callable[[], int], running: Callable[[], int]) -> None:
        self._lock = threading.Lock()
        self._accepted_tokens = 0  # tokens committed by verify steps since boot or the last flush
        self._verify_steps = 0
        self._latency = LatencySums()  # since boot or the last flush
        self._lag = LagSums()  # since boot or the last flush
        self.registry = CollectorRegistry()
        self.requests = Counter("sglang:num_requests", "Requests finished", registry=self.registry)
        self.aborted = Counter("sglang:num_aborted_requests", "Requests aborted", registry=self.registry)
        self.prompt_tokens = Counter("sglang:prompt_tokens", "Prompt tokens", registry=self.registry)
        self.generation_tokens = Counter(
            "sglang:generation_tokens", "Generated tokens", registry=self.registry
        )
        self.e2e_latency = Histogram(
            "sglang:e2e_request_latency_seconds",
            "End-to-end latency",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds",
            "Time to first token",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.step_accept = Histogram(
            "specdeploy:step_accept_length",
            "Tokens committed per verify step, bonus included",
            buckets=(1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32),
            registry=self.registry,
        )
        accept = Gauge(
            "sglang:spec_accept_length", "Mean accept length since boot or flush", registry=self.registry
        )
        accept.set_function(lambda: self.avg_accept_length or 0.0)
        Gauge("sglang:num_queue_reqs", "Requests waiting", registry=self.registry).set_function(queue_size)
        Gauge("sglang:num_running_reqs", "Requests running", registry=self.registry).set_function(running)

    def record(self, gen: Generation, first_step_at: float | None = None) -> None:
        """Count one finished (or aborted) generation; `first_step_at`: when the engine side handed its first
        step over (the first token's handoff lasts until the event loop took it)."""
        if gen.finish_reason is not None and gen.finish_reason["type"] == "abort":
            self.aborted.inc()
        self.requests.inc()
        self.prompt_tokens.inc(len(gen.prompt_ids))
        self.generation_tokens.inc(len(gen.output_ids))
        if gen.finished_at is not None:
            self.e2e_latency.observe(gen.finished_at - gen.arrived_at)
        if gen.ttft is not None:
            self.ttft.observe(gen.ttft)
        for length in gen.accept_lengths:
            self.step_accept.observe(length)
        with self._lock:
            self._accepted_tokens += sum(gen.accept_lengths)
            self._verify_steps += gen.verify_ct
            if gen.ttft is not None and gen.finished_at is not None and first_step_at is not None:
                sums = self._latency
                sums.requests += 1
                sums.ttft += gen.ttft
                sums.e2e += gen.finished_at - gen.arrived_at
                sums.handoff += gen.first_token_at - first_step_at

    @property
    def avg_accept_length(self) -> float | None:
        with self._lock:
            return self._accepted_tokens / self._verify_steps if self._verify_steps else None

    async def watch_event_loop(self, period_s: float = LAG_PERIOD_S) -> None:
        """Sample, until cancelled, how late a timer `period_s` away fires on this event loop: the time every
        callback then waits for the loop (a request's arrival, a step's handoff, a streamed event)."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + period_s
            await asyncio.sleep(period_s)
            late = max(loop.time() - due, 0.0)
            with self._lock:
                lag = self._lag
                lag.samples += 1
                lag.total += late
                lag.largest = max(lag.largest, late)

    def latency(self) -> dict[str, float | int | None]:
        """Means over the requests finished since boot or the last flush: time to first token and end-to-end
        latency from their arrival in the server (prompt parsed and tokenised) to their first and last step, and
        the first token's handoff, from the engine side handing it over (worker thread, or the engine process's
        reader thread) to the event loop taking it (a busy event loop shows here); and the event loop's lag
        (`watch_event_loop`), mean and largest, over the same time."""
        with self._lock:
            sums, lag = self._latency, self._lag
            count, ttft, e2e, handoff = sums.requests, sums.ttft, sums.e2e, sums.handoff
            samples, late, largest = lag.samples, lag.total, lag.largest
        return {
            "requests": count,
            "ttft_ms_mean": round(1e3 * ttft / count, 3) if count else None,
            "e2e_ms_mean": round(1e3 * e2e / count, 3) if count else None,
            "first_token_handoff_ms_mean": round(1e3 * handoff / count, 3) if count else None,
            "event_loop_lag_ms_mean": round(1e3 * late / samples, 3) if samples else None,
            "event_loop_lag_ms_max": round(1e3 * largest, 3) if samples else None,
        }

    def flush(self) -> None:
        """Restart the cumulative accept length, as SGLang's /flush_cache does, the mean latencies and the
        event loop's lag."""
        with self._lock:
            self._accepted_tokens = self._verify_steps = 0
            self._latency = LatencySums()
            self._lag = LagSums()

    def prometheus_text(self) -> bytes:
        return generate_latest(self.registry)
