"""Is the client the bottleneck? Measure it against a loopback server that streams at a known rate.

The fake server runs in its own process and logs, on the machine-wide monotonic clock, when it
received each request and wrote each chunk. The client runs fixed-concurrency levels against it
and is judged on two things: the load it sustains (requests/s and tokens/s against the ideal the
schedule allows) and how far its TTFT and chunk arrival times are from what the server did.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy.bench.client import BenchClient, RequestLabel
from specdeploy.bench.collector import collector_paused
from specdeploy.bench.fakeserver import StreamPlan
from specdeploy.bench.metrics import distribution
from specdeploy.bench.results import Distribution, RequestRecord
from specdeploy.errors import SpecdeployError

# Repeated on purpose: a server that tells requests apart by their prompt gets them mixed up.
SELFTEST_PROMPTS = ("What is 2 + 2?", "Write a haiku about the sea.", "Name three prime numbers.")


@dataclass(frozen=True)
class LevelResult:
    concurrency: int
    requests: int
    errors: int
    elapsed_s: float
    requests_per_s: float
    ideal_requests_per_s: float
    tokens_per_s: float
    ideal_tokens_per_s: float
    ttft_error_ms: Distribution  # client TTFT minus the server's receive-to-first-write time
    chunk_lag_ms: Distribution  # chunk arrival at the client minus its write at the server
    itl_error_ms: Distribution  # client ITL per token minus the server's write gap per token
    ttft_vs_plan_ms: Distribution  # client TTFT minus the configured TTFT (server jitter included)
    client_cpu: float  # the client process's CPU seconds per second; near 1.0 it is saturated
    server_cpu: float | None  # the same for the loopback server (None where /proc is missing)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def fake_server_process(plan: StreamPlan) -> Iterator[tuple[str, int]]:
    """A FakeServer in a child process, so that it does not share the client's interpreter."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "specdeploy.bench.fakeserver",
        "--port",
        str(port),
        "--ttft",
        str(plan.ttft_s),
    ]
    argv += ["--gap", str(plan.gap_s), "-k", str(plan.tokens_per_chunk), "-n", str(plan.output_tokens)]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    try:
        _wait_for(port, process)
        yield f"http://127.0.0.1:{port}", process.pid
    finally:
        process.terminate()
        process.wait(10)


def _wait_for(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SpecdeployError(f"the loopback server exited with status {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SpecdeployError("the loopback server did not start listening within 30 s")


def run_selftest(levels: list[int], plan: StreamPlan, rounds: int = 3) -> list[LevelResult]:
    """One result per concurrency level; each level sends `rounds` requests per concurrent user."""
    if not levels or min(levels) < 1:
        raise SpecdeployError(f"concurrency levels must be >= 1, got {levels}")
    with fake_server_process(plan) as (url, pid):
        return asyncio.run(_levels(url, pid, levels, plan, rounds))


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process, from /proc (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


async def _levels(url: str, pid: int, levels: list[int], plan: StreamPlan, rounds: int) -> list[LevelResult]:
    results = []
    async with BenchClient(url, "generate") as client:
        for concurrency in levels:
            await _measure(client, pid, concurrency, concurrency, plan)  # opens the pool's connections
            results.append(await _measure(client, pid, concurrency, concurrency * rounds, plan))
    return results


def selftest_payload(rid: str, index: int, plan: StreamPlan) -> dict[str, Any]:
    """A /generate request; prompts repeat, so the server's log must tell requests apart by their `rid`."""
    text = SELFTEST_PROMPTS[index % len(SELFTEST_PROMPTS)]
    return {
        "text": text,
        "sampling_params": {"max_new_tokens": plan.output_tokens},
        "stream": True,
        "rid": rid,
    }


async def server_log(client: BenchClient, rids: list[str]) -> dict[str, dict[str, Any]]:
    """The loopback server's log entries of these requests, by request id."""
    logged = await client.get_json("/truth") or {}
    wanted = set(rids)
    return {entry["id"]: entry for entry in logged.get("requests", []) if entry["id"] in wanted}


async def _measure(client: BenchClient, pid: int, concurrency: int, n: int, plan: StreamPlan) -> LevelResult:
    tag = f"c{concurrency}n{n}t{time.monotonic_ns()}"
    rids = [f"{tag}-{i}" for i in range(n)]
    pending = iter(enumerate(rids))
    records: list[RequestRecord] = []

    async def worker() -> None:
        for index, rid in pending:
            label = RequestLabel("selftest", index, rid, 0, start_ns)
            records.append(await client.send(selftest_payload(rid, index, plan), label))

    with collector_paused():
        start_ns = time.monotonic_ns()
        start_cpu, start_server_cpu = time.process_time(), cpu_seconds(pid)
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = (time.monotonic_ns() - start_ns) / 1e9
        cpu = (time.process_time() - start_cpu) / elapsed
        end_server_cpu = cpu_seconds(pid)
    server_cpu = None
    if start_server_cpu is not None and end_server_cpu is not None:
        server_cpu = (end_server_cpu - start_server_cpu) / elapsed
    truth = await server_log(client, rids)
    return _judge(records, truth, rids, start_ns, elapsed, (cpu, server_cpu), concurrency, plan)


def _judge(
    records: list[RequestRecord],
    truth: dict[str, dict[str, Any]],
    rids: list[str],
    start_ns: int,
    elapsed: float,
    cpu: tuple[float, float | None],
    concurrency: int,
    plan: StreamPlan,
) -> LevelResult:
    import numpy as np  # here, not at module level: numpy slows `specdeploy --help`

    ttft_errors, lags, itl_errors, ttft_vs_plan = [], [], [], []
    for record in records:
        logged = truth.get(rids[record.index])
        if not record.ok or logged is None or len(logged["writes_ns"]) != len(record.chunks):
            continue
        writes = np.array(logged["writes_ns"])
        arrivals = np.array([start_ns + record.start_ns + c.t_ns for c in record.chunks])
        tokens = np.diff([0] + [c.tokens for c in record.chunks])
        ttft_errors.append((record.chunks[0].t_ns - (writes[0] - logged["received_ns"])) / 1e6)
        ttft_vs_plan.append(record.chunks[0].t_ns / 1e6 - plan.ttft_s * 1e3)
        lags.extend((arrivals - writes) / 1e6)
        itl_errors.extend(((np.diff(arrivals) - np.diff(writes)) / tokens[1:] / 1e6).tolist())
    ok = [r for r in records if r.ok]
    return LevelResult(
        concurrency=concurrency,
        requests=len(records),
        errors=len(records) - len(ok),
        elapsed_s=elapsed,
        requests_per_s=len(ok) / elapsed,
        ideal_requests_per_s=concurrency / plan.request_s,
        tokens_per_s=sum(r.completion_tokens or 0 for r in ok) / elapsed,
        ideal_tokens_per_s=concurrency * plan.output_tokens / plan.request_s,
        ttft_error_ms=distribution(ttft_errors),
        chunk_lag_ms=distribution(lags),
        itl_error_ms=distribution(itl_errors),
        ttft_vs_plan_ms=distribution(ttft_vs_plan),
        client_cpu=cpu[0],
        server_cpu=cpu[1],
    )
