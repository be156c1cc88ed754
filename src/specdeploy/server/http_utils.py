"""Small HTTP helpers shared by the routes: JSON bodies and the service on the app state."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import AsyncIterator, Iterable
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request

from specdeploy import sglang_protocol
from specdeploy.server.api_errors import ApiError
from specdeploy.server.guard import HttpGuard, body_too_large
from specdeploy.server.service import EngineFailed, EngineService
from specdeploy.server.text_limits import check_text_length
from specdeploy.server.worker import Job

# Requests are flat objects holding lists (batches of token ids, messages with content parts): a few levels.
MAX_JSON_DEPTH = 32
# JSON's \uD800 escapes parse to Python strings holding lone surrogates, which no UTF-8 codec can encode
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def service_of(request: Request) -> EngineService:
    return request.app.state.service


def guard_of(request: Request) -> HttpGuard:
    return request.app.state.guard


def check_texts(request: Request, texts: list[str], param: str) -> None:
    """Refuse texts too long for the context, and batches larger than the queue, before any is tokenised."""
    service = service_of(request)
    if len(texts) > service.worker.max_queued:  # the same refusal submit_all gives, before the work
        raise ApiError(
            f"A batch of {len(texts)} prompts can never fit the request queue ({service.worker.max_queued}); "
            "split it or raise --max-queued-requests.",
            413,
        )
    limit = request.app.state.max_prompt_chars
    for text in texts:  # each prompt must fit the context on its own
        check_text_length(len(text), limit, service.limits.max_context, param)


async def _bounded_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it passes `limit` (chunked uploads announce no length)."""
    parts, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(body_too_large(limit)["message"], 413)
            parts.append(chunk)
    except ClientDisconnect:  # gone, or cut off by the body deadline: the answer reaches nobody
        raise ApiError("The client left before its request body was complete.", 408) from None
    return b"".join(parts)


def check_json(value: Any) -> None:
    """Refuse parsed JSON nested deeper than any request, or holding a lone UTF-16 surrogate in any string
    (a key too): such a string cannot be tokenised nor written back as UTF-8. Walked without recursion."""
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(value, 1, ())]
    while stack:
        item, depth, path = stack.pop()
        if depth > MAX_JSON_DEPTH:  # shallower than the parser's limit, still deeper than any request
            raise _too_deep()
        if isinstance(item, str):
            _check_text(item, path)
        elif isinstance(item, dict):
            for key, child in item.items():
                _check_text(key, path)
                stack.append((child, depth + 1, (*path, key)))
        elif isinstance(item, list):
            stack.extend((child, depth + 1, (*path, i)) for i, child in enumerate(item))


def _too_deep() -> ApiError:
    return ApiError(f"The request body nests deeper than {MAX_JSON_DEPTH} levels; send a flat JSON object.")


def _check_text(text: str, path: tuple[Any, ...]) -> None:
    found = LONE_SURROGATE.search(text)
    if found is not None:
        where = ".".join(map(str, path)) or "the body"
        raise ApiError(
            f"{where} holds a lone UTF-16 surrogate (\\u{ord(found.group()):04x}), which is not a Unicode "
            "character; send valid UTF-8 text (a surrogate pair written as two \\u escapes is fine).",
            param=str(path[0]) if path else None,
        )


async def read_json(request: Request) -> Any:
    body = await _bounded_body(request, guard_of(request).max_body_bytes)
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(f"The request body is not valid JSON ({exc}); send a JSON object.") from None
    except RecursionError:  # the C parser gives up on deep nesting such as `[` x 5000
        raise _too_deep() from None
    except ValueError:  # Python refuses to convert integers this long (CVE-2020-10735)
        raise ApiError(
            f"The request body holds an integer of more than {sys.get_int_max_str_digits()} digits; no "
            "field takes a number that large."
        ) from None
    check_json(value)
    return value


async def read_model(request: Request, model: type[BaseModel]) -> Any:
    """Parse the body into `model`; every type or shape problem becomes one 400 naming the fields."""
    body = await read_json(request)
    if not isinstance(body, dict):
        raise ApiError(f"The request body must be a JSON object, got {type(body).__name__}.")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
        raise ApiError(f"Invalid request: {problems}") from None


async def sse_stream(events: AsyncIterator[bytes], jobs: Iterable[Job]) -> AsyncIterator[bytes]:
    """A route's events, an engine failure as SGLang's error event, then [DONE]; the jobs are cancelled
    however the stream ends (also when Starlette cancels it because the client left)."""
    try:
        async for event in events:
            yield event
    except EngineFailed as exc:
        yield sglang_protocol.sse_error(str(exc), 500)
    finally:
        for job in jobs:
            job.cancel()
    yield sglang_protocol.SSE_DONE
