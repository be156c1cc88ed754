"""Refuse over-long texts before tokenising them: tokenising megabytes costs more than the refusal."""

from __future__ import annotations

from typing import Any

from specdeploy.server.api_errors import ApiError


def max_prompt_chars(tokenizer: Any, max_context: int) -> int:
    """The most characters a prompt that fits `max_context` tokens can have.

    No token spells more characters than its vocabulary entry has (byte-level entries spell one byte per
    character, and a character takes at least one byte), so longer texts need more tokens than fit.
    """
    return max_context * max(len(token) for token in tokenizer.get_vocab())


def check_text_length(chars: int, limit: int, max_context: int, param: str) -> None:
    if chars > limit:
        raise ApiError(
            f"The input ({chars} characters) cannot fit the model's context length of {max_context} tokens "
            f"(at most {limit} characters for this tokenizer); shorten the prompt.",
            param=param,
        )
