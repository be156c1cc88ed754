"""The DFlash drafter's configuration: z-lab's config.json read into what the layers need, and written anew.

Checkpoint format (config.json): `architectures: ["DFlashDraftModel"]`, Qwen3 layer sizes, `block_size`,
`num_target_layers` and `dflash_config: {target_layer_ids, mask_token_id}` (dflash looks in `dflash_config`
first, then at the top level); optional sliding-window layer types, input/output scaling and softcapping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdeploy.errors import SpecdeployError

ARCHITECTURE = "DFlashDraftModel"


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default: spread the draft's context layers evenly from layer 1 to layer n-3 of the target."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    # under 4 target layers (a shape cut to fit one GPU) the spread leaves them: layer 1, as at 4
    if end < start:
        return [min(start, num_target_layers - 1)] * num_draft_layers
    return [round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def new_drafter_config(
    *,
    hidden_size: int,
    num_target_layers: int,
    vocab_size: int,
    mask_token_id: int,
    block_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    intermediate_size: int,
    max_position_embeddings: int,
    rope_theta: float,
    rope_scaling: dict[str, Any] | None = None,
    rms_norm_eps: float = 1e-6,
) -> dict[str, Any]:
    """config.json of a new drafter for a target, laid out as z-lab's published checkpoints are."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        "hidden_size": hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "intermediate_size": intermediate_size,
        "hidden_act": "silu",
        "rms_norm_eps": rms_norm_eps,
        "attention_bias": False,
        "max_position_embeddings": max_position_embeddings,
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "vocab_size": vocab_size,
        "tie_word_embeddings": False,
        "num_target_layers": num_target_layers,
        "block_size": block_size,
        "dflash_config": {
            "target_layer_ids": build_target_layer_ids(num_target_layers, num_layers),
            "mask_token_id": mask_token_id,
        },
    }


@dataclass(frozen=True)
class DrafterSpec:
    """What the layers need to know, read from a z-lab config.json."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    hidden_act: str
    rms_norm_eps: float
    attention_bias: bool
    layer_types: list[str]
    sliding_window: int | None
    is_causal: bool | None  # None: causal exactly in the sliding layers
    num_target_layers: int | None
    target_layer_ids: list[int]
    block_size: int
    mask_token_id: int
    max_position_embeddings: int


def draft_value(config: dict[str, Any], name: str, default: Any = None) -> Any:
    """dflash looks in `dflash_config` first, then at the top level."""
    return (config.get("dflash_config") or {}).get(name, config.get(name, default))


def _required(config: dict[str, Any], name: str) -> Any:
    if config.get(name) is None:
        raise SpecdeployError(f"drafter config.json has no {name!r}: is this a DFlash drafter checkpoint?")
    return config[name]


def read_drafter_spec(config: dict[str, Any]) -> DrafterSpec:
    hidden_size = int(_required(config, "hidden_size"))
    num_layers = int(_required(config, "num_hidden_layers"))
    num_heads = int(_required(config, "num_attention_heads"))
    num_target_layers = config.get("num_target_layers")
    target_layer_ids = draft_value(config, "target_layer_ids")
    if target_layer_ids is None:
        if num_target_layers is None:
            raise SpecdeployError(
                "drafter config.json has neither dflash_config.target_layer_ids nor num_target_layers"
            )
        target_layer_ids = build_target_layer_ids(int(num_target_layers), num_layers)
    mask_token_id = draft_value(config, "mask_token_id")
    if mask_token_id is None:
        raise SpecdeployError("drafter config.json has no dflash_config.mask_token_id")
    # Qwen3Config semantics (what dflash loads through): the window exists only with use_sliding_window.
    sliding_window = config.get("sliding_window") if config.get("use_sliding_window") else None
    layer_types = config.get("layer_types") or [
        "sliding_attention"
        if sliding_window is not None and i >= config.get("max_window_layers", 28)
        else "full_attention"
        for i in range(num_layers)
    ]
    if len(layer_types) != num_layers:
        raise SpecdeployError(
            f"drafter config.json has {len(layer_types)} layer_types for {num_layers} layers"
        )
    unknown_types = set(layer_types) - {"full_attention", "sliding_attention"}
    if unknown_types:
        raise SpecdeployError(f"drafter layer_types {sorted(unknown_types)} are not supported")
    hidden_act = config.get("hidden_act", "silu")
    if hidden_act != "silu":
        raise SpecdeployError(f"drafter hidden_act {hidden_act!r} is not supported: DFlash drafters use silu")
    is_causal = config.get("is_causal")
    return DrafterSpec(
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
        head_dim=int(config.get("head_dim") or hidden_size // num_heads),
        intermediate_size=int(_required(config, "intermediate_size")),
        hidden_act=hidden_act,
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        attention_bias=bool(config.get("attention_bias", False)),
        layer_types=list(layer_types),
        sliding_window=int(sliding_window) if sliding_window is not None else None,
        is_causal=None if is_causal is None else bool(is_causal),
        num_target_layers=int(num_target_layers) if num_target_layers is not None else None,
        target_layer_ids=[int(i) for i in target_layer_ids],
        block_size=int(draft_value(config, "block_size", 16)),
        mask_token_id=int(mask_token_id),
        max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
    )
