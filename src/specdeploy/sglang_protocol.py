"""SGLang's HTTP answers as plain JSON values: error bodies, SSE framing, /generate events, OpenAI chunks.

The reference server (`specdeploy serve`) and the bench's loopback server (`bench.fakeserver`) both build
every answer here, so that a client cannot tell them apart by the shape of an event. Pure: it imports
nothing from the package and nothing heavy, so that the bench may use it without the engine.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

SSE_DONE = b"data: [DONE]\n\n"


def sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def error_body(
    message: str, status: int, err_type: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """SGLang's `ErrorResponse`: {"object": "error", "message", "type", "param", "code"}."""
    return {
        "object": "error",
        "message": message,
        "type": err_type or default_error_type(status),
        "param": param,
        "code": status,
    }


def default_error_type(status: int) -> str:
    # SGLang's serving code names errors after the HTTP status ("BadRequestError", "NotFoundError", ...)
    name = HTTPStatus(status).phrase.replace(" ", "")
    return name if name.endswith("Error") else name + "Error"


def sse_error(message: str, status: int) -> bytes:
    """An error after the stream has started: the status line is already sent, so it travels as an event."""
    return sse({"error": error_body(message, status)})


# --- native /generate ---------------------------------------------------------------------------------


def spec_metrics(
    completion_tokens: int,
    verify_ct: int,
    correct: int,
    proposed: int,
    correct_per_step: list[int] | None = None,
) -> dict[str, Any]:
    """SGLang's per-request speculative counters; spec_accept_length counts the bonus token of each step.
    `correct_per_step` (drafted tokens accepted by each verify step) gives SGLang's
    `spec_correct_drafts_histogram`: entry k counts the steps that accepted exactly k. A request served by AR
    steps alone (an adaptive budget's 0) proposed no drafts: its accept rate is 0."""
    metrics: dict[str, Any] = {
        "spec_accept_rate": correct / proposed if proposed else 0.0,
        "spec_accept_length": completion_tokens / verify_ct,
        "spec_num_correct_drafts": correct,
        "spec_num_proposed_drafts": proposed,
        "spec_verify_ct": verify_ct,
    }
    if correct_per_step:
        histogram = [0] * (max(correct_per_step) + 1)
        for k in correct_per_step:
            histogram[k] += 1
        metrics["spec_correct_drafts_histogram"] = histogram
    return metrics


def meta_info(
    rid: str,
    finish_reason: dict[str, Any] | None,
    prompt_tokens: int,
    completion_tokens: int,
    e2e_latency: float | None = None,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """SGLang's meta_info; latency and speculative figures (`spec`) only once finished, as SGLang reports them."""
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish_reason,
        "prompt_tokens": prompt_tokens,
        "weight_version": "default",
        "completion_tokens": completion_tokens,
        "cached_tokens": 0,
    }
    if e2e_latency is not None:
        meta["e2e_latency"] = e2e_latency
        meta.update(spec or {})
    return meta


def native_output(
    text: str, output_ids: list[int], meta: dict[str, Any], index: int | None = None
) -> dict[str, Any]:
    """One /generate answer or stream event: the cumulative text and ids; `index` only in a batch."""
    out: dict[str, Any] = {"text": text, "output_ids": output_ids, "meta_info": meta}
    if index is not None:
        out["index"] = index
    return out


# --- OpenAI /v1/completions and /v1/chat/completions --------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
    }


class Flavor:
    """How one OpenAI route shapes its answers; subclasses differ only where the two APIs differ."""

    object_name: str
    chunk_object: str
    id_prefix: str

    def __init__(self, return_token_ids: bool = False) -> None:
        self.return_token_ids = return_token_ids

    def header(self, rid: str, model: str, created: int, chunk: bool) -> dict[str, Any]:
        return {
            "id": self.id_prefix + rid,
            "object": self.chunk_object if chunk else self.object_name,
            "created": created,
            "model": model,
        }

    def choice(
        self, index: int, text: str, token_ids: list[int], finish: str | None, matched: Any
    ) -> dict[str, Any]:
        """The choice of a whole (non-streamed) answer."""
        raise NotImplementedError

    def chunk_choice(
        self, index: int, delta: str, token_ids: list[int], finish: str | None, matched: Any
    ) -> dict[str, Any]:
        raise NotImplementedError

    def opening_choices(self, index: int) -> list[dict[str, Any]]:
        return []

    def closing_choices(self, index: int, finish: str | None, matched: Any) -> list[dict[str, Any]]:
        return []


