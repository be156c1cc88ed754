"""Qwen3-Next and Qwen3.5 (text): hybrid stacks of gated full attention and Gated DeltaNet layers.

Full-attention layers are Qwen3's with three changes: q_proj also yields a per-channel output gate
(attention output * sigmoid(gate)), RoPE rotates only the first partial_rotary_factor of each head, and
every RMSNorm (layer norms, q/k norms, final norm) scales by (1 + weight) in float32. Linear-attention
layers are Gated DeltaNet (`gated_deltanet`). MLPs are dense SwiGLU, or on Qwen3-Next a routed MoE with a
sigmoid-gated shared expert.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specdeploy.engine import ops
from specdeploy.engine.cache import StaticCache
from specdeploy.engine.forward_batch import ForwardBatch
from specdeploy.engine.models.base import TargetConfig, TargetModel
from specdeploy.engine.models.config import config_value, require_silu
from specdeploy.engine.models.gated_deltanet import (
    GatedDeltaNet,
    Qwen3_5GatedDeltaNet,
    Qwen3NextGatedDeltaNet,
)
from specdeploy.engine.models.layers import (
    DecoderLayer,
    SwiGLU,
    ZeroCenteredRMSNorm,
)
from specdeploy.engine.models.qwen3 import Qwen3Attention, head_dim, qk_norm_attention
from specdeploy.engine.models.qwen3_moe import Qwen3MoeSparseBlock
from specdeploy.engine.models.rope import RotaryEmbedding, rope_parameters
from specdeploy.engine.tree import root_paths
from specdeploy.errors import SpecdeployError

LAYER_TYPES = ("linear_attention", "full_attention")


def layer_types(config: dict[str, Any]) -> list[str]:
    """Each layer's kind; configs without `layer_types` put full attention every full_attention_interval."""
    layers = config["num_hidden_layers"]
    interval = config_value(config, "full_attention_interval", 4)
    kinds = config_value(
        config,
        "layer_types",
        ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)],
    )
    unknown = sorted(set(kinds) - set(LAYER_TYPES))
    if len(kinds) != layers or unknown:
        raise SpecdeployError(
            f"layer_types must list {layers} entries of {' or '.join(LAYER_TYPES)}"
            + (f", found {', '.join(unknown)}" if unknown else f", found {len(kinds)} entries")
        )
    return kinds


