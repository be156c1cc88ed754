"""The DFlash block-diffusion drafter, loaded from and saved to z-lab's checkpoint format.

A small Qwen3-style stack without embedding or LM head (it borrows the target's). The target features of
committed positions (K target layers, concatenated) pass through `fc` and `hidden_norm` and become extra
keys/values in every layer, at their own positions; queries come from the block [last token, MASK...] only.
Inside the block attention is non-causal, except in sliding-window layers. The drafter's cache holds the
committed context's keys/values; the block's keys/values are used once and never cached.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from torch.nn import functional as F
from transformers.activations import ACT2FN

from specdeploy.engine.cache import KVCache
from specdeploy.engine.models.layers import RMSNorm, RotaryEmbedding, rope_parameters, rotate_half
from specdeploy.errors import SpecdeployError

ARCHITECTURE = "DFlashDraftModel"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"


class TargetConfigLike(Protocol):
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default: spread the draft's context layers evenly from layer 1 to layer n-3 of the target."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
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


def _draft_value(config: dict[str, Any], name: str, default: Any = None) -> Any:
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
    target_layer_ids = _draft_value(config, "target_layer_ids")
    if target_layer_ids is None:
        if num_target_layers is None:
            raise SpecdeployError(
                "drafter config.json has neither dflash_config.target_layer_ids nor num_target_layers"
            )
        target_layer_ids = build_target_layer_ids(int(num_target_layers), num_layers)
    mask_token_id = _draft_value(config, "mask_token_id")
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
    if hidden_act not in ACT2FN:
        raise SpecdeployError(f"drafter hidden_act {hidden_act!r} is unknown")
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
        block_size=int(_draft_value(config, "block_size", 16)),
        mask_token_id=int(mask_token_id),
        max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
    )


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, S, heads, head_dim], cos/sin [B, S, head_dim] -> x rotated by its positions' angles."""
    cos, sin = cos[:, :, None], sin[:, :, None]
    return x * cos + rotate_half(x) * sin


class DraftMLP(nn.Module):
    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.up_proj = nn.Linear(spec.hidden_size, spec.intermediate_size, bias=False)
        self.down_proj = nn.Linear(spec.intermediate_size, spec.hidden_size, bias=False)
        self.act = ACT2FN[spec.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DraftAttention(nn.Module):
    """Queries from the block; keys/values from [cached context, new context, block]."""

    def __init__(self, spec: DrafterSpec, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        bias = spec.attention_bias
        self.q_proj = nn.Linear(spec.hidden_size, spec.num_heads * spec.head_dim, bias=bias)
        self.k_proj = nn.Linear(spec.hidden_size, spec.num_kv_heads * spec.head_dim, bias=bias)
        self.v_proj = nn.Linear(spec.hidden_size, spec.num_kv_heads * spec.head_dim, bias=bias)
        self.o_proj = nn.Linear(spec.num_heads * spec.head_dim, spec.hidden_size, bias=bias)
        self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps)
        self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps)

    def _keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        batch, length, _ = x.shape
        key = self.k_norm(self.k_proj(x).view(batch, length, self.num_kv_heads, self.head_dim))
        value = self.v_proj(x).view(batch, length, self.num_kv_heads, self.head_dim)
        return apply_rotary(key, cos, sin), value

    def forward(
        self,
        block: torch.Tensor,
        context: torch.Tensor,
        context_positions: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache | None,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        batch, length, _ = block.shape
        ctx_len = context.shape[1]
        cos, sin = rope
        query = self.q_norm(self.q_proj(block).view(batch, length, self.num_heads, self.head_dim))
        query = apply_rotary(query, cos[:, ctx_len:], sin[:, ctx_len:])
        block_key, block_value = self._keys_values(block, cos[:, ctx_len:], sin[:, ctx_len:])
        ctx_key, ctx_value = self._keys_values(context, cos[:, :ctx_len], sin[:, :ctx_len])
        if cache is not None:
            # Positions travel with the keys, so window rules stay right after the cache is compacted.
            ctx_key, ctx_value, _ = cache.append(self.layer, ctx_key, ctx_value, context_positions)
        key = torch.cat([ctx_key, block_key], dim=1).transpose(1, 2)
        value = torch.cat([ctx_value, block_value], dim=1).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            query.transpose(1, 2),
            key,
            value,
            attn_mask=mask,
            scale=self.head_dim**-0.5,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class DraftLayer(nn.Module):
    def __init__(self, spec: DrafterSpec, layer: int) -> None:
        super().__init__()
        self.self_attn = DraftAttention(spec, layer)
        self.mlp = DraftMLP(spec)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor,
        context_positions: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache | None,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), context, context_positions, rope, cache, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


