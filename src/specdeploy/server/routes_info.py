"""Health, identity and housekeeping routes: /health, /health_generate, /ready, /model_info, /server_info,
/flush_cache, /metrics."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from fastapi import APIRouter, Query
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from specdeploy.engine.decode import SamplingParams, Step
from specdeploy.server.api_errors import ApiError
from specdeploy.server.http_utils import service_of
from specdeploy.server.service import SPECULATIVE_ALGORITHMS
from specdeploy.server.worker import Job

router = APIRouter()

HEALTH_CHECK_TIMEOUT_S = 20.0
HEALTH_POLL_S = 1.0
HEALTH_PROBE = SamplingParams(temperature=0.0, max_new_tokens=1)
MAX_FLUSH_WAIT_S = 3600.0  # /flush_cache?timeout=: an hour is longer than any benchmark's drain
FLUSH_POLL_S = 0.05


@router.get("/health")
async def health(request: Request) -> Response:
    """Liveness without generating (SGLang's default): 503 once the worker stops or shutdown began."""
    return Response(status_code=200 if service_of(request).worker.alive else 503)


@router.get("/ready")
async def ready(request: Request) -> Response:
    return Response(status_code=200 if service_of(request).worker.alive else 503)


@router.get("/health_generate")
async def health_generate(request: Request) -> Response:
    """Generate one token; any step the engine makes meanwhile (another request's) counts as healthy too.

    The probe takes a place in the queue like any request: with the queue full it queues nothing and waits
    for the running requests' steps instead.
    """
    worker = service_of(request).worker
    if not worker.alive:
        return Response(status_code=503)
    started = time.perf_counter()
    try:
        job: Job | None = worker.submit([0], HEALTH_PROBE)
    except ApiError:  # full, or shutting down (then the worker is no longer alive below)
        job = None
    try:
        while time.perf_counter() - started < HEALTH_CHECK_TIMEOUT_S:
            if job is None:
                await asyncio.sleep(HEALTH_POLL_S)
            else:
                try:
                    if isinstance(await asyncio.wait_for(job.steps.get(), HEALTH_POLL_S), Step):
                        return Response(status_code=200)
                except asyncio.TimeoutError:  # not yet the builtin TimeoutError on Python 3.10
                    pass
            if worker.last_step_at > started:
                return Response(status_code=200)
            if not worker.alive:
                break
        return Response(status_code=503)
    finally:
        if job is not None:
            job.cancel()


@router.get("/model_info")
@router.get("/get_model_info")
async def model_info(request: Request) -> dict[str, Any]:
    service = service_of(request)
    engine = service.engine
    target_config = engine.target.config
    return {
        "model_path": str(engine.target_path),
        "served_model_name": service.model_name,
        "tokenizer_path": str(engine.target_path),
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": target_config.raw.get("model_type"),
        "architectures": [target_config.architecture],
    }


@router.get("/server_info")
@router.get("/get_server_info")
async def server_info(request: Request) -> dict[str, Any]:
    """Launch settings in SGLang's names, `internal_states` with the running accept length, and the engine."""
    service = service_of(request)
    engine = service.engine
    internal: dict[str, Any] = {
        "num_running_reqs": service.worker.num_running,
        "num_queue_reqs": service.worker.num_waiting,
    }
    avg = service.stats.avg_accept_length
    if service.spec.num_draft_tokens is not None and avg is not None:
        internal["avg_spec_accept_length"] = avg
    # arrival in this server to first and last step; with the engine loop's own admitted-to-first-token time,
    # it tells where a client's time to first token goes
    internal["server_latency"] = service.stats.latency()
    state = await service.worker.engine_state()
    if state["policy"] is not None:
        internal["ddtree_budget_policy"] = state["policy"]
    if state["loop"] is not None:  # since start or the last /flush_cache
        internal["engine_loop"] = state["loop"]
    internal["cuda_graphs_captured_at_startup"] = state["graphs_captured"]
    internal["startup_capture_and_measure_s"] = round(state["startup_s"], 3)
    draft = service.spec.num_draft_tokens
    return {
        "model_path": str(engine.target_path),
        "tokenizer_path": str(engine.target_path),
        "served_model_name": service.model_name,
        "speculative_algorithm": SPECULATIVE_ALGORITHMS[engine.mode],
        "speculative_draft_model_path": None if engine.draft_path is None else str(engine.draft_path),
        "speculative_num_draft_tokens": None if draft is None else draft + 1,
        "context_length": service.limits.max_context,
        "device": str(engine.device),
        "max_running_requests": service.config.max_running_requests,
        "max_queued_requests": service.config.max_queued_requests,
        "startup_time": service.started_at,
        "internal_states": [internal],
        "version": service.engine_info()["version"],
        "frontend": "python",
        "engine": service.engine_info(),
    }


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request, timeout: str = Query("0")) -> Response:
    """Restart the cumulative counters once idle, like SGLang (the engine keeps no cache across requests)."""
    service = service_of(request)
    deadline = time.monotonic() + _flush_timeout(timeout)
    # polled on the event loop: a waiting flush holds no thread, and ends when its client leaves
    while not service.worker.idle and time.monotonic() < deadline:
        if await request.is_disconnected():
            return Response(status_code=499)
        await asyncio.sleep(min(FLUSH_POLL_S, max(deadline - time.monotonic(), 0.0)))
    if not service.worker.idle:
        return PlainTextResponse(
            "Flush cache failed: requests are running or waiting; retry when idle or pass ?timeout=SECONDS.\n",
            status_code=400,
        )
    service.stats.flush()
    service.worker.reset_loop_times()
    return PlainTextResponse(
        "Cache flushed.\nPlease check backend logs for more details. "
        "(When there are running or waiting requests, the operation will not be performed.)\n"
    )


def _flush_timeout(raw: str) -> float:
    """The seconds /flush_cache may wait for the server to become idle: finite, from 0 to MAX_FLUSH_WAIT_S."""
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not 0 <= seconds <= MAX_FLUSH_WAIT_S:  # also false for nan
        raise ApiError(
            f"timeout must be a number of seconds from 0 to {MAX_FLUSH_WAIT_S:g}, got {raw[:60]!r}.",
            param="timeout",
        )
    return seconds


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(service_of(request).stats.prometheus_text(), media_type=CONTENT_TYPE_LATEST)
