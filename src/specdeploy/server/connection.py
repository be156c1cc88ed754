"""The HTTP/1.1 connection: uvicorn's h11 protocol with read deadlines, a connection cap and a lingering close.

uvicorn closes an idle keep-alive connection, but not one that never finishes its headers or stops in the
middle of its body: such half-open connections pile up until the process runs out of file descriptors and
stops accepting. Here a request's headers must arrive within `header_timeout_s` of the connection becoming
ready for them, and its body may pause at most `body_timeout_s` between reads (both answered 408, then
closed). Past a cap the descriptor limit sets, or when accept() runs out of descriptors, the connections that
have waited longest for their headers are closed to make room, so that idle connections cannot lock out
working ones.

An early answer (a 413 for an announced oversized body) closes the connection while the client may still be
sending; closing a socket with unread input makes the kernel send a reset, which can destroy the answer before
the client reads it. Such a close first shuts down the sending side (the client sees the answer and the end of
it), then reads and drops what the client still sends for up to `linger_s`, as nginx's lingering close does.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import weakref
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from specdeploy.server.guard import HttpGuard

log = logging.getLogger(__name__)

FD_SPARE = 64  # descriptors kept free beside those open at start-up: logs, threads, files opened later


def open_descriptors() -> int:
    """Descriptors this process has open (Linux and macOS list them; elsewhere FD_SPARE is assumed)."""
    for listing in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(listing))
        except OSError:
            continue
    return FD_SPARE


def max_connections() -> int:
    """Client connections this process can hold open beside the descriptors it already has (the engine's
    libraries, model files) and a spare few: past it, accept() would fail and stop serving everyone."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    return max(soft - open_descriptors() - FD_SPARE, 1)


def timeout_answer(message: str) -> bytes:
    """A raw 408 response: written where h11 has no request to answer yet."""
    body = message.encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


_watched_loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


