"""The DFlash block-diffusion drafter (z-lab's design; its config in `drafter_config`, its checkpoints in
`loading`).

A small Qwen3-style stack without embedding or LM head (it borrows the target's). The target features of
committed positions (K target layers, concatenated) pass through `fc` and `hidden_norm` and become extra
keys/values in every layer, at their own positions; queries come from the block [last token, MASK...] only.
Inside the block attention is non-causal, except in sliding-window layers. The drafter's cache holds the
committed context's keys/values; the block's keys/values are used once and never cached.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import torch
from torch import nn

from specdeploy.engine import ops
from specdeploy.engine.cache import EntryShape, StaticCache
from specdeploy.engine.drafter_config import DrafterSpec, draft_value, read_drafter_spec
from specdeploy.engine.forward_batch import ForwardBatch, flat_slots
from specdeploy.engine.models.layers import DecoderLayer, MergedLinear, RMSNorm, SwiGLU
from specdeploy.engine.models.qwen3 import qk_norm_attention
from specdeploy.engine.models.rope import Rope, RotaryEmbedding, rope_parameters
from specdeploy.errors import SpecdeployError


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
        kv = ops.project(projected, self.qkv_proj.weight[query_size:], bias)
        k, v = kv.view(b, tokens, 2 * self.kv_heads, self.head_dim).split(self.kv_heads, dim=2)
        k_cache, v_cache = cache.flat_entry(self.layer_idx)
        ops.qk_norm_rope_store(
            None, k, v, None, self.k_norm.weight, self.k_norm.eps, False, rope, slots, k_cache, v_cache
        )

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: StaticCache) -> torch.Tensor:
        b, tokens, _ = x.shape
        qkv = ops.linear(x, self.qkv_proj).view(b, tokens, self.heads + 2 * self.kv_heads, self.head_dim)
        q, k, v = qkv.split([self.heads, self.kv_heads, self.kv_heads], dim=2)
        return ops.linear(qk_norm_attention(self, q, k, v, batch, cache), self.o_proj)


class TargetConfigLike(Protocol):
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int


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
        self.input_embedding_scale = float(draft_value(config, "input_embedding_scale", 1.0))
        self.output_multiplier = float(draft_value(config, "output_multiplier", 1.0))
        softcap = draft_value(config, "final_logit_softcapping")
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
        self.rotary.prepare(capacity, weight.dtype)  # a cache's positions are below its capacity
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
        projected = self.hidden_norm(ops.linear(context, self.fc))
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

    def compute_logits(
        self, hidden: torch.Tensor, lm_head: nn.Linear, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Draft logits in float32 through the target's LM head, with the drafter's multiplier and softcap;
        `out`: a float32 buffer to write them into."""
        logits = ops.linear(hidden, lm_head)
        if self.output_multiplier == 1.0 and self.final_logit_softcapping is None and out is not None:
            return out.copy_(logits)  # the cast in the copy: one launch, not a cast and a copy
        logits = logits.float() * self.output_multiplier
        if self.final_logit_softcapping is not None:
            logits = torch.tanh(logits / self.final_logit_softcapping) * self.final_logit_softcapping
        return logits if out is None else out.copy_(logits)

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
