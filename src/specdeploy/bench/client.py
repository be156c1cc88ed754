"""Async streaming client for SGLang's /generate, /v1/chat/completions and /v1/completions.

Generation requests go through `http_stream.StreamingPoster` (kept-alive connections; each event
timed, as its bytes arrive, on time.monotonic_ns); the few untimed calls (health, /server_info,
/flush_cache) through one aiohttp session. Every request carries `BenchClient.headers`. Every
request becomes a RequestRecord: a failure is a record with `error` set ("<kind>: <detail>"),
never an exception out of a cell. Per chunk it records the arrival time and the cumulative
completion tokens: from `meta_info.completion_tokens` on /generate, from per-chunk `usage` on the
OpenAI routes (`stream_options.continuous_usage_stats`), or, when a server sends usage only at the
end, from the text received so far scaled to the final count (token_source "text", an estimate).
Per chunk the client keeps two ints; a cumulative /generate event is decoded for its meta_info
only, and the last one whole when the stream ends.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specdeploy.api_key import auth_headers
from specdeploy.bench.http_stream import BadResponse, EventHandler, StreamBroken, StreamingPoster
from specdeploy.bench.payloads import ROUTE_PATHS, Route
from specdeploy.bench.results import RequestRecord

if TYPE_CHECKING:
    import aiohttp

# Error kinds. CONNECTION and STREAM mean the server stopped answering mid-request.
CONNECTION = "connection"
STREAM = "stream"
TIMEOUT = "timeout"
HTTP = "http"
PROTOCOL = "protocol"
SERVER_GONE = (CONNECTION, STREAM)

_JSON = json.JSONDecoder()
META_KEY = b'"meta_info":'


def error_kind(error: str) -> str:
    return error.split(":", 1)[0]


@dataclass(frozen=True)
class RequestLabel:
    """Where a request's record belongs: its cell, its place in it, and the cell's time origin."""

    cell: str
    index: int
    prompt_id: str
    turn: int
    cell_start_ns: int


@dataclass
class _Stream:
    """What has arrived so far on one streamed request; chunk times and token counts as plain ints."""

    start_ns: int
    times_ns: list[int] = field(default_factory=list)  # arrival of each chunk with tokens, after start_ns
    tokens: list[int] = field(default_factory=list)  # cumulative completion tokens at each chunk
    text_parts: list[str] = field(default_factory=list)
    text_lengths: list[int] = field(default_factory=list)  # cumulative characters at each chunk
    ids: list[int] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    usage_per_chunk: bool = True
    finish_reason: str | None = None
    done: bool = False
    cumulative: bool = False  # a /generate stream whose events repeat the whole output so far
    last_event: bytes | None = None  # the newest such event, read whole only at the end

    @property
    def last_tokens(self) -> int:
        return self.tokens[-1] if self.tokens else 0


class BenchClient:
    """Streams generation requests to one server; use as `async with BenchClient(url) as client`."""

    def __init__(self, url: str, route: Route, timeout_s: float = 600.0, model: str | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"server URL must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.route = route
        self.timeout_s = timeout_s
        self.model = model
        self.headers: dict[str, str] = auth_headers()  # what every request to this server carries
        self._session: aiohttp.ClientSession | None = None
        self._poster: StreamingPoster | None = None

    async def __aenter__(self) -> BenchClient:
        import aiohttp  # here, not at module level: aiohttp costs `specdeploy --help` half a second

        self._session = aiohttp.ClientSession(
            headers=self.headers, timeout=aiohttp.ClientTimeout(total=self.timeout_s)
        )
        self._poster = StreamingPoster(self.url, {**self.headers, "Content-Type": "application/json"})
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._poster is not None:
            self._poster.close()
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("BenchClient used outside `async with`")
        return self._session

    @property
    def poster(self) -> StreamingPoster:
        if self._poster is None:
            raise RuntimeError("BenchClient used outside `async with`")
        return self._poster

    async def get_json(self, path: str) -> Any | None:
        """GET a JSON route; None when the server does not have it or does not answer."""
        import aiohttp

        try:
            async with self.session.get(self.url + path, timeout=aiohttp.ClientTimeout(total=30)) as resp:
                if resp.status != 200:
                    return None
                return await resp.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError):
            return None

    async def healthy(self) -> bool:
        import aiohttp

        try:
            async with self.session.get(
                self.url + "/health", timeout=aiohttp.ClientTimeout(total=30)
            ) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False

    async def flush_cache(self) -> bool:
        """Empty the server's prefix cache (and its cumulative counters); False where unsupported."""
        import aiohttp

        for method in ("POST", "GET"):  # SGLang has taken both over its versions
            try:
                async with self.session.request(
                    method, self.url + "/flush_cache", timeout=aiohttp.ClientTimeout(total=60)
                ) as resp:
                    if resp.status == 200:
                        return True
                    if resp.status not in (404, 405):
                        return False
            except (aiohttp.ClientError, asyncio.TimeoutError):
                return False
        return False

    async def model_name(self) -> str | None:
        """The served model's name for the OpenAI routes' `model` field."""
        if self.model is not None:
            return self.model
        models = await self.get_json("/v1/models")
        if isinstance(models, dict) and models.get("data"):
            return str(models["data"][0].get("id"))
        return None

    async def send(self, payload: dict[str, Any], label: RequestLabel) -> RequestRecord:
        """Send one streaming request and record its timeline; never raises for server faults."""
        sent_unix = time.time()
        stream = _Stream(start_ns=time.monotonic_ns())
        on_event = _native_handler(stream) if self.route == "generate" else _openai_handler(stream)
        body = json.dumps(payload).encode()
        error: str | None = None
        try:
            status, answer = await self.poster.post(ROUTE_PATHS[self.route], body, on_event, self.timeout_s)
            if status != 200:
                error = f"{HTTP}: {status} {answer[:300].decode(errors='replace')}"
            elif "error" in stream.meta:
                error = f"{HTTP}: server reported {stream.meta['error']}"
            elif not stream.done and stream.finish_reason is None:
                error = f"{STREAM}: ended after {stream.last_tokens} tokens without finishing"
        except asyncio.TimeoutError:
            error = f"{TIMEOUT}: no complete answer within {self.timeout_s:g} s"
        except StreamBroken as exc:
            error = f"{STREAM}: {exc}"
        except OSError as exc:
            error = f"{CONNECTION}: {type(exc).__name__} {exc}"
        except BadResponse as exc:
            error = f"{PROTOCOL}: {exc}"
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # json.JSONDecodeError included
            error = f"{PROTOCOL}: unexpected event ({type(exc).__name__} {exc})"
        end_ns = time.monotonic_ns()
        try:
            _final_output(stream)
        except (TypeError, ValueError) as exc:
            error = error or f"{PROTOCOL}: unexpected event ({type(exc).__name__} {exc})"
        return self._record(stream, label, sent_unix, end_ns, error)

    def _record(
        self, stream: _Stream, label: RequestLabel, sent_unix: float, end_ns: int, error: str | None
    ) -> RequestRecord:
        meta = stream.meta
        tokens = stream.tokens
        source = "meta_info" if self.route == "generate" else "usage"
        if self.route == "generate" and "completion_tokens" not in meta:
            source = "ids"
        if self.route != "generate" and not stream.usage_per_chunk:
            tokens, source = _estimate_from_text(stream), "text"
        completion = meta.get("completion_tokens", tokens[-1] if tokens else 0)
        return RequestRecord(
            cell=label.cell,
            index=label.index,
            prompt_id=label.prompt_id,
            turn=label.turn,
            route=self.route,
            sent_unix=sent_unix,
            start_ns=stream.start_ns - label.cell_start_ns,
            # dicts: pydantic builds the Chunks in one validation pass, faster than Chunk(...) each
            chunks=[{"t_ns": t, "tokens": k} for t, k in zip(stream.times_ns, tokens, strict=True)],
            end_ns=end_ns - stream.start_ns,
            token_source=source,
            prompt_tokens=meta.get("prompt_tokens"),
            completion_tokens=completion,
            spec_verify_ct=meta.get("spec_verify_ct"),
            spec_accept_length=meta.get("spec_accept_length"),
            ddtree_budgets=meta.get("ddtree_budgets"),
            ddtree_predicted_accept_length=meta.get("ddtree_predicted_accept_length"),
            spec_correct_drafts_histogram=meta.get("spec_correct_drafts_histogram"),
            finish_reason=stream.finish_reason,
            output_text="".join(stream.text_parts),
            output_ids=stream.ids or None,
            error=error,
        )


