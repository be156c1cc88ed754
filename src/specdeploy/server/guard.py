"""What the HTTP layer refuses before any route runs: requests without the API key, and oversized bodies,
and the connection's read deadlines (enforced in connection.py).

Both answers go out as SGLang's OpenAI-style error body. The size check reads only the headers: a body
announced larger than the limit is refused without being received.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from specdeploy.server.api_errors import error_body

MIB = 1 << 20
# Far above any prompt the context allows (256k tokens as JSON ids is about 2 MiB), far below what hurts.
DEFAULT_MAX_BODY_BYTES = 16 * MIB
# Probes and scrapers work without a secret. Not /health_generate: it runs the engine, so it is behind the
# key like every route that does.
OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})


# Read deadlines (connection.py), in the range of nginx's client_header_timeout / client_body_timeout (60 s)
# and Apache's mod_reqtimeout (header 20-40 s, body 20 s): short enough that idle connections cannot pile up.
HEADER_TIMEOUT_S = 20.0  # from the connection being ready for a request to the end of its headers
BODY_TIMEOUT_S = 30.0  # the longest pause while a request body is arriving
LINGER_S = 10.0  # how long an early-answered client may go on sending before the connection is closed


@dataclass(frozen=True)
class HttpGuard:
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    linger_s: float = LINGER_S


def body_too_large(limit: int) -> dict[str, Any]:
    return error_body(
        f"The request body is larger than this server's limit of {limit} bytes (--max-request-bytes); "
        "send a smaller request.",
        413,
    )


def authorized(header: str | None, api_key: str) -> bool:
    scheme, _, token = (header or "").partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(token.encode(), api_key.encode())


class GuardMiddleware:
    """ASGI middleware (not BaseHTTPMiddleware, which would hide client disconnects from the routes)."""

    def __init__(self, app: ASGIApp, guard: HttpGuard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, body = refusal
        payload = json.dumps(body).encode()
        extra = [(b"www-authenticate", b"Bearer")] if status == 401 else []
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),  # the unread body must not be taken for the next request
                    *extra,
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> tuple[int, dict[str, Any]] | None:
        key = self.guard.api_key
        path = scope["path"]
        if key and scope["method"] != "OPTIONS" and path not in OPEN_PATHS:
            if not authorized(headers.get("authorization"), key):
                message = (
                    "Invalid API key." if "authorization" in headers else "Missing API key."
                ) + " Send the server's key as `Authorization: Bearer KEY`."
                return 401, error_body(message, 401)
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.guard.max_body_bytes:
            return 413, body_too_large(self.guard.max_body_bytes)
        return None
