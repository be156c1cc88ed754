"""Streamed HTTP/1.1 POSTs on raw asyncio connections, each server-sent event timed as its bytes arrive.

Why not a general HTTP client for the timed path: with one, a chunk is timed when the reading task gets
to it, after every other ready stream's processing, and each chunk costs a future, a task switch and a
line reader. Here the bytes are parsed, split into SSE `data:` lines and handed to the caller inside
the transport's `data_received`, stamped with one time.monotonic_ns taken on arrival; the request's
coroutine wakes once, when the response is complete. Connections are kept alive and reused.

Supports what SGLang-style servers send: chunked or Content-Length bodies, or a body that ends with
the connection; http and https. A response with a status other than 200 is read whole, not parsed.

A server that dies closes its connections, and the requests on them fail at once (StreamBroken). One
whose listening socket is gone while a connection it accepted stays open and silent (a process shutting
down, or an in-process server that lost an accepted socket) would leave a request waiting for its whole
timeout: so when a request fails on a broken or refused connection while others are still waiting, the
poster tries a new connection, and if the server's address refuses it those others fail too (ServerGone).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

EventHandler = Callable[[bytes, int], None]  # (the data of one `data:` line, arrival time in ns)

MAX_ERROR_BODY = 1 << 16  # bytes of a non-200 body kept for the error message
MAX_HEAD = 1 << 16
PROBE_TIMEOUT_S = 2.0  # for the connection that asks whether anything still listens at the server's address


class StreamBroken(Exception):
    """The connection closed before the response was complete."""

    def __init__(self, received: int) -> None:
        super().__init__(f"the server closed the connection after {received} bytes of its answer")
        self.received = received


class BadResponse(Exception):
    """The server's bytes are not an HTTP/1.1 response this client understands."""


