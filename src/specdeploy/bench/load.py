"""`specdeploy load`: N streaming /generate requests at a concurrency, sent by the bench client.

Not a benchmark (that is `specdeploy bench`, with workloads, sweeps and a paired baseline): it answers "does
it hold up, and roughly how fast" with requests/s, output tokens/s and the error count.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field

from specdeploy.bench.client import BenchClient, RequestLabel
from specdeploy.bench.results import RequestRecord
from specdeploy.errors import SpecdeployError


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
    records: list[RequestRecord] = []
    async with BenchClient(url, "generate") as client:
        if not await client.healthy():
            raise SpecdeployError(f"no server answers at {url}; start one with `specdeploy serve`")
        start_ns = time.monotonic_ns()

        async def client_loop() -> None:
            for index in todo:  # one shared iterator: each loop takes the next request as soon as it is free
                label = RequestLabel("load", index, str(index), 0, start_ns)
                records.append(await client.send(payload, label))

        await asyncio.gather(*(client_loop() for _ in range(concurrency)))
        duration = (time.monotonic_ns() - start_ns) / 1e9
    good = [r for r in records if r.ok]
    accepts = [r.spec_accept_length for r in good if r.spec_accept_length is not None]
    return LoadReport(
        url=url,
        concurrency=concurrency,
        requests=requests,
        errors=len(records) - len(good),
        duration_s=duration,
        requests_per_s=len(good) / duration,
        output_tokens_per_s=sum(r.completion_tokens or 0 for r in good) / duration,
        mean_latency_s=sum(r.end_ns or 0 for r in good) / len(good) / 1e9
        if good
        else 0.0,  # end_ns: from send
        mean_accept_length=sum(accepts) / len(accepts) if accepts else None,
        first_errors=[r.error for r in records if r.error][:3],
    )