def _native_handler(stream: _Stream) -> EventHandler:
    def on_event(data: bytes, now: int) -> None:
        if data == b"[DONE]":
            stream.done = True
            return
        if stream.cumulative:
            meta = _meta_info_only(data)
            if meta is not None:
                stream.last_event = data
                _count(stream, meta, meta["completion_tokens"], now)
                return
        event = _JSON.decode(data.decode())
        if "error" in event:
            stream.meta["error"] = event["error"]
            return
        meta = event.get("meta_info") or {}
        ids = event.get("output_ids")
        text = event.get("text") or ""  # SGLang may leave text null on intermediate events
        # Default SGLang streams cumulative ids and text; with incremental streaming they are deltas.
        cumulative = ids is None or len(ids) == meta.get("completion_tokens", len(ids)) >= len(stream.ids)
        if cumulative:
            # From the second chunk on this is the stream's mode: later events are read for their counts
            # only, and the last one whole at the end (each event repeats the whole output so far).
            stream.cumulative = bool(stream.tokens) and "completion_tokens" in meta
            stream.text_parts = [text]
            if ids is not None:
                stream.ids = ids
        else:
            stream.text_parts.append(text)
            stream.ids.extend(ids)
        _count(stream, meta, meta.get("completion_tokens", len(stream.ids)), now)

    return on_event


