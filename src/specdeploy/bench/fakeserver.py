"""A loopback SGLang look-alike that streams at a known rate, to check benchmark clients against the truth.

It speaks /generate (cumulative text, output_ids and meta_info with the speculative counters),
/v1/completions and /v1/chat/completions (usage per chunk or at the end, as the request's
`stream_options` ask), /health, /server_info, /model_info, /v1/models and /flush_cache, with every
event shaped by `specdeploy.sglang_protocol`, the code the reference server answers with.

Every answer has min(`output_tokens`, the request's limit) tokens in chunks of `tokens_per_chunk`:
the first chunk `ttft_s` after the request arrived, then one chunk every `gap_s`. Each chunk is one
verify step, so spec_verify_ct = number of chunks. The served model has a byte-level tokenizer
(`specdeploy.zoo.byte_tokenizer`: one token per UTF-8 byte, its chat template), so prompt token counts
are real counts a client can reproduce, and output token i is one ASCII letter.

It logs, per request (keyed by the request id it answers with: the client's `rid`, else a fresh one),
when the request's first byte arrived and when each chunk went to the socket, on time.monotonic_ns
(one clock for all processes of a machine); GET /truth?since=N returns the requests from the N-th on,
in arrival order. It runs on `loopback_http`, a bare asyncio HTTP/1.1 server, for those timestamps.

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
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from specdeploy.bench.loopback_http import Handler, HttpRequest, HttpResponder, LoopbackHttpServer
from specdeploy.sglang_protocol import (
    SSE_DONE,
    ChatFlavor,
    CompletionFlavor,
    Flavor,
    OpenAIStream,
    error_body,
    meta_info,
    native_output,
    spec_metrics,
    sse,
    usage,
)

EOS_TOKEN_ID = 256  # the byte tokenizer's <|endoftext|>: the matched stop of an answer shorter than its limit
OUTPUT_LETTERS = "abcdefghijklmnopqrstuvwxyz"
DEFAULT_COMPLETION_MAX_TOKENS = 16  # SGLang's default max_tokens on /v1/completions


@dataclass(frozen=True)
class StreamPlan:
    ttft_s: float = 0.05
    gap_s: float = 0.01
    tokens_per_chunk: int = 4
    output_tokens: int = 32

    @property
    def chunks(self) -> int:
        return math.ceil(self.output_tokens / self.tokens_per_chunk)

    @property
    def request_s(self) -> float:
        """How long one full answer takes on the server: the ideal a client's request rate is judged by."""
        return self.ttft_s + self.gap_s * (self.chunks - 1)


@dataclass
class Truth:
    """What the server did for one request, on its own clock."""

    id: str
    route: str
    prompt_tokens: int
    received_ns: int
    writes_ns: list[int] = field(default_factory=list)  # when each chunk was handed to the socket
    tokens: list[int] = field(default_factory=list)  # cumulative completion tokens at each write

    def wrote(self, tokens: int) -> None:
        """Log a chunk; called just before its bytes go to the socket, when they are ready to."""
        self.writes_ns.append(time.monotonic_ns())
        self.tokens.append(tokens)


class BadRequest(Exception):
    """A request the loopback server refuses with a 400 and SGLang's error body."""


def output_text(start: int, end: int) -> str:
    """The text of output tokens start..end-1: one byte-tokenizer token (an ASCII letter) each."""
    return "".join(OUTPUT_LETTERS[i % len(OUTPUT_LETTERS)] for i in range(start, end))


def output_ids(start: int, end: int) -> list[int]:
    return [ord(OUTPUT_LETTERS[i % len(OUTPUT_LETTERS)]) for i in range(start, end)]


def text_tokens(text: str) -> int:
    """Prompt tokens of a text under the byte tokenizer (no special tokens are added)."""
    return len(text.encode())


