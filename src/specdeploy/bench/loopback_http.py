"""A minimal HTTP/1.1 server on raw asyncio for the loopback server: each request stamped as its bytes arrive.

Why not a web framework: the loopback server is the instrument the clients are judged by. A framework
hands a request to its handler a loop iteration or more after its bytes arrived, and at 64 streams that
wait (milliseconds, behind every due chunk of every stream) would be missing from the server's log and
show up as the client's TTFT error. Here a request's arrival is the time its first byte was read, and a
chunk goes to the socket in the handler's own call. Requests with a Content-Length body, kept-alive
connections, one request at a time per connection; answers are whole (Content-Length) or chunked.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from specdeploy.bench.http_stream import no_delay

MAX_REQUEST_BYTES = 1 << 24


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str
    query: dict[str, str]
    body: bytes
    received_ns: int  # when its first byte was read, on time.monotonic_ns

    def json(self) -> Any:
        return json.loads(self.body)


class ClientGone(ConnectionError):
    """The client closed the connection while its answer was being written."""


class HttpResponder:
    """Writes one answer: whole with `send`, or as a chunked stream with `start`, `write`, `end`."""

    def __init__(self, transport: asyncio.Transport, keep_alive: bool) -> None:
        self.transport = transport
        self.keep_alive = keep_alive
        self.started = False

    def _head(self, status: int, content_type: str, extra: str) -> bytes:
        connection = "keep-alive" if self.keep_alive else "close"
        return (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: {content_type}\r\n"
            f"Connection: {connection}\r\n{extra}\r\n"
        ).encode("latin-1")

    def _write(self, data: bytes) -> None:
        if self.transport.is_closing():
            raise ClientGone("the client closed the connection")
        self.transport.write(data)

    def send(self, body: bytes, status: int = 200, content_type: str = "application/json") -> None:
        self.started = True
        self._write(self._head(status, content_type, f"Content-Length: {len(body)}\r\n") + body)

    def send_json(self, value: Any, status: int = 200) -> None:
        self.send(json.dumps(value).encode(), status)

    def start(self, content_type: str = "text/event-stream") -> None:
        self.started = True
        self._write(
            self._head(200, content_type, "Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n")
        )

    def write(self, data: bytes) -> None:
        """One chunk of a started stream, handed to the socket now."""
        self._write(b"%x\r\n%b\r\n" % (len(data), data))

    def end(self) -> None:
        self._write(b"0\r\n\r\n")


Handler = Callable[[HttpRequest, HttpResponder], Awaitable[None]]


class _Connection(asyncio.Protocol):
    def __init__(self, server: LoopbackHttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.arrived_ns = 0  # when the first byte of the request in the buffer was read
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)
        no_delay(transport)
        if self.server.closing:  # accepted just before the server closed
            self.abort()

    def data_received(self, data: bytes) -> None:
        if not self.buffer:
            self.arrived_ns = time.monotonic_ns()
        self.buffer += data
        if len(self.buffer) > MAX_REQUEST_BYTES:
            self.abort()
        elif self.task is None:
            self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        if self.task is not None:
            self.task.cancel()  # the client left: its answer is not wanted any more

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _next(self) -> None:
        """Start the handler of the next complete request in the buffer, if there is one."""
        parsed = _parse(self.buffer, self.arrived_ns)
        if parsed is None:
            return
        request, keep_alive, used = parsed
        del self.buffer[:used]
        if self.buffer:
            self.arrived_ns = time.monotonic_ns()  # a pipelined request: no earlier stamp is known
        assert self.transport is not None
        responder = HttpResponder(self.transport, keep_alive)
        self.task = asyncio.get_running_loop().create_task(self._serve(request, responder))

    async def _serve(self, request: HttpRequest, responder: HttpResponder) -> None:
        handler = self.server.routes.get((request.method, request.path))
        try:
            if handler is None:
                responder.send_json({"detail": "Not Found"}, 404)
            else:
                await handler(request, responder)
        except (ClientGone, asyncio.CancelledError):
            self.abort()
            return
        except Exception as exc:  # a broken handler: say so when nothing was sent, else drop the connection
            if responder.started:
                self.abort()
                return
            responder.send_json({"detail": f"{type(exc).__name__}: {exc}"}, 500)
        self.task = None
        if not responder.keep_alive:
            self.abort()
        elif self.buffer:
            self._next()


class _Listener(socket.socket):
    """A listening socket that keeps (weakly) every connection it accepted, for LoopbackHttpServer.close."""

    accepted: weakref.WeakSet[socket.socket]

    def accept(self) -> tuple[socket.socket, Any]:
        connection, address = super().accept()
        self.accepted.add(connection)
        return connection, address


def _parse(buffer: bytearray, arrived_ns: int) -> tuple[HttpRequest, bool, int] | None:
    """(request, keep-alive, bytes used) once a whole request is in the buffer."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    method, target, version = (lines[0].split(" ") + ["", ""])[:3]
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    if len(buffer) < end + 4 + length:
        return None
    body = bytes(buffer[end + 4 : end + 4 + length])
    keep_alive = headers.get("connection", "").lower() != "close" and version != "HTTP/1.0"
    url = urlsplit(target)
    request = HttpRequest(method, url.path, dict(parse_qsl(url.query)), body, arrived_ns)
    return request, keep_alive, end + 4 + length


class LoopbackHttpServer:
    """Serves `routes` ((method, path) -> handler) on a listening socket."""

    def __init__(self, routes: dict[tuple[str, str], Handler]) -> None:
        self.routes = routes
        self.connections: set[_Connection] = set()
        self.closing = False
        self._server: asyncio.Server | None = None
        self._listener: _Listener | None = None

    async def start(self, sock: socket.socket) -> None:
        """Serve on the listening socket `sock`, which this server takes over (and closes with `close`)."""
        listener = _Listener(sock.family, sock.type, sock.proto, fileno=sock.detach())
        listener.accepted = weakref.WeakSet()
        self._listener = listener
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), sock=listener)

    async def close(self) -> None:
        """Stop listening and drop every connection, mid-answer or not (as a server that dies does)."""
        self.closing = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.abort()
        # Aborted sockets are closed by callbacks of the loop's next passes, and connections accepted just
        # before the listener closed are made (and drop themselves) then: let those passes run.
        await asyncio.sleep(0.05)
        # A connection accepted in the loop pass just before the listener closed never gets that far: its
        # transport fails an assertion while being made (CPython gh-109564, silent outside debug mode) and
        # keeps the socket, unread and open, until a garbage collection. A dead server has no open socket.
        if self._listener is not None:
            for connection in list(self._listener.accepted):
                connection.close()
