"""Wait until a started server answers its health check, or explain with its log why it never will."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from specdeploy.api_key import auth_headers
from specdeploy.errors import SpecdeployError

if TYPE_CHECKING:
    import httpx

LOG_TAIL_LINES = 40
# /health_generate runs one real decode step (SGLang); /health only says the HTTP server is up.
HEALTH_ROUTES = ("/health_generate", "/health")


class ServerStartError(SpecdeployError):
    """The server exited or never became healthy; the message carries the end of its log."""

    def __init__(self, reason: str, log_tail: list[str]) -> None:
        self.reason = reason
        self.log_tail = log_tail
        if log_tail:
            super().__init__(
                f"{reason}; last {len(log_tail)} lines of the server log:\n" + "\n".join(log_tail)
            )
        else:
            super().__init__(f"{reason} (the server log is empty)")


def probe(client: httpx.Client, base_url: str, routes: list[str]) -> bool:
    """One health probe; drops /health_generate from `routes` for servers that do not have it."""
    # Imported here: httpx and huggingface_hub cost `specdeploy --help` a good part of a second.
    import httpx

    try:
        response = client.get(base_url + routes[0])
    except httpx.HTTPError:
        return False  # not listening yet, or busy loading: keep waiting
    if response.status_code == 404 and len(routes) > 1:
        routes.pop(0)
        return probe(client, base_url, routes)
    return response.status_code == 200


def wait_for_health(
    base_url: str,
    is_alive: Callable[[], bool],
    log_tail: Callable[[int], list[str]],
    timeout_s: float,
    poll_s: float = 1.0,
    console: Console | None = None,
) -> float:
    """Poll until healthy; returns the seconds it took. Raises ServerStartError with the log tail."""
    import httpx

    routes = list(HEALTH_ROUTES)
    start = time.monotonic()
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with (
        Progress(*columns, console=console, transient=True) as progress,
        httpx.Client(timeout=max(poll_s, 10.0), headers=auth_headers()) as client,
    ):
        task = progress.add_task(f"waiting for {base_url} to become healthy (timeout {timeout_s:.0f} s)")
        while True:
            if probe(client, base_url, routes):
                progress.update(task, description=f"{base_url} is healthy")
                return time.monotonic() - start
            if not is_alive():
                raise ServerStartError("the server exited during startup", log_tail(LOG_TAIL_LINES))
            if time.monotonic() - start > timeout_s:
                raise ServerStartError(
                    f"the server did not become healthy within {timeout_s:.0f} s "
                    "(loading a large model takes long: raise --health-timeout)",
                    log_tail(LOG_TAIL_LINES),
                )
            time.sleep(poll_s)
