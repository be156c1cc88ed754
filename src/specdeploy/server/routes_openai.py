"""OpenAI-compatible /v1/completions, /v1/chat/completions and /v1/models, in SGLang's response shapes."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from specdeploy.server.api_errors import ApiError
from specdeploy.server.generation import Generation
from specdeploy.server.http_utils import check_texts, read_model, service_of, sse_stream
from specdeploy.server.openai_protocol import (
    OPENAI_NAMES,
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    StreamOptions,
)
from specdeploy.server.params import parse_sampling_params
from specdeploy.server.service import EngineService
from specdeploy.server.worker import Job
from specdeploy.sglang_protocol import (
    ChatFlavor,
    CompletionFlavor,
    Flavor,
    OpenAIStream,
    usage,
)

router = APIRouter()


@router.get("/v1/models")
async def list_models(request: Request) -> dict[str, Any]:
    service = service_of(request)
    return {"object": "list", "data": [_model_card(service)]}


@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, request: Request) -> dict[str, Any]:
    service = service_of(request)
    if model != service.model_name:
        raise ApiError(
            f"The model '{model}' does not exist", 404, param="model", err_type="invalid_request_error"
        )
    return _model_card(service)


def _model_card(service: EngineService) -> dict[str, Any]:
    return {
        "id": service.model_name,
        "object": "model",
        "created": int(service.started_at),
        "owned_by": "sglang",
        "root": service.model_name,
        "parent": None,
        "max_model_len": service.limits.max_context,
    }


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    service = service_of(request)
    req: CompletionRequest = await read_model(request, CompletionRequest)
    _check_common(req, service)
    if req.echo or req.suffix:
        raise ApiError("echo and suffix are not supported by the reference engine.", param="echo")
    prompts = _completion_prompts(req, service, request)
    params = parse_sampling_params(req.sampling_params(req.max_tokens), service.limits, names=OPENAI_NAMES)
    gens = [service.new_generation(ids, params, "prompt") for ids in prompts]
    return await _respond(request, service, req, gens, CompletionFlavor(req.return_token_ids))


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    service = service_of(request)
    req: ChatCompletionRequest = await read_model(request, ChatCompletionRequest)
    _check_common(req, service)
    if not req.messages:
        raise ApiError("Messages cannot be empty.", param="messages")
    if req.tools:
        raise ApiError("tools (function calling) are not supported by the reference engine.", param="tools")
    if req.stream and req.return_token_ids:
        raise ApiError(
            "return_token_ids is not supported with streaming on /v1/chat/completions (as in SGLang); "
            "use /v1/completions or a non-streaming request.",
            param="return_token_ids",
        )
    prompt_ids = _chat_prompt(req, service, request)
    max_new_tokens = req.max_output_tokens()
    if max_new_tokens is None:  # SGLang's default: whatever room the context leaves
        max_new_tokens = max(service.limits.max_context - len(prompt_ids), 1)
    field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    params = parse_sampling_params(
        req.sampling_params(max_new_tokens), service.limits, names={**OPENAI_NAMES, "max_new_tokens": field}
    )
    gen = service.new_generation(prompt_ids, params, "messages")
    return await _respond(request, service, req, [gen], ChatFlavor(req.return_token_ids))


def _check_common(req: SamplingFields, service: EngineService) -> None:
    if req.model is not None and req.model not in service.model_aliases:
        raise ApiError(
            f"The model '{req.model}' does not exist; this server serves '{service.model_name}' (see /v1/models).",
            404,
            param="model",
        )
    req.refuse_unsupported()


def _completion_prompts(req: CompletionRequest, service: EngineService, request: Request) -> list[list[int]]:
    prompt = req.prompt
    if not prompt:
        raise ApiError("Prompt cannot be empty", param="prompt")
    if isinstance(prompt, str):
        check_texts(request, [prompt], "prompt")
        return [service.tokenizer.encode(prompt)]
    if isinstance(prompt[0], str):
        check_texts(request, prompt, "prompt")
        return [service.tokenizer.encode(p) for p in prompt]
    if isinstance(prompt[0], int):
        return [prompt]
    return prompt


def _chat_prompt(req: ChatCompletionRequest, service: EngineService, request: Request) -> list[int]:
    messages = [{"role": m.role, "content": m.text()} for m in req.messages]
    # one prompt: the messages together must fit, and the template only adds to them
    check_texts(request, ["".join(m["content"] for m in messages)], "messages")
    kwargs = dict(req.chat_template_kwargs or {})
    if "chat_template" in kwargs:
        raise ApiError("A request-supplied chat_template is not allowed.", param="chat_template_kwargs")
    try:
        text = service.tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=not req.continue_final_message,
            continue_final_message=req.continue_final_message,
            **kwargs,
        )
    except Exception as exc:  # a template that rejects these messages or kwargs is the request's fault
        raise ApiError(
            f"The chat template could not render these messages: {exc}", param="messages"
        ) from None
    return service.tokenizer.encode(text, add_special_tokens=False)


def _finish(gen: Generation) -> tuple[str | None, Any]:
    """OpenAI's finish_reason and SGLang's matched_stop (a token id or a stop string)."""
    reason = gen.finish_reason
    if reason is None:
        return None, None
    return reason["type"], reason.get("matched")


def _usage(gens: list[Generation]) -> dict[str, Any]:
    return usage(sum(len(g.prompt_ids) for g in gens), sum(len(g.output_ids) for g in gens))


async def _respond(
    request: Request,
    service: EngineService,
    req: SamplingFields,
    gens: list[Generation],
    flavor: Flavor,
) -> Response:
    jobs = service.submit_all(gens)
    # SGLang echoes the model the client named
    model, created = req.model or service.model_name, int(time.time())
    if req.stream:
        header = flavor.header(gens[0].rid, model, created, chunk=True)
        return StreamingResponse(
            _stream(service, req, gens, jobs, header, flavor), media_type="text/event-stream"
        )
    if not await service.complete_all(gens, jobs, request):
        return Response(status_code=499)  # the client is gone: nobody reads this, it only ends the handler
    choices = [flavor.choice(i, gen.text, list(gen.output_ids), *_finish(gen)) for i, gen in enumerate(gens)]
    header = flavor.header(gens[0].rid, model, created, chunk=False)
    return JSONResponse({**header, "choices": choices, "usage": _usage(gens)})


async def _stream(
    service: EngineService,
    req: SamplingFields,
    gens: list[Generation],
    jobs: list[Job],
    header: dict[str, Any],
    flavor: Flavor,
) -> AsyncIterator[bytes]:
    """One chunk per engine step (its text delta and tokens; the steps queued while the server was behind share
    one); usage on every chunk with continuous_usage_stats,
    else once at the end with include_usage."""
    options = req.stream_options or StreamOptions()
    events = OpenAIStream(flavor, header, options.include_usage, options.continuous_usage_stats)

    async def chunks() -> AsyncIterator[bytes]:
        for i, (gen, job) in enumerate(zip(gens, jobs, strict=True)):
            for event in events.opening(i, len(gen.prompt_ids), len(gen.output_ids)):
                yield event
            sent = ""
            async for token_ids in service.follow(gen, job):
                delta, sent = gen.text[len(sent) :], gen.text
                yield events.step(i, delta, token_ids, _finish(gen), len(gen.prompt_ids), len(gen.output_ids))
            for event in events.closing(i, _finish(gen), len(gen.prompt_ids), len(gen.output_ids)):
                yield event
        for event in events.final(sum(len(g.prompt_ids) for g in gens), sum(len(g.output_ids) for g in gens)):
            yield event

    async for event in sse_stream(chunks(), jobs):
        yield event
