"""The streaming HTTP/1.1 client under the bench: framing, kept-alive connections, a server's death, and the
collector held off."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import time
from pathlib import Path

import pytest

from specdeploy.bench.client import SERVER_GONE, BenchClient, RequestLabel, error_kind
from specdeploy.bench.collector import collector_paused
from specdeploy.bench.fakeserver import FakeServer, ServerThread, StreamPlan, _listen
from specdeploy.bench.http_stream import BadResponse, StreamingPoster, _Response
from specdeploy.bench.loopback_http import LoopbackHttpServer
from specdeploy.bench.runner import BenchConfig, run

EVENTS = [b'{"n": 1}', b'{"n": 2, "text": "a\\nb"}', b"[DONE]"]
BODY = b"".join(b"data: " + e + b"\n\n" for e in EVENTS)
CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"".join(b"%x;ext=1\r\n%b\r\n" % (len(piece), piece) for piece in (BODY[:7], BODY[7:30], BODY[30:]))
    + b"0\r\n\r\n"
)
SIZED = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(BODY), BODY)


def parse(response: bytes, cut: int) -> tuple[list[bytes], _Response]:
    """Feed the response in two pieces split at `cut`; returns the events seen and the parser."""
    loop = asyncio.new_event_loop()
    events: list[bytes] = []
    parser = _Response(lambda data, _: events.append(data), loop.create_future())
    parser.feed(response[:cut], 0)
    parser.feed(response[cut:], 1)
    loop.close()
    return events, parser


@pytest.mark.parametrize("response", [CHUNKED, SIZED], ids=["chunked", "sized"])
def test_events_are_the_same_wherever_the_bytes_are_split(response: bytes) -> None:
    for cut in range(len(response) + 1):
        events, parser = parse(response, cut)
        assert events == EVENTS, cut
        assert parser.done.done() and parser.failure is None and parser.keep_alive


def test_an_error_status_keeps_the_body_and_garbage_is_refused() -> None:
    answer = b'{"error": "no"}'
    events, parser = parse(
        b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%b" % (len(answer), answer), 20
    )
    assert events == [] and parser.status == 400 and bytes(parser.error_body) == answer
    _, garbage = parse(b"SSH-2.0-OpenSSH\r\n\r\n", 5)
    assert isinstance(garbage.failure, BadResponse)


def test_a_kept_alive_connection_the_server_dropped_is_retried_once_on_a_new_one() -> None:
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        answered = 0
        while await reader.readuntil(b"\r\n\r\n"):
            await reader.readexactly(2)  # the body, "{}"
            if answered == 1:  # the second request on this connection: hang up without a word
                writer.close()
                return
            writer.write(SIZED)
            answered += 1

    async def main() -> list[list[bytes]]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        poster = StreamingPoster(url, {})
        seen: list[list[bytes]] = []
        for _ in range(2):
            seen.append([])
            status, _ = await poster.post(
                "/generate", b"{}", lambda data, _, into=seen[-1]: into.append(data), 10
            )
            assert status == 200
        poster.close()
        server.close()
        return seen

    assert asyncio.run(main()) == [EVENTS, EVENTS]
    assert connections == 2


def test_a_request_on_a_connection_a_stopped_server_left_open_fails_when_another_finds_it_gone() -> None:
    """The end state of the campaign's server death: the listener is closed, a connection mid-answer is
    dropped, and a connection accepted as the server stopped is left open, never read nor answered.

    The in-process loopback server got there through CPython gh-109564 (a connection accepted just before
    asyncio's Server.close() gets a half-made transport that keeps its socket open until a garbage
    collection, and no collection runs while a cell is measured): the request on it waited its whole
    timeout. It must fail once another request finds that nothing listens at the server's address.
    """
    held: list[asyncio.StreamWriter] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        body = json.loads(await reader.readexactly(length))
        held.append(writer)
        if body["text"] == "left open":
            await asyncio.Event().wait()  # accepted and read, then neither answered nor closed
        while len(held) < 2:  # both requests are in: now the server stops
            await asyncio.sleep(0.001)
        server.close()
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await writer.drain()
        writer.transport.abort()

    async def main() -> tuple[list[str | None], float]:
        nonlocal server
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with BenchClient(url, "generate", timeout_s=60) as client:
            start = time.monotonic()
            left_open = asyncio.ensure_future(
                client.send({"text": "left open"}, RequestLabel("c", 0, "a", 0, 0))
            )
            while not held:  # the first request is accepted and read before the second goes out
                await asyncio.sleep(0.001)
            dropped = client.send({"text": "dropped"}, RequestLabel("c", 1, "b", 0, 0))
            records = await asyncio.wait_for(asyncio.gather(left_open, dropped), 10)
            elapsed = time.monotonic() - start
        for writer in held:
            writer.transport.abort()
        return [r.error for r in records], elapsed

    server: asyncio.Server
    (left_open, dropped), elapsed = asyncio.run(main())
    assert (dropped or "").startswith("stream: the server closed the connection after")
    assert (left_open or "").startswith("connection: ServerGone the server at 127.0.0.1:")
    assert error_kind(left_open or "") in SERVER_GONE and elapsed < 5


def test_the_loopback_server_stopping_as_it_accepts_leaves_no_connection_open() -> None:
    """A connection accepted in the loop pass before asyncio's Server.close() is left to a half-made transport
    that keeps its socket open until a garbage collection (CPython gh-109564): the loopback server closes it
    when it stops, as the end of a server's process would. Stopping is tried at each of the first loop
    passes after a client connects, so that one of them falls between the accept and the transport."""

    async def ends_after_stopping(passes: int) -> bool:
        listener = _listen(0)
        address = listener.getsockname()
        http = LoopbackHttpServer({})
        await http.start(listener)
        client = socket.create_connection(address)  # the listener is now readable
        client.setblocking(False)
        try:
            for _ in range(passes):
                await asyncio.sleep(0)
            await http.close()
            try:
                return await asyncio.wait_for(asyncio.get_running_loop().sock_recv(client, 1), 2) == b""
            except ConnectionResetError:
                return True
            except asyncio.TimeoutError:
                return False
        finally:
            client.close()

    async def main() -> list[bool]:
        return [await ends_after_stopping(passes) for passes in range(6)]

    gc.disable()  # a collection would close the leaked socket and hide the leak
    try:
        ended = asyncio.run(main())
    finally:
        gc.enable()
    assert ended == [True] * 6


FIRST_CHUNK = b'data: {"text": "a", "meta_info": {"completion_tokens": 1}}\n\n'


@pytest.mark.parametrize(
    "answered",
    [b"", CHUNKED[: CHUNKED.index(b"\r\n\r\n") + 4] + b"%x\r\n%b\r\n" % (len(FIRST_CHUNK), FIRST_CHUNK)],
    ids=["before the head", "after a chunk"],
)
def test_no_answer_in_time_is_a_timeout_record(answered: bytes) -> None:
    """The request's timeout holds while the first byte is awaited and while the next chunk is."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)
        writer.write(answered)
        await asyncio.sleep(30)

    async def main() -> tuple[str | None, int, float]:
        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        async with BenchClient(url, "generate", timeout_s=0.3) as client:
            start = time.monotonic()
            record = await client.send({"text": "x"}, RequestLabel("c", 0, "p", 0, 0))
            elapsed = time.monotonic() - start
        server.close()
        return record.error, len(record.chunks), elapsed

    error, chunks, elapsed = asyncio.run(main())
    assert (error or "").startswith("timeout: no complete answer within 0.3 s")
    assert chunks == (1 if answered else 0) and elapsed < 5


