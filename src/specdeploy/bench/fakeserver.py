"""A loopback SGLang look-alike that streams at a known rate, to check the bench against the truth.

It speaks /generate (cumulative text, output_ids and meta_info with the speculative counters),
/v1/chat/completions and /v1/completions (per-chunk usage), /health, /server_info, /model_info,
/v1/models and /flush_cache. Every answer has `output_tokens` tokens sent in chunks of
`tokens_per_chunk`: the first chunk `ttft_s` after the request, then one chunk every `gap_s`.
Each chunk is one verify step, so spec_verify_ct = number of chunks. It logs when it received each
request and wrote each chunk (time.monotonic_ns, one clock for all processes of a machine).

Run it alone with `python -m specdeploy.bench.fakeserver --port 30000 --ttft 0.05 --gap 0.01 -k 4`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web


@dataclass(frozen=True)
class StreamPlan:
    ttft_s: float = 0.05
    gap_s: float = 0.01
    tokens_per_chunk: int = 4
    output_tokens: int = 32


@dataclass
class Truth:
    """What the server did for one request, on its own clock."""

    received_ns: int
    writes_ns: list[int] = field(default_factory=list)


class FakeServer:
    def __init__(self, plan: StreamPlan, model: str = "fake-model") -> None:
        self.plan = plan
        self.model = model
        self.truth: dict[str, Truth] = {}  # by prompt text
        self.flushes = 0
        self.requests = 0
        self.on_request: Callable[[int], None] | None = None  # called with the running request count

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/generate", self._generate)
        app.router.add_post("/v1/chat/completions", self._openai)
        app.router.add_post("/v1/completions", self._openai)
        app.router.add_get("/health", self._health)
        app.router.add_get("/server_info", self._server_info)
        app.router.add_get("/model_info", self._model_info)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/flush_cache", self._flush)
        app.router.add_get("/truth", self._truth)
        return app

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(text="")

    async def _model_info(self, _: web.Request) -> web.Response:
        return web.json_response({"model_path": self.model})

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": self.model}]})

    async def _truth(self, _: web.Request) -> web.Response:
        return web.json_response({k: asdict(v) for k, v in self.truth.items()})

    async def _server_info(self, _: web.Request) -> web.Response:
        return web.json_response({"engine": "fake", "plan": asdict(self.plan)})

    async def _flush(self, _: web.Request) -> web.Response:
        self.flushes += 1
        return web.Response(text="Cache flushed.")

    async def _chunks(self, key: str, max_new: int) -> Any:
        """Yields the cumulative token count at each chunk, keeping the schedule against drift."""
        truth = self.truth[key] = Truth(received_ns=time.monotonic_ns())
        self.requests += 1
        if self.on_request is not None:
            self.on_request(self.requests)
        total = min(self.plan.output_tokens, max_new)
        due = truth.received_ns / 1e9 + self.plan.ttft_s
        for tokens in range(
            self.plan.tokens_per_chunk, total + self.plan.tokens_per_chunk, self.plan.tokens_per_chunk
        ):
            await asyncio.sleep(max(due - time.monotonic(), 0))
            yield min(tokens, total)
            truth.writes_ns.append(time.monotonic_ns())
            due += self.plan.gap_s

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        key = body.get("text") or json.dumps(body.get("input_ids"))
        max_new = body.get("sampling_params", {}).get("max_new_tokens", self.plan.output_tokens)
        response = await _open_sse(request)
        chunks = 0
        async for tokens in self._chunks(key, max_new):
            chunks += 1
            ids = list(range(tokens))
            finished = tokens == min(self.plan.output_tokens, max_new)
            meta = {
                "prompt_tokens": len(key.split()),
                "completion_tokens": tokens,
                "spec_verify_ct": chunks,
                "spec_accept_length": tokens / chunks,
                "finish_reason": {"type": "length", "length": tokens} if finished else None,
            }
            await _send(response, {"text": _text(ids), "output_ids": ids, "meta_info": meta})
        await response.write(b"data: [DONE]\n\n")
        return response

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        chat = "messages" in body
        key = json.dumps(body["messages"]) if chat else str(body.get("prompt"))
        response = await _open_sse(request)
        previous = 0
        async for tokens in self._chunks(key, body.get("max_tokens", self.plan.output_tokens)):
            piece = _text(list(range(previous, tokens)))
            choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            usage = {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1}
            await _send(response, {"choices": [choice], "usage": usage})
            previous = tokens
        await _send(response, {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        await response.write(b"data: [DONE]\n\n")
        return response


def _text(ids: list[int]) -> str:
    return "".join(f" t{i}" for i in ids)


async def _open_sse(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    return response


async def _send(response: web.StreamResponse, event: dict[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")


class ServerThread:
    """Runs a FakeServer on a loopback port in a background thread; `stop()` kills it mid-stream."""

    def __init__(self, server: FakeServer, port: int = 0) -> None:
        self.server = server
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fake server did not start within 10 s")
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._startup())
        self._ready.set()
        self._loop.run_forever()

    async def _startup(self) -> None:
        self._runner = web.AppRunner(self.server.app(), shutdown_timeout=0)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restart on the same port at once
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]  # the port the OS picked when asked for port 0
        await web.SockSite(self._runner, sock).start()

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--ttft", type=float, default=StreamPlan.ttft_s)
    parser.add_argument("--gap", type=float, default=StreamPlan.gap_s)
    parser.add_argument("-k", "--tokens-per-chunk", type=int, default=StreamPlan.tokens_per_chunk)
    parser.add_argument("-n", "--output-tokens", type=int, default=StreamPlan.output_tokens)
    args = parser.parse_args()
    plan = StreamPlan(args.ttft, args.gap, args.tokens_per_chunk, args.output_tokens)
    print(
        f"fake SGLang server on http://127.0.0.1:{args.port}, {math.ceil(plan.output_tokens / plan.tokens_per_chunk)} chunks per answer",
        flush=True,
    )
    web.run_app(FakeServer(plan).app(), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