class ServerGone(ConnectionError):
    """Nothing listens at the server's address any more: an answer still awaited from it will not come."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    tls: bool
    base_path: str  # a path prefix of the server URL, e.g. "/sglang" behind a proxy; "" for none

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"server URL must look like http://HOST:PORT, got {url!r}")
        tls = parts.scheme == "https"
        return cls(parts.hostname, parts.port or (443 if tls else 80), tls, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal
        default = 443 if self.tls else 80
        return host if self.port == default else f"{host}:{self.port}"


class _Response:
    """One HTTP/1.1 response, parsed incrementally: head, then the body (chunked, sized or to close)."""

    def __init__(self, on_event: EventHandler, done: asyncio.Future[None]) -> None:
        self.on_event = on_event
        self.done = done
        self.status = 0
        self.keep_alive = True
        self.received = 0  # bytes of the response so far: zero means the server never answered
        self.error_body = bytearray()
        self._buffer = bytearray()  # bytes not yet parsed
        self._lines = bytearray()  # body bytes not yet split into lines
        self._state = "head"
        self._remaining = 0  # of the current chunk, or of a Content-Length body
        self._chunked = False
        self._until_close = False
        self.failure: BaseException | None = None

    def feed(self, data: bytes, t_ns: int) -> None:
        self.received += len(data)
        try:
            if self._state == "size" and not self._buffer:
                data = self._whole_chunks(data, t_ns)
            self._buffer += data
            self._parse(t_ns)
        except Exception as exc:  # a bad response or a failing handler ends this request, not the loop
            self.fail(exc)

    def _whole_chunks(self, data: bytes, t_ns: int) -> bytes:
        """The usual case, a read of whole chunks (one event each), parsed without buffering; returns the rest."""
        at = 0
        while (end := data.find(b"\r\n", at)) >= 0:
            size = int(data[at:end].split(b";", 1)[0], 16)
            start, stop = end + 2, end + 2 + size
            if size == 0 or stop + 2 > len(data):
                break  # the last chunk, or one not all here: the general parser takes it from here
            if data[stop : stop + 2] != b"\r\n":
                raise BadResponse("a chunk of the chunked body does not end with CRLF")
            self._body(data[start:stop], t_ns)
            at = stop + 2
        return data[at:]

    def fail(self, exc: BaseException) -> None:
        self.keep_alive = False
        if not self.done.done():
            self.failure = exc
            self.done.set_result(None)

    def lost(self) -> None:
        """The connection closed: the end of a body read to close, else a broken stream."""
        self.keep_alive = False
        if self._until_close and self._state == "body":
            self._finish()
        else:
            self.fail(StreamBroken(self.received))

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def _parse(self, t_ns: int) -> None:
        buffer = self._buffer
        while not self.done.done():
            if self._state == "head":
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(buffer) > MAX_HEAD:
                        raise BadResponse("the response head is larger than 64 KiB")
                    return
                head = bytes(buffer[:end])
                del buffer[: end + 4]
                self._on_head(head)
            elif self._state == "size":
                end = buffer.find(b"\r\n")
                if end < 0:
                    return
                size = int(bytes(buffer[:end]).split(b";", 1)[0], 16)
                del buffer[: end + 2]
                self._remaining, self._state = size, ("data" if size else "trailer")
            elif self._state == "data":
                if not buffer:
                    return
                take = min(self._remaining, len(buffer))
                self._body(bytes(buffer[:take]), t_ns)
                del buffer[:take]
                self._remaining -= take
                if self._remaining == 0:
                    self._state = "data_end"
            elif self._state == "data_end":
                if len(buffer) < 2:
                    return
                if buffer[:2] != b"\r\n":
                    raise BadResponse("a chunk of the chunked body does not end with CRLF")
                del buffer[:2]
                self._state = "size"
            elif self._state == "trailer":
                end = buffer.find(b"\r\n")
                if end < 0:
                    return
                del buffer[: end + 2]
                if end == 0:  # the empty line after the last chunk (and any trailers)
                    self._complete(t_ns)
            else:  # "body": sized or to the connection's close
                if buffer:
                    take = len(buffer) if self._until_close else min(self._remaining, len(buffer))
                    self._body(bytes(buffer[:take]), t_ns)
                    del buffer[:take]
                    self._remaining -= take
                if not self._until_close and self._remaining == 0:
                    self._complete(t_ns)
                return

    def _on_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise BadResponse(f"not an HTTP response: {lines[0][:80]!r}")
        status = int(parts[1])
        if 100 <= status < 200:
            return  # an interim response (100 Continue): the real head follows
        self.status = status
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip().lower()
        if parts[0] == "HTTP/1.0" or headers.get("connection") == "close":
            self.keep_alive = False
        if "chunked" in headers.get("transfer-encoding", ""):
            self._chunked, self._state = True, "size"
        elif "content-length" in headers:
            self._remaining, self._state = int(headers["content-length"]), "body"
        else:
            self._until_close, self._state, self.keep_alive = True, "body", False

    def _body(self, data: bytes, t_ns: int) -> None:
        if self.status != 200:
            self.error_body += data[: MAX_ERROR_BODY - len(self.error_body)]
            return
        if self._lines:  # the start of a line came in an earlier piece
            self._lines += data
            data = bytes(self._lines)
            self._lines.clear()
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            if data.startswith(b"data:", start):
                self.on_event(data[start + 5 : end].strip(), t_ns)
            start = end + 1
        self._lines += data[start:]

    def _complete(self, t_ns: int) -> None:
        if self.status == 200 and self._lines.startswith(b"data:"):  # a last line without its newline
            self.on_event(bytes(self._lines[5:]).strip(), t_ns)
        self._finish()


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.response: _Response | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        no_delay(transport)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        if self.response is None:
            self.close()  # bytes nobody asked for: this connection cannot be trusted with another request
            return
        self.response.feed(data, now)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.response is not None:
            self.response.lost()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class StreamingPoster:
    """POSTs to one server and streams the answers back, over a pool of kept-alive connections."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.endpoint = Endpoint.parse(url)
        self.headers = headers
        self._idle: list[_Connection] = []
        self._waiting: set[_Response] = set()  # answers awaited now, each on its own connection
        self._ssl = ssl.create_default_context() if self.endpoint.tls else None

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()

    async def post(
        self, path: str, body: bytes, on_event: EventHandler, timeout_s: float
    ) -> tuple[int, bytes]:
        """Send `body` to `path` and feed each SSE data line of a 200 answer to `on_event` as it arrives.

        Returns (status, body kept for an error message: empty for 200). Raises OSError when no
        connection can be made, StreamBroken when the answer stops early, ServerGone (an OSError) when
        another request found that nothing listens at the server's address any more, BadResponse on
        garbage, asyncio.TimeoutError after `timeout_s` in all, waiting for the first byte and between
        chunks included (the connection is then closed). The request is written before the first
        suspension when a kept-alive connection is free: no task is made for it, since a new task waits
        behind every other ready stream before it runs.
        """
        deadline = time.monotonic() + timeout_s
        request = self._request(path, body)
        try:
            connection, reused = await self._connection(timeout_s)
            try:
                return await self._exchange(connection, request, on_event, deadline)
            except StreamBroken as exc:
                if not reused or exc.received:
                    raise
            # The server closed a kept-alive connection as the request went out: nothing was answered, so
            # the request goes again, once, on a new connection.
            connection = await self._open(deadline - time.monotonic())
            return await self._exchange(connection, request, on_event, deadline)
        except (asyncio.TimeoutError, ServerGone):
            raise
        except (StreamBroken, OSError):
            # The server hung up on this request or refused it: if it is gone, the answers other requests
            # still wait for will not come either, even on a connection that stays open.
            if self._waiting and not await self._listening():
                self._fail_waiting()
            raise

    def _request(self, path: str, body: bytes) -> bytes:
        """The request's bytes: the one place that says which headers a request carries."""
        lines = [f"POST {self.endpoint.base_path}{path} HTTP/1.1", f"Host: {self.endpoint.host_header}"]
        lines += [f"{name}: {value}" for name, value in self.headers.items()]
        lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    async def _connection(self, timeout_s: float) -> tuple[_Connection, bool]:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                return connection, True
        return await self._open(timeout_s), False

    async def _listening(self) -> bool:
        """False when every address of the server refuses a new connection: nothing listens there now.
        True when a connection is made, and when the attempt says nothing (an error other than a refusal,
        or no answer within PROBE_TIMEOUT_S)."""
        loop = asyncio.get_running_loop()
        try:
            addresses = await loop.getaddrinfo(
                self.endpoint.host, self.endpoint.port, type=socket.SOCK_STREAM
            )
        except OSError:
            return True
        for family, kind, proto, _, address in addresses:
            sock = socket.socket(family, kind, proto)
            sock.setblocking(False)
            try:
                await asyncio.wait_for(loop.sock_connect(sock, address), PROBE_TIMEOUT_S)
            except ConnectionRefusedError:
                continue
            except (OSError, asyncio.TimeoutError):
                return True
            finally:
                sock.close()
            return True
        return False

    def _fail_waiting(self) -> None:
        where = f"{self.endpoint.host}:{self.endpoint.port}"
        for response in list(self._waiting):
            response.fail(
                ServerGone(
                    f"the server at {where} stopped (it refuses new connections): this answer will not "
                    f"come ({response.received} bytes of it had arrived)"
                )
            )

    async def _open(self, timeout_s: float) -> _Connection:
        loop = asyncio.get_running_loop()
        hostname = self.endpoint.host if self._ssl is not None else None
        opening = loop.create_connection(
            _Connection, self.endpoint.host, self.endpoint.port, ssl=self._ssl, server_hostname=hostname
        )
        _, connection = await asyncio.wait_for(opening, max(timeout_s, 0))
        return connection

    async def _exchange(
        self, connection: _Connection, request: bytes, on_event: EventHandler, deadline: float
    ) -> tuple[int, bytes]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        response = connection.response = _Response(on_event, done)
        assert connection.transport is not None
        if connection.closed:  # closed by the server before this request could go out (as a server dies)
            response.lost()
        self._waiting.add(response)
        try:
            connection.transport.write(request)
            # A future, not a coroutine: wait_for then adds a timer, not a task.
            await asyncio.wait_for(done, max(deadline - time.monotonic(), 0))
        except BaseException:
            connection.close()
            raise
        finally:
            self._waiting.discard(response)
        connection.response = None
        if response.failure is not None:
            connection.close()
            raise response.failure
        if response.keep_alive and not connection.closed:
            self._idle.append(connection)
        else:
            connection.close()
        return response.status, bytes(response.error_body)


def no_delay(transport: asyncio.BaseTransport) -> None:
    """Small writes go out at once: with Nagle's algorithm a chunk waits for the peer's delayed ACK (40 ms)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