def chat_tokens(messages: Any) -> int:
    """Prompt tokens of chat messages: the byte tokenizer's chat template, rendered, in bytes."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of {role, content} objects")
    rendered = ""
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise BadRequest("every message needs a role and a content")
        rendered += f"{message['role']}: {_content_text(message.get('content'))}\n"
    return text_tokens(rendered + "assistant: ")  # add_generation_prompt, as SGLang's chat route does


def _content_text(content: Any) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise BadRequest("message content must be a string or a list of text parts")


def prompt_tokens(prompt: Any, name: str) -> int:
    """Tokens of one prompt given as text or as token ids; a batch is refused."""
    if isinstance(prompt, str):
        return text_tokens(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    raise BadRequest(f"{name} must be one prompt (a string or a list of token ids); batches are not served")


def _positive_int(value: Any, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequest(f"{name} must be a positive integer, got {value!r}")
    return value


class FakeServer:
    def __init__(self, plan: StreamPlan, model: str = "fake-model") -> None:
        self.plan = plan
        self.model = model
        self.truth: dict[str, Truth] = {}  # by request id, in arrival order
        self.flushes = 0
        self.requests = 0
        self.on_request: Callable[[int], None] | None = None  # called with the running request count

    def routes(self) -> dict[tuple[str, str], Handler]:
        return {
            ("POST", "/generate"): self._generate,
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/completions"): self._completions,
            ("GET", "/health"): self._health,
            ("GET", "/server_info"): self._server_info,
            ("GET", "/model_info"): self._model_info,
            ("GET", "/v1/models"): self._models,
            ("POST", "/flush_cache"): self._flush,
            ("GET", "/truth"): self._truth,
        }

    async def _health(self, _: HttpRequest, out: HttpResponder) -> None:
        out.send(b"", content_type="text/plain")

    async def _model_info(self, _: HttpRequest, out: HttpResponder) -> None:
        out.send_json({"model_path": self.model, "is_generation": True})

    async def _models(self, _: HttpRequest, out: HttpResponder) -> None:
        card = {"id": self.model, "object": "model", "created": 0, "owned_by": "sglang", "root": self.model}
        out.send_json({"object": "list", "data": [card]})

    async def _truth(self, request: HttpRequest, out: HttpResponder) -> None:
        try:
            since = int(request.query.get("since", "0"))
        except ValueError:
            return _error(out, "since must be an integer", 400)
        logged = list(self.truth.values())[since:]
        out.send_json({"count": len(self.truth), "requests": [asdict(t) for t in logged]})

    async def _server_info(self, _: HttpRequest, out: HttpResponder) -> None:
        out.send_json({"engine": "fake", "plan": asdict(self.plan)})

    async def _flush(self, _: HttpRequest, out: HttpResponder) -> None:
        self.flushes += 1
        out.send(b"Cache flushed.", content_type="text/plain")

    def _log(self, body: dict[str, Any], route: str, tokens: int, received_ns: int) -> Truth:
        rid = body.get("rid")
        if rid is not None and not (isinstance(rid, str) and rid):
            raise BadRequest("rid must be a non-empty string")
        if rid in self.truth:
            raise BadRequest(f"rid {rid!r} was already used: give every request its own")
        rid = rid or uuid.uuid4().hex
        truth = self.truth[rid] = Truth(rid, route, tokens, received_ns)
        self.requests += 1
        if self.on_request is not None:
            self.on_request(self.requests)
        return truth

    async def _wait(self, truth: Truth, total: int) -> int:
        """Runs the schedule of a non-streamed answer (logged as one write); returns its number of chunks."""
        chunks = len([tokens async for tokens in self._schedule(truth, total)])
        truth.wrote(total)
        return chunks

    async def _schedule(self, truth: Truth, total: int) -> AsyncIterator[int]:
        """Yields the cumulative token count of each chunk when it is due, keeping the schedule against drift;
        the consumer logs (Truth.wrote) and writes it."""
        due = truth.received_ns / 1e9 + self.plan.ttft_s
        k = self.plan.tokens_per_chunk
        for tokens in range(k, total + k, k):
            await asyncio.sleep(max(due - time.monotonic(), 0))
            yield min(tokens, total)
            due += self.plan.gap_s

    def _finish(self, tokens: int, limit: int) -> dict[str, Any]:
        """SGLang's finish_reason: the limit, or the end of sequence when the answer is shorter."""
        if tokens >= limit:
            return {"type": "length", "length": limit}
        return {"type": "stop", "matched": EOS_TOKEN_ID}

    def _spec(self, tokens: int, chunks: int) -> dict[str, Any]:
        # Each chunk is one verify step whose drafts were all accepted (k - 1 of them, the bonus token
        # aside); at one token per chunk the drafter proposes one token per step, always rejected.
        k = self.plan.tokens_per_chunk
        draft = max(k - 1, 1)
        correct = tokens - chunks
        per_step = [k - 1] * (chunks - 1) + [tokens - k * (chunks - 1) - 1]  # the last chunk may be short
        return spec_metrics(tokens, chunks, correct, chunks * draft, per_step)

    async def _generate(self, request: HttpRequest, out: HttpResponder) -> None:
        try:
            body = _body(request)
            if (body.get("text") is None) == (body.get("input_ids") is None):
                raise BadRequest("give exactly one of text or input_ids")
            field_name = "text" if body.get("text") is not None else "input_ids"
            n_prompt = prompt_tokens(body[field_name], field_name)
            params = body.get("sampling_params") or {}
            if not isinstance(params, dict):
                raise BadRequest("sampling_params must be an object (batches are not served)")
            limit = _positive_int(params.get("max_new_tokens", 128), "max_new_tokens")  # SGLang's default
            truth = self._log(body, "generate", n_prompt, request.received_ns)
        except BadRequest as exc:
            return _error(out, str(exc), 400)
        total = min(self.plan.output_tokens, limit)

        def output(tokens: int, chunks: int) -> dict[str, Any]:
            finished = tokens == total
            latency = (time.monotonic_ns() - truth.received_ns) / 1e9 if finished else None
            finish = self._finish(tokens, limit) if finished else None
            meta = meta_info(truth.id, finish, n_prompt, tokens, latency, self._spec(tokens, chunks))
            return native_output(output_text(0, tokens), output_ids(0, tokens), meta)

        if not body.get("stream", False):
            return out.send_json(output(total, await self._wait(truth, total)))
        out.start()
        chunks = 0
        async for tokens in self._schedule(truth, total):
            chunks += 1
            event = sse(output(tokens, chunks))
            truth.wrote(tokens)
            out.write(event)
        out.write(SSE_DONE)
        out.end()

    async def _completions(self, request: HttpRequest, out: HttpResponder) -> None:
        try:
            body = _body(request)
            n_prompt = prompt_tokens(body.get("prompt"), "prompt")
            limit = _positive_int(body.get("max_tokens", DEFAULT_COMPLETION_MAX_TOKENS), "max_tokens")
        except BadRequest as exc:
            return _error(out, str(exc), 400)
        await self._openai(request, out, body, CompletionFlavor(), n_prompt, limit)

    async def _chat(self, request: HttpRequest, out: HttpResponder) -> None:
        try:
            body = _body(request)
            n_prompt = chat_tokens(body.get("messages"))
            limit = body.get("max_completion_tokens", body.get("max_tokens"))
            # SGLang's default without a limit: whatever room the context leaves, here the whole answer.
            limit = self.plan.output_tokens if limit is None else _positive_int(limit, "max_tokens")
        except BadRequest as exc:
            return _error(out, str(exc), 400)
        await self._openai(request, out, body, ChatFlavor(), n_prompt, limit)

    async def _openai(
        self,
        request: HttpRequest,
        out: HttpResponder,
        body: dict[str, Any],
        flavor: Flavor,
        n_prompt: int,
        limit: int,
    ) -> None:
        options = body.get("stream_options") or {}
        try:
            if not isinstance(options, dict):
                raise BadRequest("stream_options must be an object")
            route = "chat" if isinstance(flavor, ChatFlavor) else "completions"
            truth = self._log(body, route, n_prompt, request.received_ns)
        except BadRequest as exc:
            return _error(out, str(exc), 400)
        total = min(self.plan.output_tokens, limit)
        finish = self._finish(total, limit)
        done = (finish["type"], finish.get("matched"))
        model, created = body.get("model") or self.model, int(time.time())
        if not body.get("stream", False):
            await self._wait(truth, total)
            header = flavor.header(truth.id, model, created, chunk=False)
            choice = flavor.choice(0, output_text(0, total), output_ids(0, total), *done)
            return out.send_json({**header, "choices": [choice], "usage": usage(n_prompt, total)})
        events = OpenAIStream(
            flavor,
            flavor.header(truth.id, model, created, chunk=True),
            bool(options.get("include_usage")),
            bool(options.get("continuous_usage_stats")),
        )
        out.start()
        for event in events.opening(0, n_prompt, 0):
            out.write(event)
        sent = 0
        async for tokens in self._schedule(truth, total):
            last = done if tokens == total else (None, None)
            delta, ids = output_text(sent, tokens), output_ids(sent, tokens)
            event = events.step(0, delta, ids, last, n_prompt, tokens)
            truth.wrote(tokens)
            out.write(event)
            sent = tokens
        for event in [*events.closing(0, done, n_prompt, total), *events.final(n_prompt, total), SSE_DONE]:
            out.write(event)
        out.end()