def layer_visibility(
    query_positions: torch.Tensor, key_positions: torch.Tensor, is_causal: bool, sliding_window: int | None
) -> torch.Tensor:
    """[B, L, S] bool: which keys each block query may see under a layer's causal / sliding-window rule."""
    distance = query_positions[:, :, None] - key_positions[:, None, :]
    visible = torch.ones_like(distance, dtype=torch.bool)
    if is_causal:
        visible &= distance >= 0
    if sliding_window is not None:
        visible &= distance < sliding_window
        if not is_causal:
            visible &= -distance < sliding_window
    return visible


class DFlashDrafter(nn.Module):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        spec = read_drafter_spec(config)
        self.config = config
        self.spec = spec
        self.block_size = spec.block_size
        self.mask_token_id = spec.mask_token_id
        self.target_layer_ids = spec.target_layer_ids
        self.hidden_size = spec.hidden_size
        self.input_embedding_scale = float(_draft_value(config, "input_embedding_scale", 1.0))
        self.output_multiplier = float(_draft_value(config, "output_multiplier", 1.0))
        softcap = _draft_value(config, "final_logit_softcapping")
        self.final_logit_softcapping = float(softcap) if softcap else None
        self.layers = nn.ModuleList(DraftLayer(spec, i) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.fc = nn.Linear(len(spec.target_layer_ids) * spec.hidden_size, spec.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        # z-lab's Kimi drafter was trained with YaRN's legacy attention factor (1.4159 at factor 64) although
        # its config carries mscale = mscale_all_dim = 1.0, which modern code turns into 1.0 and which loses
        # acceptance; drafters therefore default to the legacy factor (an explicit attention_factor wins).
        self.rotary = RotaryEmbedding(
            rope_parameters({"max_position_embeddings": spec.max_position_embeddings, **config}),
            spec.head_dim,
            spec.max_position_embeddings,
            legacy_yarn=True,
        )
        # Layers share a visibility rule when they share (causal, window); one mask per distinct rule.
        self.layer_rules = [
            (
                spec.is_causal if spec.is_causal is not None else kind == "sliding_attention",
                spec.sliding_window if kind == "sliding_attention" else None,
            )
            for kind in spec.layer_types
        ]

    def new_cache(self) -> KVCache:
        return KVCache(len(self.layers))

    def forward(
        self,
        noise_embedding: torch.Tensor,
        context: torch.Tensor,
        position_ids: torch.Tensor,
        cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Draft hidden states [B, L, H] (after the final norm) for the block `noise_embedding` [B, L, H].

        `context` [B, C, K*H]: raw target features of C newly committed positions (C may be 0); their
        keys/values are appended to `cache`. `position_ids` [B, C+L]: the context's positions, then the
        block's. `attention_mask` [B or 1, L, cached + C + L] bool replaces the default visibility (the block
        sees every context key and itself, non-causally); layer causality and sliding windows still apply.
        """
        batch, ctx_len = noise_embedding.shape[0], context.shape[1]
        self._check_inputs(noise_embedding, context, position_ids, cache, attention_mask)
        position_ids = position_ids.expand(batch, -1)
        context_positions = position_ids[:, :ctx_len]
        cached_positions = self._cached_positions(cache, batch, position_ids)
        key_positions = torch.cat([cached_positions, position_ids], dim=1)
        masks = {
            rule: self._attention_mask(rule, position_ids[:, ctx_len:], key_positions, attention_mask)
            for rule in set(self.layer_rules)
        }
        rope = self.rotary(position_ids, noise_embedding.dtype)
        projected = self.hidden_norm(self.fc(context))
        hidden = noise_embedding
        for layer, rule in zip(self.layers, self.layer_rules, strict=True):
            hidden = layer(hidden, projected, context_positions, rope, cache, masks[rule])
        return self.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """Draft logits in float32 through the target's LM head, with the drafter's multiplier and softcap."""
        logits = lm_head(hidden).float() * self.output_multiplier
        if self.final_logit_softcapping is not None:
            logits = torch.tanh(logits / self.final_logit_softcapping) * self.final_logit_softcapping
        return logits

    def check_compatible(self, target_config: TargetConfigLike) -> None:
        """Raise SpecdeployError naming every way this drafter does not fit `target_config`."""
        problems = []
        if target_config.hidden_size != self.hidden_size:
            problems.append(
                f"hidden size {self.hidden_size} differs from the target's {target_config.hidden_size}"
            )
        num_layers = target_config.num_hidden_layers
        trained_for = self.spec.num_target_layers
        if trained_for is not None and trained_for != num_layers:
            problems.append(f"it was made for a target with {trained_for} layers, this one has {num_layers}")
        out_of_range = [i for i in self.target_layer_ids if not 0 <= i < num_layers]
        if out_of_range:
            problems.append(
                f"target_layer_ids {out_of_range} do not exist in a target with {num_layers} layers"
            )
        if not 0 <= self.mask_token_id < target_config.vocab_size:
            problems.append(
                f"mask_token_id {self.mask_token_id} is outside the target's vocabulary of {target_config.vocab_size}"
            )
        if problems:
            raise SpecdeployError(
                "drafter does not fit the target: "
                + "; ".join(problems)
                + ". Use the drafter made for this target."
            )

    def _check_inputs(
        self,
        noise_embedding: torch.Tensor,
        context: torch.Tensor,
        position_ids: torch.Tensor,
        cache: KVCache | None,
        attention_mask: torch.Tensor | None,
    ) -> None:
        _, length, hidden = noise_embedding.shape
        features = len(self.target_layer_ids) * self.hidden_size
        if hidden != self.hidden_size or context.shape[-1] != features:
            raise SpecdeployError(
                f"drafter expects block embeddings of width {self.hidden_size} and context features of width "
                f"{features}, got {hidden} and {context.shape[-1]}"
            )
        expected = context.shape[1] + length
        if position_ids.shape[-1] != expected:
            raise SpecdeployError(
                f"position_ids cover {position_ids.shape[-1]} positions, expected C+L={expected}"
            )
        if attention_mask is not None:
            keys = (cache.length if cache is not None else 0) + expected
            if attention_mask.dim() != 3 or attention_mask.shape[1:] != (length, keys):
                raise SpecdeployError(
                    f"attention_mask must be [B or 1, {length}, {keys}] bool, got {list(attention_mask.shape)}"
                )

    @staticmethod
    def _cached_positions(cache: KVCache | None, batch: int, position_ids: torch.Tensor) -> torch.Tensor:
        entry = cache.layers[0] if cache is not None else None
        if entry is None:
            return position_ids.new_zeros(batch, 0)
        return entry[2]

    @staticmethod
    def _attention_mask(
        rule: tuple[bool, int | None],
        query_positions: torch.Tensor,
        key_positions: torch.Tensor,
        attention_mask: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """[B, 1, L, S] bool for SDPA, or None when every key is visible (the fast path)."""
        is_causal, window = rule
        if attention_mask is None and not is_causal and window is None:
            return None
        visible = layer_visibility(query_positions, key_positions, is_causal, window)
        if attention_mask is not None:
            visible = visible & attention_mask.to(torch.bool)
        return visible[:, None]


def _read_config(path: Path) -> dict[str, Any]:
    config_path = path / "config.json"
    if not path.is_dir():
        raise SpecdeployError(f"drafter path {path} is not a directory: download the checkpoint there first")
    if not config_path.is_file():
        raise SpecdeployError(f"drafter directory {path} has no config.json: is it a checkpoint directory?")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise SpecdeployError(f"{config_path} is not valid JSON ({exc}): re-download the checkpoint") from exc
    architectures = config.get("architectures") or []
    if ARCHITECTURE not in architectures:
        raise SpecdeployError(
            f"{config_path} declares architectures {architectures}, not [{ARCHITECTURE!r}]: "
            "pass a DFlash drafter checkpoint (DFlash2 drafters are not supported)"
        )
    return config


def _weight_files(path: Path) -> list[Path]:
    index = path / WEIGHTS_INDEX_FILE
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [path / shard for shard in shards]
    else:
        files = [path / WEIGHTS_FILE]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise SpecdeployError(
            f"drafter directory {path} lacks weight file(s) {missing}: the download is incomplete"
        )
    return files


def _read_weights(files: Iterable[Path], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    weights = {}
    for file in files:
        with safe_open(str(file), framework="pt") as shard:
            for name in shard.keys():
                weights[name] = shard.get_tensor(name).to(dtype)
    return weights


def _check_weights(drafter: DFlashDrafter, weights: dict[str, torch.Tensor], path: Path) -> None:
    expected = drafter.state_dict()
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise SpecdeployError(
            f"drafter weights in {path} do not match its config.json: missing {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}"
        )
    for name, tensor in expected.items():
        if weights[name].shape != tensor.shape:
            raise SpecdeployError(
                f"drafter weight {name} in {path} has shape {list(weights[name].shape)}, "
                f"config.json implies {list(tensor.shape)}"
            )


def load_drafter(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> DFlashDrafter:
    """Load a z-lab DFlash checkpoint directory (config.json + safetensors), ready for inference."""
    path = Path(path)
    config = _read_config(path)
    weights = _read_weights(_weight_files(path), dtype)
    # Build on the meta device so that a multi-GB drafter is not first initialised at random.
    with torch.device("meta"):
        drafter = DFlashDrafter(config)
    _check_weights(drafter, weights, path)
    drafter.load_state_dict(weights, assign=True)
    return drafter.to(device).eval()


def save_drafter(drafter: DFlashDrafter, path: str | Path) -> None:
    """Write config.json + model.safetensors in z-lab's format (dflash's from_pretrained loads it too)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    dtype = next(drafter.parameters()).dtype
    config = {**drafter.config, "architectures": [ARCHITECTURE], "dtype": str(dtype).removeprefix("torch.")}
    config.setdefault("model_type", "qwen3")
    if "torch_dtype" in config:
        config["torch_dtype"] = config["dtype"]
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {name: t.detach().contiguous().cpu() for name, t in drafter.state_dict().items()}
    save_file(tensors, str(path / WEIGHTS_FILE), metadata={"format": "pt"})
