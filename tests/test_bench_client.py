"""The streaming client against a loopback server with a known schedule: timings, tau, failures."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import numpy as np
import pytest

from specdeploy.bench.client import BenchClient, RequestLabel
from specdeploy.bench.fakeserver import FakeServer, ServerThread, StreamPlan
from specdeploy.bench.loopback_http import Handler, HttpRequest, HttpResponder
from specdeploy.bench.metrics import cell_metrics
from specdeploy.bench.payloads import Sampling, build_payload
from specdeploy.bench.results import RequestRecord
from specdeploy.bench.workloads import Prompt

PLAN = StreamPlan(ttft_s=0.06, gap_s=0.02, tokens_per_chunk=4, output_tokens=24)
# Loopback on a busy 2-core machine: a few ms of delivery lag is expected, tens are not.
TOLERANCE_MS = 12


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    thread = ServerThread(FakeServer(PLAN)).start()
    yield thread
    thread.stop()


async def send_all(url: str, route: str, n: int, concurrency: int) -> list[RequestRecord]:
    prompts = [Prompt(id=f"p{i}", turns=(f"prompt {i}",)) for i in range(n)]
    sampling = Sampling(max_new_tokens=64, chat_template=route == "chat")
    start = time.monotonic_ns()
    queue = list(enumerate(prompts))
    records: list[RequestRecord] = []
    async with BenchClient(url, route) as client:
        # Open the pool's connections first, as the runner's warmup does, so timings exclude TCP setup.
        warm = Prompt(id="warmup", turns=("warmup",))
        label = RequestLabel("warmup", 0, "warmup", 0, start)
        await asyncio.gather(
            *(client.send(build_payload(route, warm, [], sampling), label) for _ in range(concurrency))
        )

        async def worker() -> None:
            while queue:
                i, prompt = queue.pop(0)
                payload = {
                    **build_payload(route, prompt, [], sampling, model="fake-model"),
                    "rid": f"{route}-{i}",
                }
                records.append(await client.send(payload, RequestLabel("cell", i, prompt.id, 0, start)))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records


@pytest.mark.parametrize("route", ["generate", "chat", "completions"])
def test_timings_match_what_the_server_did(server: ServerThread, route: str) -> None:
    records = asyncio.run(send_all(server.url, route, n=8, concurrency=4))
    assert all(r.ok for r in records), [r.error for r in records]
    assert {r.token_source for r in records} == {"meta_info" if route == "generate" else "usage"}
    m = cell_metrics(records)
    assert m.output_tokens == 8 * 24 and m.tokens_per_chunk.p50 == PLAN.tokens_per_chunk
    # Against the server's own log: what the client measured is what happened, give or take delivery.
    truth = server.server.truth
    ttft_errors, gap_errors = [], []
    for r in records:
        t = truth[f"{route}-{r.index}"]
        ttft_errors.append(r.chunks[0].t_ns - (t.writes_ns[0] - t.received_ns))
        measured = np.diff([c.t_ns for c in r.chunks])
        gap_errors.extend(measured - np.diff(t.writes_ns))
    assert abs(np.median(ttft_errors)) / 1e6 < TOLERANCE_MS
    assert abs(np.median(gap_errors)) / 1e6 < TOLERANCE_MS
    # Against the plan: the server kept its schedule, and ITL per token is the chunk gap over k.
    assert m.ttft_ms.p50 == pytest.approx(PLAN.ttft_s * 1e3, abs=3 * TOLERANCE_MS)
    assert m.chunk_gap_ms.p50 == pytest.approx(PLAN.gap_s * 1e3, abs=TOLERANCE_MS)
    assert m.itl_ms.mean == pytest.approx(m.chunk_gap_ms.mean / PLAN.tokens_per_chunk, rel=1e-6)
    assert m.tpot_ms.mean == pytest.approx(m.itl_ms.mean, rel=0.05)
    if route == "generate":
        assert m.tau.mean == pytest.approx(PLAN.tokens_per_chunk)
        assert records[0].finish_reason == "stop"  # 24 tokens, below the limit of 64: an end of sequence
        # The served model's tokenizer is byte-level: the ids are the text's bytes.
        assert bytes(records[0].output_ids).decode() == records[0].output_text
    assert len(records[0].output_text) == 24


def test_connection_refused_is_a_record_not_an_exception() -> None:
    records = asyncio.run(send_all("http://127.0.0.1:9", "generate", n=2, concurrency=2))
    assert all(r.error and r.error.startswith("connection:") for r in records)
    assert cell_metrics(records).errors == {"connection": 2}


def test_http_error_and_server_reported_error() -> None:
    async def reject(_: HttpRequest, out: HttpResponder) -> None:
        out.send_json({"error": {"message": "bad sampling"}}, 400)

    async def fails_mid_stream(_: HttpRequest, out: HttpResponder) -> None:
        out.start()
        out.write(b'data: {"error": {"message": "engine failed"}}\n\ndata: [DONE]\n\n')
        out.end()

    class Broken(FakeServer):
        def routes(self) -> dict[tuple[str, str], Handler]:
            return {("POST", "/generate"): fails_mid_stream, ("POST", "/v1/completions"): reject}

    thread = ServerThread(Broken(PLAN)).start()
    try:
        native = asyncio.run(send_all(thread.url, "generate", n=1, concurrency=1))[0]
        completions = asyncio.run(send_all(thread.url, "completions", n=1, concurrency=1))[0]
    finally:
        thread.stop()
    assert native.error.startswith("http: server reported") and "engine failed" in native.error
    assert completions.error.startswith("http: 400") and "bad sampling" in completions.error


def test_openai_without_per_chunk_usage_estimates_from_text() -> None:
    async def usage_at_end(_: HttpRequest, out: HttpResponder) -> None:
        out.start()
        for piece in ("ab", "abcd", "ab"):
            out.write(f'data: {{"choices": [{{"index": 0, "text": "{piece}"}}]}}\n\n'.encode())
        out.write(b'data: {"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]}\n\n')
        out.write(b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 8}}\n\n')
        out.write(b"data: [DONE]\n\n")
        out.end()

    class EndUsage(FakeServer):
        def routes(self) -> dict[tuple[str, str], Handler]:
            return {("POST", "/v1/completions"): usage_at_end}

    thread = ServerThread(EndUsage(PLAN)).start()
    try:
        record = asyncio.run(send_all(thread.url, "completions", n=1, concurrency=1))[0]
    finally:
        thread.stop()
    assert record.ok and record.token_source == "text"
    assert [c.tokens for c in record.chunks] == [2, 6, 8]
