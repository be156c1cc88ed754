"""`bench-selftest --compare`: specdeploy's client and other clients, cell by cell, against one loopback server.

Every cell (a concurrency level) runs each client in turn, so that the machine's noise falls on all of
them alike, against the same server process. Each client is judged by the server's own log of the
cell's requests, never by its own account: the request rate the client sustained (its completed
requests over the span from the first measured request's arrival to the last one's last chunk),
its TTFT and ITL percentiles minus the same percentiles in the log, and the CPU it spent per request
while its measured requests ran. A client's warm-up requests come before its measured ones, so a
cell's measured requests are the last `requests` the server logged during that client's run.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy.bench.client import BenchClient, RequestLabel
from specdeploy.bench.collector import collector_paused
from specdeploy.bench.fakeserver import StreamPlan
from specdeploy.bench.metrics import request_timing
from specdeploy.bench.other_clients import (
    MEAN,
    TOKEN,
    CellSpec,
    ClientFailed,
    ClientReport,
    ExternalClient,
    external_clients,
    install_hint,
)
from specdeploy.bench.payloads import Route, Sampling, build_payload
from specdeploy.bench.proctree import CpuSampler
from specdeploy.bench.results import RequestRecord
from specdeploy.bench.selftest import SELFTEST_PROMPTS, fake_server_process
from specdeploy.bench.workloads import Prompt

MODEL = "fake-model"  # what the loopback server calls its model
SPECDEPLOY_ROUTES: dict[str, Route] = {"specdeploy": "generate", "specdeploy-oai": "completions"}


@dataclass(frozen=True)
class CompareRow:
    concurrency: int
    client: str
    planned: int
    completed: int
    requests_per_s: float | None
    ideal_requests_per_s: float
    ttft_error_ms: tuple[float, float] | None  # (p50, p99) of the client's TTFT minus the log's
    itl_error_ms: tuple[float, float] | None
    itl_kind: str  # what the client calls ITL: per token, per chunk, or a per-request mean
    cpu_ms_per_request: float | None
    note: str = ""  # why a figure is missing


@dataclass(frozen=True)
class Comparison:
    rows: list[CompareRow]
    missing: dict[str, str]  # package -> how to install it


def run_compare(
    levels: list[int],
    plan: StreamPlan,
    rounds: int,
    names: list[str],
    clients_dir: Path,
    progress: Callable[[str], None] = lambda _: None,
) -> Comparison:
    """Each level: specdeploy (/generate and /v1/completions), then each installed client named."""
    wanted = external_clients(names)
    clients_dir = clients_dir.expanduser().resolve()  # the clients run in their own working directories
    found: list[tuple[ExternalClient, list[str]]] = []
    missing: dict[str, str] = {}
    commands: dict[str, list[str] | None] = {}
    for client in wanted:
        if client.package not in commands:  # sglang's two backends share one install: look once
            commands[client.package] = client.command(clients_dir)
        command = commands[client.package]
        if command is None:
            missing[client.package] = install_hint(client.package, clients_dir)
        else:
            found.append((client, command))
    rows: list[CompareRow] = []
    with (
        tempfile.TemporaryDirectory(prefix="specdeploy-compare-") as tmp,
        fake_server_process(plan) as (url, pid),
    ):
        tokenizer_dir = Path(tmp) / "tokenizer"
        _write_tokenizer(tokenizer_dir)
        log = ServerLog(url)
        for concurrency in levels:
            n = concurrency * rounds
            prompts = tuple(SELFTEST_PROMPTS[i % len(SELFTEST_PROMPTS)] for i in range(n))
            for name, route in SPECDEPLOY_ROUTES.items():
                progress(f"c={concurrency} {name}")
                cell = CellSpec(
                    url, MODEL, concurrency, n, plan.output_tokens, prompts, tokenizer_dir, Path(tmp)
                )
                log.mark()
                report, cpu_s = asyncio.run(_specdeploy_cell(cell, route))
                rows.append(judge(name, TOKEN, report, log.measured(n), cpu_s, cell, plan))
            for client, command in found:
                progress(f"c={concurrency} {client.name}")
                workdir = Path(tmp) / f"c{concurrency}-{client.name}"
                cell = CellSpec(
                    url, MODEL, concurrency, n, plan.output_tokens, prompts, tokenizer_dir, workdir
                )
                rows.append(_external_cell(client, command, cell, plan, log))
    return Comparison(rows, missing)


def _write_tokenizer(directory: Path) -> None:
    from specdeploy.zoo.byte_tokenizer import write_byte_tokenizer  # deferred: it imports transformers

    directory.mkdir(parents=True)
    write_byte_tokenizer(directory)


class ServerLog:
    """The loopback server's request log, read in pieces: what arrived since the last `mark()`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.since = 0

    def _read(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/truth?since={self.since}", timeout=60) as answer:
            return json.load(answer)

    def mark(self) -> None:
        self.since = self._read()["count"]

    def measured(self, n: int) -> list[dict[str, Any]]:
        """The last n requests since the mark: a client's warm-up requests come before its measured ones."""
        return self._read()["requests"][-n:]


async def _specdeploy_cell(cell: CellSpec, route: Route) -> tuple[ClientReport, float]:
    """specdeploy's client on a cell, in this process: CPU seconds are this process's while it ran."""
    sampling = Sampling(max_new_tokens=cell.output_tokens, chat_template=False)
    payloads = [
        build_payload(route, Prompt(id=str(i), turns=(text,)), [], sampling, MODEL)
        for i, text in enumerate(cell.prompts)
    ]
    records: list[RequestRecord] = []
    async with BenchClient(cell.url, route, model=MODEL) as client:
        warm = RequestLabel("warmup", 0, "", 0, 0)
        await asyncio.gather(*(client.send(payloads[0], warm) for _ in range(cell.concurrency)))  # the pool
        pending = iter(enumerate(payloads))

        async def worker() -> None:
            for index, payload in pending:
                records.append(
                    await client.send(payload, RequestLabel("compare", index, str(index), 0, start))
                )

        with collector_paused():
            start, cpu = time.monotonic_ns(), time.process_time()
            await asyncio.gather(*(worker() for _ in range(cell.concurrency)))
            cpu = time.process_time() - cpu
    timings = [t for t in map(request_timing, records) if t is not None]
    report = ClientReport(
        completed=len(timings),
        errors=len(records) - len(timings),
        ttft_ms=[t.ttft_ms for t in timings],
        itl_ms=[v for t in timings for v in t.itl_ms],
    )
    return report, cpu


def _external_cell(
    client: ExternalClient, command: list[str], cell: CellSpec, plan: StreamPlan, log: ServerLog
) -> CompareRow:
    log.mark()
    # Generous: the cell itself, at half the planned rate, plus start-up and report writing.
    timeout_s = 2 * cell.requests / cell.concurrency * plan.request_s + 300
    process = client.run(command, cell)
    status: int | None = None
    with CpuSampler(process.pid) as sampler:
        try:
            status = process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:  # timed out, or interrupted (Ctrl-C): the client must not outlive the comparison
            if status is None:
                process.kill()
                process.wait()
    entries = log.measured(cell.requests)
    failed = _failure(client, cell, status)
    if failed:
        return _empty_row(client.name, cell, plan, client.itl_kind, failed)
    try:
        report = client.parse(cell)
    except (ClientFailed, KeyError, IndexError, TypeError, ValueError) as exc:
        return _empty_row(client.name, cell, plan, client.itl_kind, f"unreadable report: {exc}")
    cpu_s = sampler.between(*_window(entries)) if entries else None
    return judge(client.name, client.itl_kind, report, entries, cpu_s, cell, plan)


def _failure(client: ExternalClient, cell: CellSpec, status: int | None) -> str:
    if status == 0:
        return ""
    if status is None:
        return "timed out"
    lines = (cell.workdir / f"{client.name}.log").read_text(errors="replace").strip().splitlines()
    return f"exit status {status}: {lines[-1][:160] if lines else 'no output'}"


def _empty_row(name: str, cell: CellSpec, plan: StreamPlan, itl_kind: str, note: str) -> CompareRow:
    ideal = cell.concurrency / plan.request_s
    return CompareRow(cell.concurrency, name, cell.requests, 0, None, ideal, None, None, itl_kind, None, note)


def _window(entries: list[dict[str, Any]]) -> tuple[int, int]:
    """From the first measured request's arrival to the last chunk of the last one, on the server's clock."""
    return min(e["received_ns"] for e in entries), max(e["writes_ns"][-1] for e in entries if e["writes_ns"])


def log_ttft_ms(entries: list[dict[str, Any]]) -> list[float]:
    return [(e["writes_ns"][0] - e["received_ns"]) / 1e6 for e in entries if e["writes_ns"]]


def log_itl_ms(entries: list[dict[str, Any]], kind: str) -> list[float]:
    """The log's ITL: per token (each chunk's gap spread over its tokens), or one mean per request."""
    import numpy as np  # here, not at module level: numpy slows `specdeploy --help`

    values: list[float] = []
    for e in entries:
        gaps = np.diff(e["writes_ns"]) / 1e6
        new = np.diff(e["tokens"])
        if kind == MEAN:
            if new.sum() > 0:
                values.append(float(gaps.sum() / new.sum()))
        else:
            values += [float(g / k) for g, k in zip(gaps, new, strict=True) for _ in range(int(k))]
    return values


def _error(client: list[float], log: list[float]) -> tuple[float, float] | None:
    import numpy as np

    if not client or not log:
        return None
    mine, truth = np.percentile(client, [50, 99]), np.percentile(log, [50, 99])
    return float(mine[0] - truth[0]), float(mine[1] - truth[1])


def judge(
    name: str,
    itl_kind: str,
    report: ClientReport,
    entries: list[dict[str, Any]],
    cpu_s: float | None,
    cell: CellSpec,
    plan: StreamPlan,
) -> CompareRow:
    """A client's report against the server's log of the same requests."""
    rate = None
    if entries and any(e["writes_ns"] for e in entries):
        start_ns, end_ns = _window(entries)
        rate = report.completed / max((end_ns - start_ns) / 1e9, 1e-9)
    return CompareRow(
        concurrency=cell.concurrency,
        client=name,
        planned=cell.requests,
        completed=report.completed,
        requests_per_s=rate,
        ideal_requests_per_s=cell.concurrency / plan.request_s,
        ttft_error_ms=_error(report.ttft_ms, log_ttft_ms(entries)),
        itl_error_ms=_error(report.itl_ms, log_itl_ms(entries, MEAN if itl_kind == MEAN else TOKEN)),
        itl_kind=itl_kind,
        cpu_ms_per_request=None if cpu_s is None or not report.completed else cpu_s / report.completed * 1e3,
    )
