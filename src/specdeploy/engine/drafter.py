"""The DFlash block-diffusion drafter, loaded from and saved to z-lab's checkpoint format.

A small Qwen3-style stack without embedding or LM head (it borrows the target's). The target features of
committed positions (K target layers, concatenated) pass through `fc` and `hidden_norm` and become extra
keys/values in every layer, at their own positions; queries come from the block [last token, MASK...] only.
Inside the block attention is non-causal, except in sliding-window layers. The drafter's cache holds the
committed context's keys/values; the block's keys/values are used once and never cached.
"""

from __future__ import annotations

import dataclasses
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

from specdeploy.engine import ops
from specdeploy.engine.cache import EntryShape, StaticCache
from specdeploy.engine.forward_batch import ForwardBatch, flat_slots
from specdeploy.engine.models.layers import DecoderLayer, MergedLinear, RMSNorm, SwiGLU, load_checkpoint_state
from specdeploy.engine.models.qwen3 import qk_norm_attention
from specdeploy.engine.models.rope import Rope, RotaryEmbedding, rope_parameters
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
        block_size=int(_draft_value(config, "block_size", 16)),
        mask_token_id=int(mask_token_id),
        max_position_embeddings=int(config.get("max_position_embeddings", 32768)),
    )


class DraftAttention(nn.Module):
    """Queries from the block; keys/values from the cached context (written by `write_context`) and the block."""

    def __init__(self, spec: DrafterSpec, layer: int) -> None:
        super().__init__()
        self.layer_idx = layer
        self.heads, self.kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        dim = spec.head_dim
        self.qkv_proj = MergedLinear(
            spec.hidden_size,
            {
                "q_proj": spec.num_heads * dim,
                "k_proj": spec.num_kv_heads * dim,
                "v_proj": spec.num_kv_heads * dim,
            },
            spec.attention_bias,
        )
        self.o_proj = nn.Linear(spec.num_heads * dim, spec.hidden_size, bias=spec.attention_bias)
        self.q_norm = RMSNorm(dim, spec.rms_norm_eps)
        self.k_norm = RMSNorm(dim, spec.rms_norm_eps)

    def cache_entry(self) -> EntryShape:
        return ((self.kv_heads, self.head_dim), (self.kv_heads, self.head_dim))

    def write_context(
        self, projected: torch.Tensor, rope: Rope, slots: torch.Tensor, cache: StaticCache
    ) -> None:
        """Store the keys/values of projected context features [B, C, H] at flat `slots`."""
        b, tokens, _ = projected.shape
        query_size = self.heads * self.head_dim
        bias = self.qkv_proj.bias[query_size:] if self.qkv_proj.bias is not None else None
        kv = F.linear(projected, self.qkv_proj.weight[query_size:], bias)
        k, v = kv.view(b, tokens, 2 * self.kv_heads, self.head_dim).split(self.kv_heads, dim=2)
        k_cache, v_cache = (t.view(-1, *t.shape[2:]) for t in cache.entry(self.layer_idx))
        ops.qk_norm_rope_store(
            None, k, v, None, self.k_norm.weight, self.k_norm.eps, False, rope, slots, k_cache, v_cache
        )

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: StaticCache) -> torch.Tensor:
        b, tokens, _ = x.shape
        qkv = self.qkv_proj(x).view(b, tokens, self.heads + 2 * self.kv_heads, self.head_dim)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=2)
        return self.o_proj(qk_norm_attention(self, q, k, v, batch, cache))


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
        self.layers = nn.ModuleList(
            DecoderLayer(DraftAttention(spec, i), SwiGLU(spec.hidden_size, spec.intermediate_size),
                         spec.hidden_size, spec.rms_norm_eps)
            for i in range(spec.num_layers)
        )  # fmt: skip
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

    def new_cache(self, batch: int = 1, capacity: int = 256) -> StaticCache:
        entries = [layer.mixer.cache_entry() for layer in self.layers]
        weight = self.fc.weight
        return StaticCache(entries, batch, capacity, weight.device, weight.dtype, with_positions=True)

    def write_context(
        self,
        context: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        cache: StaticCache,
        row_start: int = 0,
    ) -> None:
        """Project target features `context` [B, C, K*H] of `positions` [B, C] and store every layer's keys and
        values for them at `slots` [B, C] of cache rows row_start.."""
        projected = self.hidden_norm(self.fc(context))
        rope = self.rotary(positions, projected.dtype)
        flat = flat_slots(slots, cache.capacity, row_start)
        cache.positions.view(-1).index_copy_(0, flat, positions.reshape(-1))
        for layer in self.layers:
            layer.mixer.write_context(projected, rope, flat, cache)

    def draft(self, noise_embedding: torch.Tensor, batch: ForwardBatch, cache: StaticCache) -> torch.Tensor:
        """Hidden states [B, L, H] (after the final norm) of the block `noise_embedding` [B, L, H], whose keys and
        values `batch` writes; `batch.visible` says which slots it may see before each layer's own rule."""
        cache.positions.view(-1).index_copy_(
            0, batch.flat_slots, batch.positions.expand_as(batch.slots).reshape(-1)
        )
        batch.rope = self.rotary(batch.positions, noise_embedding.dtype)
        key_positions = batch.view(cache.positions)
        batches = {rule: self._rule_batch(rule, batch, key_positions) for rule in set(self.layer_rules)}
        x, residual = noise_embedding, None
        for layer, rule in zip(self.layers, self.layer_rules, strict=True):
            x, residual = layer(x, residual, batches[rule], cache)
        return self.norm(x, residual)[0]

    @staticmethod
    def _rule_batch(
        rule: tuple[bool, int | None], batch: ForwardBatch, key_positions: torch.Tensor
    ) -> ForwardBatch:
        is_causal, window = rule
        if not is_causal and window is None:
            return batch
        visible = batch.visible & layer_visibility(batch.positions, key_positions, is_causal, window)
        return dataclasses.replace(batch, visible=visible, _bias={})

    def forward(
        self,
        noise_embedding: torch.Tensor,
        context: torch.Tensor,
        position_ids: torch.Tensor,
        cache: StaticCache | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Draft hidden states [B, L, H] (after the final norm) for the block `noise_embedding` [B, L, H].

        `context` [B, C, K*H]: raw target features of C newly committed positions (C may be 0); their
        keys/values are appended to `cache` (a temporary one when None). `position_ids` [B|1, C+L]: the
        context's positions, then the block's. `attention_mask` [B or 1, L, cached + C + L] bool replaces the
        default visibility (the block sees every context key and itself, non-causally); layer causality and
        sliding windows still apply.
        """
        batch_size, length = noise_embedding.shape[:2]
        ctx_len = context.shape[1]
        if cache is None:
            cache = self.new_cache(batch_size, ctx_len + length + 1)
        self._check_inputs(noise_embedding, context, position_ids, cache, attention_mask)
        if cache.batch != batch_size:
            raise SpecdeployError(f"the cache holds {cache.batch} rows, the input {batch_size}")
        cached = cache.length
        cache.ensure(cached + ctx_len + length)
        device = noise_embedding.device
        positions = position_ids.expand(batch_size, -1)
        slots = (cached + torch.arange(ctx_len + length, device=device)).expand(batch_size, -1)
        self.write_context(context, positions[:, :ctx_len], slots[:, :ctx_len], cache)
        used = cached + ctx_len + length
        window = min(cache.capacity, -(-used // 64) * 64)
        visible = torch.zeros(1 if attention_mask is None else attention_mask.shape[0], length, window,
                              dtype=torch.bool, device=device)  # fmt: skip
        visible[..., :used] = True if attention_mask is None else attention_mask.to(torch.bool)
        batch = ForwardBatch(positions[:, ctx_len:], slots[:, ctx_len:], visible, cache.capacity)
        hidden = self.draft(noise_embedding, batch, cache)
        cache.length = cached + ctx_len
        return hidden

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
        cache: StaticCache,
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
            keys = cache.length + expected
            if attention_mask.dim() != 3 or attention_mask.shape[1:] != (length, keys):
                raise SpecdeployError(
                    f"attention_mask must be [B or 1, {length}, {keys}] bool, got {list(attention_mask.shape)}"
                )


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
    load_checkpoint_state(drafter, weights)
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
