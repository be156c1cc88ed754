"""Request bodies for SGLang's three generation routes, built from a prompt and the turns so far.

Routes: `generate` (native /generate: text or input_ids, per-request `meta_info` with the
speculative counters), `chat` (/v1/chat/completions: the server applies its chat template) and
`completions` (/v1/completions: raw text). With the chat template on, `generate` and `completions`
render it on the client with the model's tokenizer, so all three routes send the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from specdeploy.bench.workloads import Prompt
from specdeploy.errors import SpecdeployError

Route = Literal["generate", "chat", "completions"]
ROUTE_PATHS: dict[str, str] = {
    "generate": "/generate",
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
}


class ChatTemplate(Protocol):
    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> str: ...


@dataclass(frozen=True)
class Sampling:
    """What the server is asked to do with each prompt; the defaults are greedy with natural EOS."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    chat_template: bool = True
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise SpecdeployError(f"--max-new-tokens must be at least 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise SpecdeployError(f"--temperature must be >= 0, got {self.temperature}")


def messages_for(prompt: Prompt, answers: list[str]) -> list[dict[str, str]]:
    """The chat messages for the next turn: system, then user turns interleaved with the model's answers."""
    messages = [{"role": "system", "content": prompt.system}] if prompt.system else []
    for turn, answer in zip(prompt.turns, answers, strict=False):
        messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": prompt.turns[len(answers)]})
    return messages


def build_payload(
    route: Route,
    prompt: Prompt,
    answers: list[str],
    sampling: Sampling,
    model: str | None = None,
    template: ChatTemplate | None = None,
) -> dict[str, Any]:
    """The JSON body of the request for the next turn of `prompt` (turn index = len(answers))."""
    max_new = prompt.max_new_tokens or sampling.max_new_tokens
    if route == "chat":
        if prompt.input_ids is not None:
            raise SpecdeployError(
                "token-id prompts (random) cannot go to the chat route: use --route generate"
            )
        if not sampling.chat_template:
            raise SpecdeployError(
                "the chat route always applies the server's chat template: use --route generate or "
                "completions with --no-chat-template"
            )
        body: dict[str, Any] = {"messages": messages_for(prompt, answers), "max_tokens": max_new}
        if sampling.chat_template_kwargs:
            body["chat_template_kwargs"] = sampling.chat_template_kwargs
        return _openai(body, model, sampling, prompt.ignore_eos)
    prompt_input: str | list[int] = (
        list(prompt.input_ids) if prompt.input_ids is not None else _text(prompt, answers, sampling, template)
    )
    if route == "completions":
        return _openai({"prompt": prompt_input, "max_tokens": max_new}, model, sampling, prompt.ignore_eos)
    if route == "generate":
        return {
            ("input_ids" if isinstance(prompt_input, list) else "text"): prompt_input,
            "sampling_params": {
                "max_new_tokens": max_new,
                "temperature": sampling.temperature,
                "ignore_eos": prompt.ignore_eos,
            },
            "stream": True,
        }
    raise SpecdeployError(f"unknown route {route!r}: choose one of {', '.join(ROUTE_PATHS)}")


def _openai(body: dict[str, Any], model: str | None, sampling: Sampling, ignore_eos: bool) -> dict[str, Any]:
    return {
        "model": model or "default",
        **body,
        "temperature": sampling.temperature,
        "stream": True,
        # continuous_usage_stats puts the running completion token count in every chunk (SGLang, vLLM).
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "ignore_eos": ignore_eos,
    }


def _text(prompt: Prompt, answers: list[str], sampling: Sampling, template: ChatTemplate | None) -> str:
    messages = messages_for(prompt, answers)
    if not sampling.chat_template:
        return "\n\n".join(m["content"] for m in messages)
    if template is None:
        raise SpecdeployError(
            "applying the chat template for this route needs the model's tokenizer: pass --tokenizer PATH, "
            "or use --route chat, or --no-chat-template"
        )
    return template.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **sampling.chat_template_kwargs
    )


def load_template(path: str) -> ChatTemplate:
    """The tokenizer of a local model directory (or a cached Hub id), used only for its chat template."""
    from transformers import AutoTokenizer  # deferred: importing transformers costs seconds

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise SpecdeployError(
            f"could not load a tokenizer from {path} ({exc}); pass --tokenizer DIR"
        ) from exc