def test_incremental_native_streams_are_summed_not_replaced() -> None:
    """SGLang with --incremental-streaming-output sends only each step's new text and ids."""

    async def deltas(_, out) -> None:
        out.start()
        for text, total in (("ab", 2), ("cde", 5), ("f", 6)):
            meta = {"completion_tokens": total, "finish_reason": {"type": "length"} if total == 6 else None}
            event = {"text": text, "output_ids": [ord(c) for c in text], "meta_info": meta}
            out.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        out.write(b"data: [DONE]\n\n")
        out.end()

    class Incremental(FakeServer):
        def routes(self):
            return {("POST", "/generate"): deltas}

    thread = ServerThread(Incremental(StreamPlan())).start()

    async def main():
        async with BenchClient(thread.url, "generate") as client:
            return await client.send({"text": "x"}, RequestLabel("c", 0, "p", 0, 0))

    try:
        record = asyncio.run(main())
    finally:
        thread.stop()
    assert record.ok and record.output_text == "abcdef" and bytes(record.output_ids) == b"abcdef"
    assert [c.tokens for c in record.chunks] == [2, 5, 6]


def test_the_collector_is_off_while_a_cell_is_measured_and_back_after(tmp_path: Path) -> None:
    server = ServerThread(FakeServer(StreamPlan(ttft_s=0.001, gap_s=0.001, output_tokens=4))).start()
    seen: list[bool] = []
    server.server.on_request = lambda _: seen.append(gc.isenabled())  # the server shares this process
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(4)))
    config = BenchConfig(
        url=server.url,
        dataset="custom",
        data_dir=str(prompts),
        chat_template=False,
        warmup=1,
        concurrency=[2],
    )
    try:
        assert gc.isenabled()
        run(config, tmp_path / "run")
    finally:
        server.stop()
    assert seen == [True] + [False] * 4  # the warm-up request is not measured; the cell's four are
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_collector_paused_restores_what_it_found() -> None:
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled() and gc.get_freeze_count() > 0
        assert not gc.isenabled() and gc.get_freeze_count() == 0  # it was off before: it stays off
    finally:
        gc.enable()
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("a failing cell")
    assert gc.isenabled() and gc.get_freeze_count() == 0
