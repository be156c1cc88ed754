"""Run the server under uvicorn until SIGTERM or Ctrl-C, then shut down gracefully and return (exit 0)."""

from __future__ import annotations

import signal
from typing import Any

import uvicorn

from specdeploy.server.app import create_app
from specdeploy.server.service import ServerConfig

GRACEFUL_SHUTDOWN_S = 5  # open streams get this long to finish before uvicorn closes them


def serve_engine(engine: Any, config: ServerConfig, host: str, port: int, log_level: str = "info") -> None:
    app = create_app(engine, config)
    server = uvicorn.Server(
        uvicorn.Config(
            app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S
        )
    )
    # uvicorn re-raises the signal it caught once shut down, under the handler it found at start; with the
    # default handler SIGTERM would then kill the process (status 143) after an otherwise clean shutdown.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
