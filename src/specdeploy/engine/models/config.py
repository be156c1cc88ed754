"""Reading checkpoint config.json values the way transformers fills its defaults."""

from __future__ import annotations

from typing import Any

from specdeploy.errors import SpecdeployError


def config_value(config: dict[str, Any], key: str, default: Any = None) -> Any:
    """`config[key]`, or `default` where the key is absent or null (how transformers fills its defaults)."""
    value = config.get(key)
    return default if value is None else value


def require_silu(config: dict[str, Any]) -> None:
    activation = config_value(config, "hidden_act", "silu")
    if activation != "silu":
        raise SpecdeployError(f"hidden_act {activation!r} is not supported: these models use silu (SwiGLU)")
