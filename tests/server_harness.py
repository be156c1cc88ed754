"""Running the reference server on a loopback port inside the test process, and reading its SSE streams."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from specdeploy.engine.runtime import load_engine
from specdeploy.server.app import create_app
from specdeploy.server.engine_process import EngineRecipe
from specdeploy.server.guard import HttpGuard
from specdeploy.server.launch import uvicorn_config
from specdeploy.server.service import ServerConfig

APPS: dict[str, Any] = {}  # base URL -> the app `running_server` serves there, while it runs


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def running_server(
    pair: tuple[Path, Path],
    mode: str,
    budget: int | None = None,
    guard: HttpGuard | None = None,
    engine_process: bool = False,
    policy_budgets: tuple[int, ...] | None = None,
    **config: Any,
) -> Iterator[str]:
    """Serve a fresh engine over the pair in a thread (uvicorn, real sockets); yields the base URL.
    `engine_process`: the engine in a process of its own, as `specdeploy serve` runs it (`policy_budgets`:
    --budget auto's there)."""
    target, draft = pair
    draft = None if mode == "ar" else draft
    engine = load_engine(target, draft, mode, budget, weights=not engine_process)
    if engine_process:
        running = config.get("max_running_requests", ServerConfig.max_running_requests)
        config["engine_recipe"] = EngineRecipe(
            target, draft, mode, budget, "cpu", "auto", None, None, running, policy_budgets
        )
    guard = guard or HttpGuard()
    app = create_app(engine, ServerConfig(**config), guard)
    port = free_port()
    # the connection `serve` runs: read deadlines, connection cap and lingering close included
    server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", port, "warning", guard))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    APPS[url] = app
    try:
        yield url
    finally:
        del APPS[url]
        server.should_exit = True
        thread.join(30)


def sse_events(response: httpx.Response) -> list[Any]:
    """The JSON payloads of an SSE body, checking that it ends with `data: [DONE]`."""
    chunks = [c for c in response.text.split("\n\n") if c.strip()]
    assert chunks[-1] == "data: [DONE]", chunks[-1]
    assert all(c.startswith("data: ") for c in chunks)
    return [json.loads(c[len("data: ") :]) for c in chunks[:-1]]
