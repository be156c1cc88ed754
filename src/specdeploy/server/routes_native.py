"""SGLang's native /generate: text or input_ids (one or a batch), sampling_params, cumulative streaming."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from specdeploy.server.api_errors import ApiError
from specdeploy.server.generation import Generation
from specdeploy.server.http_utils import check_texts, read_json, service_of, sse_stream
from specdeploy.server.params import parse_sampling_params
from specdeploy.server.service import EngineService
from specdeploy.server.worker import Job
from specdeploy.sglang_protocol import native_output, sse

router = APIRouter()

UNSUPPORTED_TRUE = ("return_logprob", "return_hidden_states", "return_routed_experts")


@router.api_route("/generate", methods=["POST", "PUT"])
async def generate(request: Request) -> Response:
    service = service_of(request)
    body = await read_json(request)
    gens, batched = _parse(body, service, request)
    jobs = service.submit_all(gens)
    if body.get("stream", False):
        return StreamingResponse(_stream(service, gens, jobs, batched), media_type="text/event-stream")
    if not await service.complete_all(gens, jobs, request):
        return Response(status_code=499)  # the client is gone: nobody reads this, it only ends the handler
    outputs = [_output(gen, i if batched else None) for i, gen in enumerate(gens)]
    return JSONResponse(outputs if batched else outputs[0])


def _parse(body: Any, service: EngineService, request: Request) -> tuple[list[Generation], bool]:
    """Validate the whole request before anything is queued; returns the generations and whether it is a batch."""
    if not isinstance(body, dict):
        raise ApiError(f"The request body must be a JSON object, got {type(body).__name__}.")
    if not isinstance(body.get("stream", False), bool):
        raise ApiError("stream must be true or false.", param="stream")
    for name in UNSUPPORTED_TRUE:
        if body.get(name):
            raise ApiError(f"{name} is not supported by the reference engine.", param=name)
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise ApiError("Give exactly one of text or input_ids.", param="text")
    if text is not None:
        prompts, batched, field = _text_prompts(text, service, request), isinstance(text, list), "text"
    else:
        batched = isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)
        prompts, field = (input_ids if batched else [input_ids]), "input_ids"
    if batched and not prompts:
        raise ApiError(f"{field} is an empty batch; send at least one prompt.", param=field)
    raw_params = body.get("sampling_params")
    if isinstance(raw_params, list):
        if len(raw_params) != len(prompts):
            raise ApiError(
                f"sampling_params has {len(raw_params)} entries for {len(prompts)} prompts; give one per prompt "
                "or a single object.",
                param="sampling_params",
            )
    else:
        raw_params = [raw_params] * len(prompts)
    gens = []
    for prompt, raw in zip(prompts, raw_params, strict=True):
        if not isinstance(prompt, list):
            raise ApiError(
                "input_ids must be a list of token ids or a list of such lists.", param="input_ids"
            )
        gens.append(service.new_generation(prompt, parse_sampling_params(raw, service.limits), field))
    for gen, rid in zip(gens, _request_ids(body.get("rid"), len(gens)), strict=True):
        if rid is not None:
            gen.rid = rid  # SGLang reports the client's request id as meta_info.id
    return gens, batched


def _request_ids(rid: Any, count: int) -> list[str | None]:
    if rid is None:
        return [None] * count
    rids = rid if isinstance(rid, list) else [rid]
    if len(rids) != count or not all(isinstance(r, str) and r for r in rids):
        raise ApiError(f"rid must be one non-empty string per prompt ({count}).", param="rid")
    return rids


def _text_prompts(text: Any, service: EngineService, request: Request) -> list[list[int]]:
    texts = text if isinstance(text, list) else [text]
    if not all(isinstance(t, str) for t in texts):
        raise ApiError("text must be a string or a list of strings.", param="text")
    check_texts(request, texts, "text")
    return [service.tokenizer.encode(t, add_special_tokens=False) for t in texts]


def _output(gen: Generation, index: int | None) -> dict[str, Any]:
    return native_output(gen.text, list(gen.output_ids), gen.meta_info(), index)


async def _stream(
    service: EngineService, gens: list[Generation], jobs: list[Job], batched: bool
) -> AsyncIterator[bytes]:
    """One event per engine step with the cumulative text and output_ids (SGLang's default; the steps queued while
    the server was behind share one, as in SGLang), then [DONE]."""

    async def events() -> AsyncIterator[bytes]:
        for i, (gen, job) in enumerate(zip(gens, jobs, strict=True)):
            async for _ in service.follow(gen, job):
                yield sse(_output(gen, i if batched else None))

    async for event in sse_stream(events(), jobs):
        yield event