class LingeringTransport:
    """The connection's transport, whose `close()` lingers while the client may still be sending a body."""

    def __init__(self, transport: asyncio.Transport, protocol: GuardedH11Protocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._closing = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self._closing or self._transport.is_closing()

    def close(self) -> None:
        if self._protocol.conn.their_state is h11.SEND_BODY:
            self.linger()
        else:
            self.close_now()

    def linger(self) -> None:
        """Send what is written and our end of the stream, then drop what the client still sends until it
        closes or `linger_s` passes."""
        if self._closing:
            return
        self._closing = True
        transport = self._transport
        if transport.is_closing() or not transport.can_write_eof():
            transport.close()
            return
        self._protocol.lingering = True
        transport.write_eof()  # our FIN follows the answer already written
        transport.resume_reading()  # uvicorn may have paused reading a large body
        asyncio.get_running_loop().call_later(self._protocol.linger_s, transport.close)

    def close_now(self) -> None:
        self._closing = True
        self._transport.close()


class GuardedH11Protocol(H11Protocol):
    header_timeout_s: float
    body_timeout_s: float
    linger_s: float
    connection_cap: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lingering = False
        self.waiting_since: float | None = None  # when the connection began waiting for request headers
        self._timer: asyncio.TimerHandle | None = None

    # ----------------------------------------------------------------------------- uvicorn's interface

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(LingeringTransport(transport, self))  # type: ignore[arg-type]
        if self.loop not in _watched_loops:
            watch_accept_failures(self.loop, self.connections)
            _watched_loops.add(self.loop)
        self._make_room()
        self._follow_state()

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return  # the answer is out: what the client still sends is dropped
        super().data_received(data)
        self._follow_state(data_arrived=True)

    def eof_received(self) -> None:
        self._cancel_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow_state()

    # ------------------------------------------------------------------------------------ deadlines

    def _follow_state(self, data_arrived: bool = False) -> None:
        """Arm the deadline the connection's state calls for: headers (from when they became due), or body
        (from the last bytes received); none while the request is whole and the answer is being made."""
        if self.transport.is_closing():
            self._cancel_timer()
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            if self.waiting_since is None:  # a new request is due; bytes of it arriving do not extend this
                self.waiting_since = self.loop.time()
                self._arm(self.header_timeout_s, self._headers_timed_out)
        elif state is h11.SEND_BODY:
            self.waiting_since = None
            if data_arrived or self._timer is None:
                self._arm(self.body_timeout_s, self._body_timed_out)
        else:
            self.waiting_since = None
            self._cancel_timer()

    def _arm(self, seconds: float, callback: Any) -> None:
        self._cancel_timer()
        self._timer = self.loop.call_later(seconds, callback)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _headers_timed_out(self) -> None:
        self._timer = None
        message = (
            f"The request headers did not arrive within {self.header_timeout_s:g} s; connection closed.\n"
        )
        self._close_waiting(message, linger=True)

    def _close_waiting(self, message: str, linger: bool) -> None:
        """Answer 408 and close, if the connection still waits for request headers; `linger` lets a client
        in the middle of its headers read the answer rather than a reset."""
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return
        self._cancel_timer()
        self.waiting_since = None
        self.transport.write(timeout_answer(message))
        transport: LingeringTransport = self.transport  # type: ignore[assignment]
        if linger:
            transport.linger()
        else:
            transport.close_now()

    def _body_timed_out(self) -> None:
        self._timer = None
        if self.conn.their_state is not h11.SEND_BODY or self.transport.is_closing():
            return
        if self.flow.read_paused:  # the server, not the client, is holding the body back: wait on
            self._arm(self.body_timeout_s, self._body_timed_out)
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            message = (
                f"The request body stalled for {self.body_timeout_s:g} s before it was complete; "
                "connection closed.\n"
            )
            self.transport.write(timeout_answer(message))
        if cycle is not None:
            cycle.disconnected = (
                True  # the route reading the body sees the client gone; its answer is dropped
            )
            cycle.message_event.set()
        self.transport.close_now()  # type: ignore[attr-defined]

    def _make_room(self) -> None:
        """Past the connection cap, close the connections that have waited longest for their headers."""
        excess = len(self.connections) - self.connection_cap
        if excess > 0:
            close_idle(self.connections, excess, keep=self)


def close_idle(connections: set[Any], count: int, keep: Any = None) -> int:
    """Close (at once: the point is to give their descriptors back) the `count` connections that have waited
    longest for request headers; returns how many there were."""
    waiting = sorted(
        (c for c in connections if isinstance(c, GuardedH11Protocol) and c is not keep and c.waiting_since),
        key=lambda c: c.waiting_since or 0.0,
    )[:count]
    message = "The server is at its connection limit and this connection had sent no request.\n"
    for connection in waiting:
        connection._close_waiting(message, linger=False)
    return len(waiting)


def watch_accept_failures(loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
    """When accept() runs out of descriptors, close idle connections so that it succeeds on its retry.

    asyncio accepts a whole backlog of connections before any of them reaches `connection_made`, so the cap
    alone cannot keep accept() from failing; asyncio then logs the failure and retries after a second.
    """
    previous = loop.get_exception_handler()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        if isinstance(error, OSError) and error.errno in (errno.EMFILE, errno.ENFILE):
            closed = close_idle(connections, FD_SPARE)
            if closed:  # else the accepted connections have not reached connection_made yet: it retries
                log.warning("out of file descriptors: closed %d connections that had sent no request", closed)
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handle)


def guarded_protocol(guard: HttpGuard) -> type[GuardedH11Protocol]:
    """The protocol class uvicorn builds each connection with, carrying this server's limits."""
    return type(
        "GuardedConnection",
        (GuardedH11Protocol,),
        {
            "header_timeout_s": guard.header_timeout_s,
            "body_timeout_s": guard.body_timeout_s,
            "linger_s": guard.linger_s,
            "connection_cap": max_connections(),
        },
    )