def partial_rope(config: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """(RoPE parameters, rotated dims per head): partial_rotary_factor of head_dim, 0.25 unless configured."""
    params = dict(config.get("rope_scaling") or config.get("rope_parameters") or {})
    factor = params.pop("partial_rotary_factor", config_value(config, "partial_rotary_factor", 0.25))
    for key in ("mrope_section", "mrope_interleaved"):
        params.pop(key, None)  # text-only positions are equal on every M-RoPE axis: plain RoPE
    layout = "rope_scaling" if config.get("rope_scaling") else "rope_parameters"
    rotated = int(head_dim(config) * factor)
    return rope_parameters({**config, layout: params}), rotated


class GatedAttention(Qwen3Attention):
    """Qwen3's attention whose q_proj also yields an output gate per head, with zero-centred q/k norms."""

    query_width = 2
    norm = ZeroCenteredRMSNorm

    def after_first_projection(
        self, qkv: torch.Tensor, batch: ForwardBatch, cache: StaticCache
    ) -> torch.Tensor:
        b, tokens, _ = qkv.shape
        query_gate, k, v = qkv.split(
            [2 * self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], -1
        )
        q, gate = query_gate.view(b, tokens, self.heads, 2 * self.head_dim).chunk(2, dim=-1)
        k = k.view(b, tokens, self.kv_heads, self.head_dim)
        v = v.view(b, tokens, self.kv_heads, self.head_dim)
        out = qk_norm_attention(self, q, k, v, batch, cache)
        return ops.linear(out * torch.sigmoid(gate.reshape(b, tokens, -1)), self.o_proj)


class SharedExpertMoeBlock(Qwen3MoeSparseBlock):
    """Qwen3-Next's MoE: Qwen3-MoE routing plus an always-on shared expert scaled by sigmoid(shared gate)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        hidden = config["hidden_size"]
        self.shared_expert = SwiGLU(hidden, config["shared_expert_intermediate_size"])
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = F.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return super().forward(x) + shared


class HybridDecoderLayer(DecoderLayer):
    """Pre-norm residual block whose token mixer is `linear_attn` (Gated DeltaNet) or `self_attn`."""

    norm = ZeroCenteredRMSNorm

    def __init__(self, mixer: nn.Module, mlp: nn.Module, hidden_size: int, eps: float) -> None:
        super().__init__(mixer, mlp, hidden_size, eps)
        if isinstance(mixer, GatedDeltaNet):
            del self.self_attn
            self.linear_attn = mixer

    @property
    def mixer(self) -> nn.Module:
        return self._modules.get("linear_attn") or self._modules["self_attn"]


class Qwen3NextForCausalLM(TargetModel):
    linear_attention: type[GatedDeltaNet] = Qwen3NextGatedDeltaNet
    has_recurrent_layers = True
    leaky = False

    def __init__(self, config: TargetConfig) -> None:
        super().__init__()
        raw = config.raw
        require_silu(raw)
        eps = config_value(raw, "rms_norm_eps", 1e-6)
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            HybridDecoderLayer(
                self.linear_attention(raw, i) if kind == "linear_attention" else GatedAttention(raw, i),
                self.build_mlp(raw, i),
                config.hidden_size,
                eps,
            )
            for i, kind in enumerate(layer_types(raw))
        )
        self.norm = ZeroCenteredRMSNorm(config.hidden_size, eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        params, rotated = partial_rope(raw)
        self.rotary = RotaryEmbedding(params, rotated, config.max_position_embeddings)

    def build_mlp(self, config: dict[str, Any], layer: int) -> nn.Module:
        # transformers' defaults: 512 experts on every layer unless listed in mlp_only_layers
        sparse = (
            layer not in config_value(config, "mlp_only_layers", [])
            and config_value(config, "num_experts", 512) > 0
            and (layer + 1) % config_value(config, "decoder_sparse_step", 1) == 0
        )
        if sparse:
            return SharedExpertMoeBlock(config)
        return SwiGLU(config["hidden_size"], config["intermediate_size"])

    def check_visibility(self, mask: torch.Tensor | None, cached: int) -> None:
        if mask is None:
            return
        if not bool(mask[..., :cached].all()):
            raise SpecdeployError(
                "a recurrent layer cannot hide committed tokens: new tokens must attend to the whole cached prefix"
            )
        among = mask[..., cached:]
        paths = root_paths(among, among.shape[-1])
        size = among.shape[-1]
        rebuilt = torch.zeros(*paths.shape[:2], size + 1, dtype=torch.bool, device=mask.device)
        # padding (and the sums a non-tree makes of two ancestors at one depth) lands in the extra column
        rebuilt.scatter_(2, torch.where((paths >= 0) & (paths < size), paths, size), True)
        if not torch.equal(rebuilt[..., :size], among.expand_as(rebuilt[..., :size])):
            raise SpecdeployError(
                "the mask over the new tokens is not a tree (each token must see exactly itself and its "
                "ancestors, the first token the root of all), which a recurrent layer cannot follow"
            )

    def use_leaky_tree_states(self, leaky: bool) -> None:
        """Run recurrent layers over tree tokens in index order, as a naive engine does (for experiments): a
        token's state and conv window then follow every earlier index, and so does what `commit_tree` keeps."""
        self.leaky = leaky
        for layer in self.layers:
            if isinstance(layer.mixer, GatedDeltaNet):
                layer.mixer.leaky = leaky

    def commit_tree(self, cache: StaticCache, path: torch.Tensor, count: torch.Tensor) -> None:
        if self.leaky:  # the leaf's state under the index order: every index up to the leaf's
            leaf = path.gather(1, (count - 1).clamp(min=0)[:, None])[:, 0]
            path = torch.arange(cache.recurrent.tree_tokens, device=path.device).expand(path.shape[0], -1)
            count = torch.where(count > 0, leaf + 1, 0)
        super().commit_tree(cache, path, count)


class Qwen3_5ForCausalLM(Qwen3NextForCausalLM):
    """Qwen3.5's text model: the same layer set, split GDN projections, dense MLPs only."""

    linear_attention = Qwen3_5GatedDeltaNet

    def build_mlp(self, config: dict[str, Any], layer: int) -> nn.Module:
        return SwiGLU(config["hidden_size"], config["intermediate_size"])