def _body(request: HttpRequest) -> dict[str, Any]:
    try:
        body = request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _error(out: HttpResponder, message: str, status: int) -> None:
    out.send_json(error_body(message, status), status)


def _listen(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # restart on the same port at once
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)
    return sock


class ServerThread:
    """Runs a FakeServer on a loopback port in a background thread; `stop()` kills it mid-stream."""

    def __init__(self, server: FakeServer, port: int = 0) -> None:
        self.server = server
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._http = LoopbackHttpServer(server.routes())
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
        asyncio.run_coroutine_threadsafe(self._halt(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _halt(self) -> None:
        """Drop every connection, and end every task (handlers, half-made accepted connections) so that
        no socket outlives the loop: a client waiting on one would wait for its whole timeout."""
        await self._http.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        sock = _listen(self.port)
        self.port = sock.getsockname()[1]  # the port the OS picked when asked for port 0
        self._loop.run_until_complete(self._http.start(sock))
        self._ready.set()
        self._loop.run_forever()


async def _serve_forever(server: FakeServer, port: int) -> None:
    await LoopbackHttpServer(server.routes()).start(_listen(port))
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--ttft", type=float, default=StreamPlan.ttft_s)
    parser.add_argument("--gap", type=float, default=StreamPlan.gap_s)
    parser.add_argument("-k", "--tokens-per-chunk", type=int, default=StreamPlan.tokens_per_chunk)
    parser.add_argument("-n", "--output-tokens", type=int, default=StreamPlan.output_tokens)
    args = parser.parse_args()
    plan = StreamPlan(args.ttft, args.gap, args.tokens_per_chunk, args.output_tokens)
    print(f"fake SGLang server on http://127.0.0.1:{args.port}, {plan.chunks} chunks per answer", flush=True)
    asyncio.run(_serve_forever(FakeServer(plan), args.port))


if __name__ == "__main__":
    main()