def _count(stream: _Stream, meta: dict[str, Any], tokens: int, now: int) -> None:
    """Fold one /generate event's meta_info in; a chunk is recorded when the token count grew."""
    if tokens > stream.last_tokens:
        stream.times_ns.append(now - stream.start_ns)
        stream.tokens.append(tokens)
    stream.meta.update(meta)
    reason = meta.get("finish_reason")
    if reason:
        stream.finish_reason = reason.get("type", str(reason)) if isinstance(reason, dict) else str(reason)


def _meta_info_only(data: bytes) -> dict[str, Any] | None:
    """The meta_info object of a /generate event, decoded without the text and ids before it; None when
    the event has no such object with a completion count (then it is decoded whole)."""
    # Inside a JSON string every quote is escaped, so this byte pattern can only be the key itself.
    at = data.rfind(META_KEY)
    if at < 0:
        return None
    meta, _ = _JSON.raw_decode(data[at + len(META_KEY) :].decode().lstrip())
    return meta if isinstance(meta, dict) and "completion_tokens" in meta else None


def _final_output(stream: _Stream) -> None:
    """Text and ids from the last event of a cumulative stream, read whole once the stream is over."""
    if stream.last_event is None:
        return
    event = _JSON.decode(stream.last_event.decode())
    stream.text_parts = [event.get("text") or "".join(stream.text_parts)]
    if event.get("output_ids") is not None:
        stream.ids = event["output_ids"]


def _openai_handler(stream: _Stream) -> EventHandler:
    def on_event(data: bytes, now: int) -> None:
        if data == b"[DONE]":
            stream.done = True
            return
        event = _JSON.decode(data.decode())
        if "error" in event:
            stream.meta["error"] = event["error"]
            return
        usage = event.get("usage")
        if usage:
            stream.meta["prompt_tokens"] = usage.get("prompt_tokens")
            stream.meta["completion_tokens"] = usage.get("completion_tokens", 0)
        piece = ""
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            piece += choice.get("text") or delta.get("reasoning_content") or ""
            piece += delta.get("content") or ""
            if choice.get("finish_reason"):
                stream.finish_reason = str(choice["finish_reason"])
        if not piece:
            return  # the role chunk, the finish chunk and the trailing usage chunk carry no tokens
        stream.text_parts.append(piece)
        stream.text_lengths.append((stream.text_lengths[-1] if stream.text_lengths else 0) + len(piece))
        if usage:
            tokens = int(usage.get("completion_tokens", 0))
        else:
            stream.usage_per_chunk = False
            tokens = stream.last_tokens + 1
        stream.times_ns.append(now - stream.start_ns)
        stream.tokens.append(tokens)

    return on_event


def _estimate_from_text(stream: _Stream) -> list[int]:
    """Cumulative tokens per chunk in proportion to the text received, ending at the final count."""
    total = stream.meta.get("completion_tokens") or len(stream.tokens)
    chars = stream.text_lengths[-1] if stream.text_lengths else 0
    estimated: list[int] = []
    for counted, length in zip(stream.tokens, stream.text_lengths, strict=True):
        tokens = round(total * length / chars) if chars else counted
        floor = estimated[-1] + 1 if estimated else 1
        estimated.append(min(max(tokens, floor), max(total, floor)))
    return estimated
