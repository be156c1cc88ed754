"""A small load generator for an SGLang-compatible server: N streaming /generate requests at a concurrency.

Not a benchmark (that is `specdeploy bench`): it answers "does it hold up, and roughly how fast" with
requests/s, output tokens/s and the error count.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field

import httpx

from specdeploy.api_key import auth_headers
from specdeploy.errors import SpecdeployError


@dataclass
class RequestOutcome:
    ok: bool
    output_tokens: int = 0
    latency_s: float = 0.0
    accept_length: float | None = None
    error: str | None = None


@dataclass
class LoadReport:
    url: str
    concurrency: int
    requests: int
    errors: int
    duration_s: float
    requests_per_s: float
    output_tokens_per_s: float
    mean_latency_s: float
    mean_accept_length: float | None
    first_errors: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


async def _one_request(client: httpx.AsyncClient, url: str, payload: dict) -> RequestOutcome:
    start = time.perf_counter()
    last: dict | None = None
    try:
        async with client.stream("POST", url + "/generate", json=payload) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                return RequestOutcome(False, error=f"HTTP {response.status_code}: {body[:200]}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: ") :])
                if "error" in event:
                    return RequestOutcome(False, error=str(event["error"])[:200])
                last = event
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        return RequestOutcome(False, error=f"{type(exc).__name__}: {exc}")
    if last is None:
        return RequestOutcome(False, error="the stream ended without any output")
    meta = last["meta_info"]
    return RequestOutcome(
        True,
        output_tokens=meta["completion_tokens"],
        latency_s=time.perf_counter() - start,
        accept_length=meta.get("spec_accept_length"),
    )


async def run_load(url: str, concurrency: int, requests: int, max_new_tokens: int, prompt: str) -> LoadReport:
    if concurrency < 1 or requests < 1 or max_new_tokens < 1:
        raise SpecdeployError("--concurrency, --requests and --max-new-tokens must all be at least 1")
    url = url.rstrip("/")
    payload = {
        "text": prompt,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens},
        "stream": True,
    }
    todo = iter(range(requests))
    outcomes: list[RequestOutcome] = []

    async def client_loop(client: httpx.AsyncClient) -> None:
        for _ in todo:  # one shared iterator: each loop takes the next request as soon as it is free
            outcomes.append(await _one_request(client, url, payload))

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(600.0), limits=limits, headers=auth_headers()
    ) as client:
        try:
            await client.get(url + "/health", timeout=10.0)
        except httpx.HTTPError as exc:
            raise SpecdeployError(
                f"no server answers at {url} ({exc}); start one with `specdeploy serve`"
            ) from exc
        start = time.perf_counter()
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
        duration = time.perf_counter() - start
    good = [o for o in outcomes if o.ok]
    accepts = [o.accept_length for o in good if o.accept_length is not None]
    return LoadReport(
        url=url,
        concurrency=concurrency,
        requests=requests,
        errors=len(outcomes) - len(good),
        duration_s=duration,
        requests_per_s=len(good) / duration,
        output_tokens_per_s=sum(o.output_tokens for o in good) / duration,
        mean_latency_s=sum(o.latency_s for o in good) / len(good) if good else 0.0,
        mean_accept_length=sum(accepts) / len(accepts) if accepts else None,
        first_errors=[o.error for o in outcomes if o.error][:3],
    )
