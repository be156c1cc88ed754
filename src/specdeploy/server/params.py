"""Request sampling parameters (SGLang's names) -> the engine's SamplingParams, with every check a 400.

The one place where every route's numeric parameters are checked: /generate's `sampling_params` and the
OpenAI routes' fields (mapped to SGLang's names) arrive here as the JSON values the client sent. Each must be a
JSON number of the right kind (never a string or a boolean), finite, and in its range; the engine's
SamplingParams then checks the values as the float32 they become (temperature 1e39 overflows, 1e-45 vanishes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specdeploy.engine.decode import SamplingParams
from specdeploy.errors import SpecdeployError
from specdeploy.server.api_errors import ApiError

# Accepted for compatibility as long as they keep their no-op value; anything else is refused, not ignored.
NO_OP_VALUES: dict[str, Any] = {
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "n": 1,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "logit_bias": None,
    "stream_interval": None,
    "custom_params": None,
    "spaces_between_special_tokens": True,
}
SHOWN_CHARS = 60  # of a client's value quoted back in an error
SUPPORTED = {
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "no_stop_trim",
    "sampling_seed",
}


@dataclass(frozen=True)
class ModelLimits:
    vocab_size: int
    max_context: int


@dataclass(frozen=True)
class RequestParams:
    """What one generation needs beyond the prompt: engine sampling plus the server-side stop strings."""

    sampling: SamplingParams
    stop_strs: tuple[str, ...] = ()
    no_stop_trim: bool = False
    skip_special_tokens: bool = True


def parse_sampling_params(
    raw: Any,
    limits: ModelLimits,
    default_max_new_tokens: int = 128,
    names: Mapping[str, str] | None = None,
) -> RequestParams:
    """Validate a native `sampling_params` object (SGLang defaults: temperature 1.0, max_new_tokens 128).

    `names`: the field names the client used where they differ from SGLang's (OpenAI's `max_tokens`, `seed`),
    so that errors speak its language.
    """
    names = names or {}
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ApiError(
            f"sampling_params must be a JSON object, got {type(raw).__name__}.", param="sampling_params"
        )
    for key, value in raw.items():
        if key in SUPPORTED or value is None:
            continue
        if key in NO_OP_VALUES:
            default = NO_OP_VALUES[key]
            # `true` equals 1 in Python, not in JSON: a boolean is never a number's no-op value
            if isinstance(value, bool) != isinstance(default, bool) or value != default:
                raise ApiError(
                    f"{names.get(key, key)}={_shown(value)} is not supported by the reference engine; "
                    f"leave it out or set it to {default!r}.",
                    param=key,
                )
            continue
        raise ApiError(
            f"unknown sampling parameter {key!r}; see SGLang's sampling_params documentation.", param=key
        )

    max_tokens_field = names.get("max_new_tokens", "max_new_tokens")
    seed_field = names.get("sampling_seed", "sampling_seed")
    max_new_tokens = _int(raw, "max_new_tokens", default_max_new_tokens, max_tokens_field)
    temperature = _float(raw, "temperature", 1.0)
    top_p = _float(raw, "top_p", 1.0)
    top_k = _int(raw, "top_k", -1)
    seed = _int(raw, "sampling_seed", None, seed_field)
    if max_new_tokens < 1:
        raise ApiError(
            f"{max_tokens_field} must be at least 1, got {_shown(max_new_tokens)}.", param=max_tokens_field
        )
    if max_new_tokens >= limits.max_context:
        raise ApiError(
            f"{max_tokens_field}={_shown(max_new_tokens)} does not fit the model's context length of "
            f"{limits.max_context} tokens; ask for fewer.",
            param=max_tokens_field,
        )
    if seed is not None and not -(2**63) <= seed < 2**63:
        raise ApiError(f"{seed_field} must be in [-2**63, 2**63 - 1], got {_shown(seed)}.", param=seed_field)
    if top_k == 0 or top_k < -1:
        raise ApiError(f"top_k must be -1 (disable) or at least 1, got {_shown(top_k)}.", param="top_k")
    stop_token_ids = _token_ids(raw.get("stop_token_ids"), limits, "stop_token_ids")
    try:
        sampling = SamplingParams(
            temperature=temperature,
            top_p=top_p,
            top_k=max(top_k, 0),  # SGLang's -1 means the whole vocabulary: the engine's 0
            max_new_tokens=max_new_tokens,
            seed=seed,
            stop_token_ids=tuple(stop_token_ids),
            ignore_eos=_bool(raw, "ignore_eos", False),
        )
    except SpecdeployError as exc:  # the engine's ranges: temperature and top_p as float32
        raise ApiError(f"{exc}.") from None
    return RequestParams(
        sampling=sampling,
        stop_strs=_stop_strings(raw.get("stop")),
        no_stop_trim=_bool(raw, "no_stop_trim", False),
        skip_special_tokens=_bool(raw, "skip_special_tokens", True),
    )


def check_prompt(
    prompt_ids: list[int], params: RequestParams, limits: ModelLimits, param: str = "input_ids"
) -> None:
    """The prompt must be non-empty token ids in the vocabulary, and prompt + output must fit the context."""
    if not prompt_ids:
        raise ApiError("The prompt is empty; send at least one token.", param=param)
    _token_ids(prompt_ids, limits, param)
    if len(prompt_ids) >= limits.max_context:
        raise ApiError(
            f"The input ({len(prompt_ids)} tokens) is longer than the model's context length "
            f"({limits.max_context} tokens); shorten the prompt.",
            param=param,
        )
    total = len(prompt_ids) + params.sampling.max_new_tokens
    if total > limits.max_context:
        raise ApiError(
            f"Requested token count exceeds the model's maximum context length of {limits.max_context} "
            f"tokens. You requested a total of {total} tokens: {len(prompt_ids)} tokens from the input and "
            f"{params.sampling.max_new_tokens} tokens for the completion. Reduce the prompt or max tokens.",
            param="max_new_tokens",
        )


def _token_ids(value: Any, limits: ModelLimits, name: str) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise ApiError(f"{name} must be a list of integer token ids.", param=name)
    bad = [t for t in value if not 0 <= t < limits.vocab_size]
    if bad:
        raise ApiError(
            f"{name} contains token ids outside the vocabulary [0, {limits.vocab_size}): {_shown(bad[:5])}.",
            param=name,
        )
    return value


def _stop_strings(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise ApiError("stop must be a non-empty string or a list of non-empty strings.", param="stop")
    return tuple(value)


def _shown(value: Any) -> str:
    """A client's value in an error message, cut short: a number may have thousands of digits."""
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text)} characters)"


def _int(raw: dict, key: str, default: int | None, name: str | None = None) -> int | None:
    value = raw.get(key)
    if value is None:
        return default
    name = name or key
    # JSON has one number type: 8.0 is a fine integer, 8.5 and "8" are not
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ApiError(f"{name} must be an integer, got {_shown(value)}.", param=name)
    return value


def _float(raw: dict, key: str, default: float) -> float:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ApiError(f"{key} must be a number, got {_shown(value)}.", param=key)
    try:
        number = float(value)
    except OverflowError:  # an integer beyond float64's range
        number = math.inf
    if not math.isfinite(number):
        raise ApiError(f"{key} must be a finite number, got {_shown(value)}.", param=key)
    return number


def _bool(raw: dict, key: str, default: bool) -> bool:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(f"{key} must be true or false, got {_shown(value)}.", param=key)
    return value
