"""Pieces shared by the model families: norms, merged projections, attention over a cache window, SwiGLU.

The residual stream is carried beside each layer's output (vLLM style), so that every norm also does the
preceding residual add in one fused operation (`ops.rms_norm`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specdeploy.engine import ops
from specdeploy.engine.cache import StaticCache
from specdeploy.engine.forward_batch import ForwardBatch


class RMSNorm(nn.Module):
    """RMSNorm; called with a residual it first adds it and returns (normed, sum)."""

    zero_centered = False  # weight stored as an offset from 1 (Qwen3-Next), scaled in float32

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim) if self.zero_centered else torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return ops.rms_norm(x, self.weight, self.eps, residual, self.zero_centered)


class ZeroCenteredRMSNorm(RMSNorm):
    zero_centered = True


class MergedLinear(nn.Linear):
    """One matmul for several projections of the same input (q|k|v, gate|up), stored under the parts' names.

    `state_dict()` shows the parts (`q_proj.weight`, ... as siblings of this module) as views of the merged
    weight, and `load_checkpoint_state` accepts them, so checkpoints keep their layout.
    """

    def __init__(self, in_features: int, parts: dict[str, int], bias: bool = False) -> None:
        super().__init__(in_features, sum(parts.values()), bias=bias)
        self.parts = dict(parts)
        self.register_state_dict_post_hook(MergedLinear._split)

    def _part_keys(self, prefix: str, kind: str) -> list[str]:
        parent = prefix[:-1].rpartition(".")[0]
        return [f"{parent}.{name}.{kind}" if parent else f"{name}.{kind}" for name in self.parts]

    def _split(self, state_dict: dict, prefix: str, local_metadata: dict) -> None:
        for kind in ("weight", "bias"):
            merged = state_dict.pop(prefix + kind, None)
            if merged is not None:
                pieces = merged.split(list(self.parts.values()), dim=0)
                state_dict.update(zip(self._part_keys(prefix, kind), pieces, strict=True))

    def merge_parts(self, state_dict: dict, prefix: str) -> None:
        """Replace the parts' tensors in a checkpoint-named `state_dict` by this module's merged ones."""
        for kind in ("weight", "bias"):
            keys = self._part_keys(prefix, kind)
            if all(key in state_dict for key in keys):
                state_dict[prefix + kind] = torch.cat([state_dict.pop(key) for key in keys], dim=0)


def load_checkpoint_state(model: nn.Module, state: dict[str, torch.Tensor], strict: bool = True) -> None:
    """Load tensors named as in checkpoints (merged projections and stacked experts by their parts) into
    `model`, taking the tensors themselves (no copy)."""
    state = dict(state)
    for name, module in model.named_modules():
        merge = getattr(module, "merge_parts", None)
        if merge is not None:
            merge(state, f"{name}." if name else "")
    model.load_state_dict(state, strict=strict, assign=True)


def attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    batch: ForwardBatch,
    scale: float,
    value_up: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of q [B, T, H, D] over keys [B, S, Hkv, D] and values [B, S, Hkv, Dv] -> [B, T, H * Dv]
    (MLA's value_up: see `attend_folded`)."""
    b, tokens, heads, dim = q.shape
    kv_heads = keys.shape[2]
    folded = q.view(b, tokens, kv_heads, heads // kv_heads, dim).permute(0, 2, 3, 1, 4)
    return attend_folded(folded, keys, values, batch, scale, value_up)


def attend_folded(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    batch: ForwardBatch,
    scale: float,
    value_up: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of queries folded by key head, q [B, Hkv, G, T, D], over keys [B, S, Hkv, D] and values
    [B, S, Hkv, Dv] -> [B, T, Hkv * G * Dv] (query head h = key head * G + g, as GQA pairs them).

    Folding each key head's G query heads into the query axis ([B, Hkv, G*T, D]) instead of repeating keys
    and values serves MHA, GQA and MLA's single latent head with one call on every SDPA backend. MLA
    (Hkv = 1) may pass its value up-projection value_up [G, V, Dv]: each head's output is then mapped out
    through it -> [B, T, G * V], on CUDA by the attention's last kernel.
    """
    kernels = ops.triton_kernels_for(q)
    if kernels is not None and kernels.masked_attention_fits(q.shape[-1], values.shape[-1]):
        # one launch that reads the boolean mask itself (flash-decoding splits), one that combines them
        return kernels.masked_attention(q, keys, values, batch.visible, scale, value_up=value_up)
    b, kv_heads, group, tokens, dim = q.shape
    value_dim = values.shape[-1]
    out = F.scaled_dot_product_attention(
        q.reshape(b, kv_heads, group * tokens, dim),
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=batch.attention_bias(group, q.dtype),
        scale=scale,
    )
    out = out.view(b, kv_heads, group, tokens, value_dim).permute(0, 3, 1, 2, 4)
    if value_up is not None:
        out = torch.einsum("bthr,hvr->bthv", out.reshape(b, tokens, group, value_dim), value_up)
    return out.reshape(b, tokens, -1)


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = MergedLinear(
            hidden_size, {"gate_proj": intermediate_size, "up_proj": intermediate_size}
        )
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    @property
    def first_projection(self) -> nn.Linear:
        return self.gate_up_proj

    def after_first_projection(self, gate_up: torch.Tensor) -> torch.Tensor:
        return ops.silu_mul_linear(gate_up, self.down_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after_first_projection(ops.linear(x, self.gate_up_proj))


class DecoderLayer(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x)), then + mlp(norm(x)). Names follow the HF checkpoints.

    Takes and returns (output delta, residual): the layer's output in transformers' sense is their sum,
    which the next norm computes anyway.
    """

    norm = RMSNorm

    def __init__(self, mixer: nn.Module, mlp: nn.Module, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.self_attn = mixer
        self.mlp = mlp
        self.input_layernorm = self.norm(hidden_size, eps)
        self.post_attention_layernorm = self.norm(hidden_size, eps)

    @property
    def mixer(self) -> nn.Module:
        return self.self_attn

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, batch: ForwardBatch, cache: StaticCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            x, residual = self.mixer(self.input_layernorm(x), batch, cache), x
        else:
            x, residual = normed_into(self.input_layernorm, x, residual, self.mixer, batch, cache)
        return normed_into(self.post_attention_layernorm, x, residual, self.mlp)


def normed_into(
    norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor, module: nn.Module, *args
) -> tuple[torch.Tensor, torch.Tensor]:
    """(module(norm(x + residual), *args), x + residual). A module whose first step is one projection
    (`first_projection`, then `after_first_projection`) takes the norm inside that projection's kernel where
    `ops.norm_linear` runs one (one row on a GPU, a weight `triton_gemv.fuses_row` takes): one launch fewer; one
    with a `normed_forward` (DeepSeek's MoE: the norm in its router's kernel) makes it itself where it can."""
    normed_forward = getattr(module, "normed_forward", None)
    if normed_forward is not None:
        done = normed_forward(norm, x, residual, *args)
        if done is not None:
            return done
    projection = getattr(module, "first_projection", None)
    fused = None if projection is None else ops.norm_linear(x, residual, norm, projection)
    if fused is None:
        x, residual = norm(x, residual)
        return module(x, *args), residual
    projected, residual = fused
    return module.after_first_projection(projected, *args), residual
