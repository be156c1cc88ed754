"""Request bodies of /v1/completions and /v1/chat/completions (SGLang's field names and defaults).

Fields the reference engine cannot honour are declared so that a non-default value is refused with a 400
rather than silently ignored; unknown fields are ignored, as SGLang's models do. Numeric sampling fields are
kept as the JSON values the client sent and checked where /generate's are (`params.parse_sampling_params`),
so that every route refuses the same values (`"0.5"`, `true`, 1e39) with the same message.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt

from specdeploy.server.api_errors import ApiError

# A field as the client sent it (a number, or anything else): checked by params.parse_sampling_params.
JsonValue = Any
# OpenAI fields accepted only at their no-op value; parse_sampling_params refuses any other value.
NO_OP_FIELDS = ("n", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_p")
# OpenAI's names where they differ from SGLang's native ones, for error messages.
OPENAI_NAMES = {"max_new_tokens": "max_tokens", "sampling_seed": "seed"}


class StreamOptions(BaseModel):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False  # usage on every chunk: the cumulative completion tokens


class SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    temperature: JsonValue = None
    top_p: JsonValue = None
    top_k: JsonValue = None
    seed: JsonValue = None
    stop: str | list[str] | None = None
    stop_token_ids: JsonValue = None  # a list of token ids, checked there too
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    no_stop_trim: StrictBool = False
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    return_token_ids: StrictBool = False  # SGLang's: the output token ids with each choice
    n: JsonValue = None
    frequency_penalty: JsonValue = None
    presence_penalty: JsonValue = None
    repetition_penalty: JsonValue = None
    min_p: JsonValue = None
    logprobs: Any = None
    response_format: Any = None

    def refuse_unsupported(self) -> None:
        """Refuse options that would change the output in ways this engine does not implement (the numeric
        ones, such as n and the penalties, are refused with /generate's in `sampling_params`)."""
        if self.logprobs not in (None, False):
            raise ApiError("logprobs are not supported by the reference engine.", param="logprobs")
        if self.response_format is not None and self.response_format != {"type": "text"}:
            raise ApiError("response_format (constrained decoding) is not supported by the reference engine.")

    def sampling_params(self, max_new_tokens: JsonValue) -> dict[str, Any]:
        """The native sampling_params this request means (SGLang's OpenAI -> native mapping), unchecked."""
        return {
            "max_new_tokens": max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "sampling_seed": self.seed,
            "stop": self.stop,
            "stop_token_ids": self.stop_token_ids,
            "ignore_eos": self.ignore_eos,
            "skip_special_tokens": self.skip_special_tokens,
            "no_stop_trim": self.no_stop_trim,
            **{name: getattr(self, name) for name in NO_OP_FIELDS},
        }


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: JsonValue = 16
    echo: StrictBool = False
    suffix: str | None = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_tokens: JsonValue = None
    max_completion_tokens: JsonValue = None
    chat_template_kwargs: dict[str, Any] | None = None
    continue_final_message: StrictBool = False
    tools: list[Any] | None = None

    def max_output_tokens(self) -> JsonValue:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
