"""The server API key: where it comes from, the header that carries it, and how it is kept out of files.

The key only ever travels through the environment variable below (never argv, plans or manifests), and
every text or JSON document specdeploy writes passes through `redact` when a key is set.
"""

from __future__ import annotations

import os
from typing import Any

API_KEY_ENV = "SPECDEPLOY_API_KEY"
REDACTED = "***"


def api_key_from_env() -> str | None:
    """The key clients send and launchers hand to servers; None when the variable is unset or empty."""
    return os.environ.get(API_KEY_ENV) or None


def auth_headers(api_key: str | None = None) -> dict[str, str]:
    """`Authorization: Bearer KEY` (SGLang's and OpenAI's scheme), or no header without a key."""
    key = api_key if api_key is not None else api_key_from_env()
    return {"Authorization": f"Bearer {key}"} if key else {}


def redact(value: Any, api_key: str | None = None) -> Any:
    """`value` (a string or JSON-like data) with every occurrence of the key replaced by ***."""
    key = api_key if api_key is not None else api_key_from_env()
    if not key:
        return value
    if isinstance(value, str):
        return value.replace(key, REDACTED)
    if isinstance(value, dict):
        return {redact(k, key): redact(v, key) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact(item, key) for item in value)
    return value
