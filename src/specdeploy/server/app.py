"""The FastAPI app: routes, SGLang-shaped error answers, and the engine worker's life."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from specdeploy.server import routes_info, routes_native, routes_openai
from specdeploy.server.api_errors import ApiError, error_body
from specdeploy.server.guard import GuardMiddleware, HttpGuard
from specdeploy.server.service import EngineFailed, EngineService, ServerConfig
from specdeploy.server.text_limits import max_prompt_chars

log = logging.getLogger(__name__)


def create_app(engine: Any, config: ServerConfig | None = None, guard: HttpGuard | None = None) -> FastAPI:
    """An app serving `engine` (a runtime.Engine); its engine thread or process starts and stops with the app.

    `guard`: the API key and the request size limit (none and the default size without it).
    """
    service = EngineService(engine, config or ServerConfig())
    guard = guard or HttpGuard()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.worker.start()
        lag = asyncio.get_running_loop().create_task(service.stats.watch_event_loop())
        try:
            yield
        finally:
            lag.cancel()
            service.worker.stop()

    app = FastAPI(title="specdeploy reference engine", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service = service
    app.state.guard = guard
    app.state.max_prompt_chars = max_prompt_chars(service.tokenizer, service.limits.max_context)
    app.add_middleware(GuardMiddleware, guard=guard)
    for module in (routes_info, routes_native, routes_openai):
        app.include_router(module.router)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(EngineFailed, _engine_failed)
    app.add_exception_handler(Exception, _unexpected)
    return app


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.body(), status_code=exc.status)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    # SGLang answers FastAPI's 422 validation errors with 400 "Bad Request"
    assert isinstance(exc, RequestValidationError)
    return JSONResponse(error_body(str(exc.errors()), 400, "Bad Request"), status_code=400)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return JSONResponse(
        error_body(str(exc.detail), exc.status_code, str(exc.status_code)), status_code=exc.status_code
    )


async def _engine_failed(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(error_body(f"The engine failed on this request: {exc}", 500), status_code=500)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error on %s", request.url.path)
    return JSONResponse(
        error_body(f"Internal server error: {type(exc).__name__}: {exc}", 500), status_code=500
    )
