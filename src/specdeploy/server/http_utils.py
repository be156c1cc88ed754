"""Small HTTP helpers shared by the routes: JSON bodies and the service on the app state."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from specdeploy import sglang_protocol
from specdeploy.server.api_errors import ApiError
from specdeploy.server.guard import HttpGuard, body_too_large
from specdeploy.server.service import EngineFailed, EngineService
from specdeploy.server.text_limits import check_text_length
from specdeploy.server.worker import Job

# Requests are flat objects holding lists (batches of token ids, messages with content parts): a few levels.
MAX_JSON_DEPTH = 32


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
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(body_too_large(limit)["message"], 413)
        parts.append(chunk)
    return b"".join(parts)


def json_depth(value: Any) -> int:
    """Nesting depth of parsed JSON, walked without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return deepest


async def read_json(request: Request) -> Any:
    body = await _bounded_body(request, guard_of(request).max_body_bytes)
    too_deep = ApiError(
        f"The request body nests deeper than {MAX_JSON_DEPTH} levels; send a flat JSON object."
    )
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(f"The request body is not valid JSON ({exc}); send a JSON object.") from None
    except RecursionError:  # the C parser gives up on deep nesting such as `[` x 5000
        raise too_deep from None
    if json_depth(value) > MAX_JSON_DEPTH:  # shallower than the parser's limit, still deeper than any request
        raise too_deep
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