class CompletionFlavor(Flavor):
    object_name = chunk_object = "text_completion"
    id_prefix = "cmpl-"

    def choice(
        self, index: int, text: str, token_ids: list[int], finish: str | None, matched: Any
    ) -> dict[str, Any]:
        choice = {
            "index": index,
            "text": text,
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": matched,
        }
        if self.return_token_ids:
            choice["token_ids"] = token_ids
        return choice

    def chunk_choice(
        self, index: int, delta: str, token_ids: list[int], finish: str | None, matched: Any
    ) -> dict[str, Any]:
        # the finish rides on the last text chunk
        return self.choice(index, delta, token_ids, finish, matched)


class ChatFlavor(Flavor):
    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def choice(
        self, index: int, text: str, token_ids: list[int], finish: str | None, matched: Any
    ) -> dict[str, Any]:
        message = {"role": "assistant", "content": text, "reasoning_content": None}
        choice = {
            "index": index,
            "message": message,
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": matched,
        }
        if self.return_token_ids:
            choice["response_token_ids"] = token_ids
        return choice

    def chunk_choice(
        self, index: int, delta: str, token_ids: list[int], finish: str | None, matched: Any
    ) -> dict[str, Any]:
        return _chat_delta(index, {"content": delta, "reasoning_content": None})

    def opening_choices(self, index: int) -> list[dict[str, Any]]:
        return [_chat_delta(index, {"role": "assistant", "content": ""})]

    def closing_choices(self, index: int, finish: str | None, matched: Any) -> list[dict[str, Any]]:
        return [
            _chat_delta(index, {}, finish, matched)
        ]  # SGLang sends the finish reason in a chunk of its own


def _chat_delta(
    index: int, delta: dict[str, Any], finish: str | None = None, matched: Any = None
) -> dict[str, Any]:
    return {
        "index": index,
        "delta": delta,
        "logprobs": None,
        "finish_reason": finish,
        "matched_stop": matched,
    }


class OpenAIStream:
    """The SSE events of one streamed OpenAI answer, in SGLang's order: per choice its opening chunks, one
    chunk per engine step and its closing chunks; then one usage-only chunk when `include_usage`.
    Every chunk carries the choice's usage so far with `continuous_usage`, else `usage: null`."""

    def __init__(
        self, flavor: Flavor, header: dict[str, Any], include_usage: bool, continuous_usage: bool
    ) -> None:
        self.flavor = flavor
        self.header = header
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage

    def _chunk(self, choices: list[dict[str, Any]], prompt_tokens: int, completion_tokens: int) -> bytes:
        counts = usage(prompt_tokens, completion_tokens) if self.continuous_usage else None
        return sse({**self.header, "choices": choices, "usage": counts})

    def opening(self, index: int, prompt_tokens: int, completion_tokens: int) -> list[bytes]:
        return [
            self._chunk([c], prompt_tokens, completion_tokens) for c in self.flavor.opening_choices(index)
        ]

    def step(
        self,
        index: int,
        delta: str,
        token_ids: list[int],
        finish: tuple[str | None, Any],
        prompt_tokens: int,
        completion_tokens: int,
    ) -> bytes:
        """One engine step's chunk: its text delta, its token ids and, on the last step, (finish, matched)."""
        choice = self.flavor.chunk_choice(index, delta, token_ids, *finish)
        return self._chunk([choice], prompt_tokens, completion_tokens)

    def closing(
        self, index: int, finish: tuple[str | None, Any], prompt_tokens: int, completion_tokens: int
    ) -> list[bytes]:
        choices = self.flavor.closing_choices(index, *finish)
        return [self._chunk([c], prompt_tokens, completion_tokens) for c in choices]

    def final(self, prompt_tokens: int, completion_tokens: int) -> list[bytes]:
        """The usage-only chunk (all choices summed) when the client asked for it; [DONE] follows."""
        if not self.include_usage:
            return []
        return [sse({**self.header, "choices": [], "usage": usage(prompt_tokens, completion_tokens)})]
