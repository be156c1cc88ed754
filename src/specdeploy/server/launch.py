"""Run the server under uvicorn until SIGTERM or Ctrl-C, then shut down gracefully and return (exit 0)."""

from __future__ import annotations

import ipaddress
import signal
import socket
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn

from specdeploy.errors import SpecdeployError
from specdeploy.server.app import create_app
from specdeploy.server.connection import guarded_protocol
from specdeploy.server.guard import HttpGuard
from specdeploy.server.service import ServerConfig

GRACEFUL_SHUTDOWN_S = 5  # open connections get this long to finish before uvicorn cancels them
# The engine thread releases the interpreter in every torch call and CUDA wait; with Python's default 5 ms
# switch interval, a busy event loop (many streams) then holds it up to 5 ms before the step may go on. At
# 0.1 ms, tiny-code DDTree-64 served 14.4k -> 17.5k tok/s at 16 streams on one H200 (benchmarks/results/h200-2026-12-04-server-gil).
SWITCH_INTERVAL_S = 1e-4


def check_port_free(host: str, port: int) -> None:
    """Fail before the (slow) engine load when the address cannot be bound, with a message saying so."""
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise SpecdeployError(
            f"cannot listen on {host}:{port} ({exc.strerror}): choose another --port or --host"
        ) from None


class _Server(uvicorn.Server):
    """uvicorn's server, which also stops the engine worker as soon as the exit signal arrives.

    Without that, a long generation keeps its stream open through the graceful period and is then cancelled
    mid-write; stopped first, the worker ends every request with an abort reason and the streams close.
    """

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach `host` (a name, IPv4 or IPv6 address)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def uvicorn_config(app: Any, host: str, port: int, log_level: str, guard: HttpGuard) -> uvicorn.Config:
    """uvicorn serving `app` over the guarded HTTP/1.1 connection (read deadlines, lingering close)."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        http=guarded_protocol(guard),
    )


def serve_engine(
    engine: Any,
    config: ServerConfig,
    host: str,
    port: int,
    log_level: str = "info",
    guard: HttpGuard | None = None,
    switch_interval_s: float = SWITCH_INTERVAL_S,
) -> None:
    guard = guard or HttpGuard()
    sys.setswitchinterval(switch_interval_s)
    app = create_app(engine, config, guard)
    server = _Server(uvicorn_config(app, host, port, log_level, guard), app.state.service.worker.request_stop)
    # uvicorn re-raises the signal it caught once shut down, under the handler it found at start; with the
    # default handler SIGTERM would then kill the process (status 143) after an otherwise clean shutdown.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
