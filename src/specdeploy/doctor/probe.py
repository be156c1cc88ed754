"""The short probe: the built-in prompts, greedy, through the reference engine in process (the entry
`specdeploy generate` uses) or over HTTP to a running server (the bench's client and request bodies).

Both paths send the same text: the prompt as one user turn through the target's chat template (once per
thinking setting where the template has a switch), built by the bench's `build_payload`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy.bench.client import BenchClient, RequestLabel
from specdeploy.bench.payloads import ChatTemplate, Sampling, build_payload
from specdeploy.bench.workloads import Prompt
from specdeploy.doctor.acceptance import GroupMeasure, histogram_from_accept_lengths
from specdeploy.doctor.prompts import PROBE_PROMPTS, ProbePrompt
from specdeploy.errors import SpecdeployError


@dataclass(frozen=True)
class ProbeRequest:
    group: str  # e.g. `chat/zh`, or `chat/zh thinking` where the template has a thinking switch
    prompt: Prompt
    sampling: Sampling


def probe_requests(
    max_new_tokens: int, thinking_switch: str | None, chat_template: bool = True
) -> Iterator[ProbeRequest]:
    """Every request of the probe; with a thinking switch, each prompt once with thinking and once without."""
    settings: list[tuple[str, dict[str, Any]]] = [("", {})]
    if thinking_switch is not None and chat_template:
        settings = [(" thinking", {thinking_switch: True}), (" no-thinking", {thinking_switch: False})]
    for suffix, kwargs in settings:
        sampling = Sampling(max_new_tokens, 0.0, chat_template, kwargs)
        for i, p in enumerate(PROBE_PROMPTS):
            yield ProbeRequest(p.group + suffix, _prompt(p, i), sampling)


def _prompt(p: ProbePrompt, index: int) -> Prompt:
    return Prompt(id=f"{p.group}-{index}", turns=(p.text,), category=p.category)


def _groups(requests: list[ProbeRequest], drafted: int | None) -> dict[str, GroupMeasure]:
    return {r.group: GroupMeasure(r.group, drafted) for r in requests}


def probe_engine(
    engine: Any, requests: list[ProbeRequest], template: ChatTemplate | None
) -> list[GroupMeasure]:
    """Run the probe on a loaded reference engine (`engine.runtime.Engine`), one request at a time."""
    from specdeploy.engine.sampling import SamplingParams

    groups = _groups(requests, engine.block_size - 1)  # a DDTree path is no deeper than DFlash's block
    decoder = engine.decoder()
    for request in requests:
        text = build_payload("generate", request.prompt, [], request.sampling, None, template)["text"]
        ids = engine.tokenizer.encode(text, add_special_tokens=False)
        result = decoder.generate(ids, SamplingParams(max_new_tokens=request.sampling.max_new_tokens))
        # The last step was cut at the stop token or the length limit: its count says nothing of the drafts.
        steps = result.accept_lengths[:-1]
        groups[request.group].add(sum(steps), len(steps), histogram_from_accept_lengths(steps))
    return list(groups.values())


def probe_server(
    url: str,
    requests: list[ProbeRequest],
    template: ChatTemplate | None,
    drafted: int | None = None,
    timeout_s: float = 600.0,
) -> list[GroupMeasure]:
    """Run the probe against a server's native /generate, one request at a time; the acceptance comes from
    each request's meta_info (per request, so other traffic does not pollute it)."""
    return asyncio.run(_probe_server(url, requests, template, drafted, timeout_s))


async def _probe_server(
    url: str,
    requests: list[ProbeRequest],
    template: ChatTemplate | None,
    drafted: int | None,
    timeout_s: float,
) -> list[GroupMeasure]:
    groups = _groups(requests, drafted)
    async with BenchClient(url, "generate", timeout_s) as client:
        if not await client.healthy():
            raise SpecdeployError(
                f"no server answers at {url}: start it (specdeploy up / serve) or fix --url"
            )
        for index, request in enumerate(requests):
            payload = build_payload("generate", request.prompt, [], request.sampling, None, template)
            label = RequestLabel("doctor", index, request.prompt.id, 0, 0)
            record = await client.send(payload, label)
            if record.error is not None:
                raise SpecdeployError(f"probe request {request.prompt.id} to {url} failed: {record.error}")
            if not record.spec_verify_ct:
                raise SpecdeployError(
                    f"{url} reports no speculative decoding (meta_info has no spec_verify_ct): is it serving "
                    "with a drafter?"
                )
            groups[request.group].add(
                record.completion_tokens or 0, record.spec_verify_ct, record.spec_correct_drafts_histogram
            )
    return list(groups.values())


async def server_info(url: str) -> dict[str, Any]:
    async with BenchClient(url, "generate") as client:
        if not await client.healthy():
            raise SpecdeployError(
                f"no server answers at {url}: start it (specdeploy up / serve) or fix --url"
            )
        return await client.get_json("/server_info") or {}


def local_dir(path: str | None) -> Path | None:
    """A server's model path, where it is a directory on this machine (else None: its files are not here)."""
    if not path:
        return None
    directory = Path(path).expanduser()
    return directory if (directory / "config.json").is_file() else None
