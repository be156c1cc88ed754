"""Gated DeltaNet token mixers (Qwen3-Next, Qwen3.5), exact under tree verification.

Per token: project to q, k, v (plus the output gate z, the write strength b and the decay input a), run
q|k|v through a short depthwise causal convolution, then through the gated delta rule; normalise the
result per head, gate it with silu(z) and project back. Under tree verification each new token's
convolution window and recurrent state come from its own ancestors only (`recurrent_state`).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specdeploy.engine import ops
from specdeploy.engine.cache import StaticCache
from specdeploy.engine.forward_batch import ForwardBatch
from specdeploy.engine.models.config import config_value
from specdeploy.engine.models.gated_delta_rule import (
    CHUNK_SIZE,
    chain_rule,
    chunked_rule,
    rule_inputs,
    tree_rule,
)
from specdeploy.engine.models.layers import MergedLinear
from specdeploy.engine.recurrent_state import RecurrentCache, causal_windows, chain_paths, conv_windows
from specdeploy.errors import SpecdeployError


class GatedRMSNorm(nn.Module):
    """RMSNorm over each head's output, then times silu(gate) in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)
        return (x * F.silu(gate.float())).to(dtype)


def path_conv(inputs: torch.Tensor, windows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """silu of the depthwise conv of each token's window: inputs [B, S, C], windows [B|1, T, width] (indices
    into S, oldest first), weight [C, 1, width]."""
    batch, tokens, width = inputs.shape[0], windows.shape[1], windows.shape[2]
    index = windows.expand(batch, -1, -1).reshape(batch, tokens * width, 1).expand(-1, -1, inputs.shape[-1])
    taps = inputs.gather(1, index).view(batch, tokens, width, -1)
    kernel = weight[:, 0].t().float()  # [width, channels]; tap 0 is the oldest input, as windows order them
    return F.silu((taps.float() * kernel).sum(dim=2)).to(inputs.dtype)


def keep_last_inputs(
    conv_state: torch.Tensor, inputs: torch.Tensor, valid: torch.Tensor | None = None
) -> None:
    """conv_state [B, W-1, C] in place: the last W-1 of [conv_state | inputs [B, T, C]] (a chain committed);
    with `valid` [B, T] (real tokens first, then padding), of [conv_state | the real inputs]."""
    history, tokens = conv_state.shape[1], inputs.shape[1]
    if valid is not None:  # real input j is column history + j of the join: the last W-1 start at column n
        joined = torch.cat([conv_state, inputs], dim=1)
        columns = valid.sum(dim=1, keepdim=True) + torch.arange(history, device=inputs.device)
        conv_state.copy_(joined.gather(1, columns[..., None].expand(-1, -1, joined.shape[-1])))
    elif tokens >= history:
        conv_state.copy_(inputs[:, tokens - history :])
    else:  # the old state's last W-1-T, then every new input: a join of W-1 rows (copy_ must not overlap)
        conv_state.copy_(torch.cat([conv_state[:, tokens:], inputs], dim=1))


class GatedDeltaNet(nn.Module):
    """The shared body; subclasses say how the input projections are laid out in their checkpoints.

    `leaky` reproduces a naive engine for experiments: the recurrent state and the convolution run over the
    new tokens in index order, whatever the mask, so tree siblings leak into each other.
    """

    def __init__(self, config: dict[str, Any], layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.hidden = config["hidden_size"]
        self.k_heads, self.v_heads = config["linear_num_key_heads"], config["linear_num_value_heads"]
        self.k_dim, self.v_dim = config["linear_key_head_dim"], config["linear_value_head_dim"]
        if self.v_heads % self.k_heads:
            raise SpecdeployError(
                f"linear_num_value_heads {self.v_heads} must be a multiple of linear_num_key_heads {self.k_heads}"
            )
        self.conv_width = config_value(config, "linear_conv_kernel_dim", 4)
        self.key_size, self.value_size = self.k_heads * self.k_dim, self.v_heads * self.v_dim
        conv_channels = 2 * self.key_size + self.value_size
        # Only the weight is used (checkpoint name conv1d.weight, [channels, 1, width]).
        self.conv1d = nn.Conv1d(
            conv_channels, conv_channels, self.conv_width, groups=conv_channels, bias=False
        )
        self.dt_bias = nn.Parameter(torch.ones(self.v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.v_heads))
        self.norm = GatedRMSNorm(self.v_dim, config_value(config, "rms_norm_eps", 1e-6))
        self.out_proj = nn.Linear(self.value_size, self.hidden, bias=False)
        self.leaky = False

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q|k|v [B, T, channels], z [B, T, v_heads, v_dim], b [B, T, v_heads], a [B, T, v_heads])."""
        raise NotImplementedError

    def cache_entry(self) -> None:
        return None  # the state lives in the cache's `recurrent`, not in slots

    def new_recurrent_cache(
        self, layers: list[int], rows: int, tree_tokens: int, dtype: torch.dtype, device: torch.device
    ) -> RecurrentCache:
        """The recurrent cache of `layers` (every Gated DeltaNet layer of the model, all shaped as this one)."""
        heads, dims = (self.k_heads, self.v_heads), (self.k_dim, self.v_dim)
        return RecurrentCache(layers, rows, self.conv_width, heads, dims, tree_tokens, dtype, device)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: StaticCache) -> torch.Tensor:
        batch_size, tokens, _ = x.shape
        recurrent = cache.recurrent
        layer = recurrent.index[self.layer_idx]
        rows = slice(batch.row_start, batch.row_start + batch_size)
        kernels = ops.gdn_kernels_for(x)  # one Triton kernel per piece of elementwise work on CUDA
        mixed, z, b, a = self.project(x)
        conv_state, state = recurrent.conv[layer, rows], recurrent.state[layer, rows]
        tree = batch.tree_paths
        if tree is None:  # a chain committed at once (a prefill chunk): nothing to record
            conved = torch.empty_like(mixed)
            decay = torch.empty(a.shape, dtype=torch.float32, device=x.device)
            beta = torch.empty_like(decay)
            windows = batch.shared.get("conv_windows")  # every recurrent layer of the forward shares them
            if windows is None:
                windows = batch.shared["conv_windows"] = causal_windows(tokens, self.conv_width, x.device)
        else:  # a tree: outputs now, the state once the accepted path is known (RecurrentCache.commit)
            inputs, conved, decay, beta = recurrent.record(self.layer_idx, rows, tokens)
            inputs.copy_(mixed)
            if self.leaky:
                tree = chain_paths(batch_size, tokens, x.device)
                windows = conv_windows(tree, self.conv_width)
            else:  # every recurrent layer of the forward shares the tree, hence the windows
                windows = batch.shared.get("conv_windows")
                if windows is None:
                    windows = batch.shared["conv_windows"] = conv_windows(tree, self.conv_width)
        if kernels is not None:
            kernels.gates(a, b, self.A_log, self.dt_bias, decay, beta)
            kernels.conv(conv_state, mixed, windows, self.conv1d.weight, conved)
        else:
            decay.copy_(-self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias))
            beta.copy_(b.sigmoid().float())
            conved.copy_(path_conv(torch.cat([conv_state, mixed], dim=1), windows, self.conv1d.weight))
        if tree is None and batch.valid is not None:  # padding neither decays nor writes the state
            real = batch.valid[..., None]
            decay.mul_(real)
            beta.mul_(real)
        q, k, v = recurrent.split(conved)
        if tree is None:
            if kernels is not None:  # one launch, the state advanced in place: on an H200 3-18x faster than
                # the chunked form from 16 to 2048 tokens (benchmarks/gdn_prefill_rule.py)
                out = kernels.chain_rule(q, k, v, decay, beta, state)
            else:
                rule = chunked_rule if tokens >= CHUNK_SIZE else chain_rule
                out, final = rule(rule_inputs(q, k, v, decay, beta), state)
                state.copy_(final)
            keep_last_inputs(conv_state, mixed, batch.valid)
        elif kernels is not None:
            out = kernels.tree_rule(q, k, v, decay, beta, tree, state)
        else:
            out = tree_rule(rule_inputs(q, k, v, decay, beta), tree, state)
        if kernels is not None:
            out = kernels.gated_norm(out, z, self.norm.weight, self.norm.eps, x.dtype)
        else:
            out = self.norm(out.to(x.dtype), z).reshape(batch_size, tokens, self.value_size)
        return ops.linear(out, self.out_proj)


def part_by_part(groups: int, widths: list[int]) -> torch.Tensor:
    """Row indices that reorder rows laid out group by group ([part 0 | part 1 | ...] of group 0, then of group
    1, ...) part by part (part 0 of every group, then part 1 of every group, ...)."""
    block, offsets = sum(widths), [0, *itertools.accumulate(widths)][:-1]
    return torch.cat(
        [
            torch.arange(width) + offset + g * block
            for offset, width in zip(offsets, widths, strict=True)
            for g in range(groups)
        ]
    )


class Qwen3NextGatedDeltaNet(GatedDeltaNet):
    """Qwen3-Next: q, k, v, z fused in in_proj_qkvz and b, a in in_proj_ba. Checkpoints group both per key head
    (q, k, v, z of key head 0, then of head 1, ...); the module keeps their rows part by part (every head's q,
    then every head's k, ...), so that q|k|v, z, b and a are slices of the projections' outputs, with no copy.
    `load_checkpoint_state` reorders a checkpoint's rows, and `state_dict()` gives them back in its order."""

    def __init__(self, config: dict[str, Any], layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        self.in_proj_qkvz = nn.Linear(self.hidden, 2 * self.key_size + 2 * self.value_size, bias=False)
        self.in_proj_ba = nn.Linear(self.hidden, 2 * self.v_heads, bias=False)
        self.register_state_dict_post_hook(Qwen3NextGatedDeltaNet._checkpoint_order)

    def _orders(self) -> dict[str, torch.Tensor]:
        """For each projection, the checkpoint row each of this module's rows holds (made on the CPU: the module
        itself may live on the meta device)."""
        group = self.v_heads // self.k_heads
        widths = [self.k_dim, self.k_dim, group * self.v_dim, group * self.v_dim]
        return {
            "in_proj_qkvz.weight": part_by_part(self.k_heads, widths),
            "in_proj_ba.weight": part_by_part(self.k_heads, [group, group]),
        }

    def _reorder(self, state_dict: dict, prefix: str, to_checkpoint: bool) -> None:
        """The projections' rows of `state_dict` in this module's order, or back in the checkpoint's."""
        for name, order in self._orders().items():
            weight = state_dict.get(prefix + name)
            if weight is not None:
                index = torch.argsort(order) if to_checkpoint else order
                state_dict[prefix + name] = weight[index.to(weight.device)]

    def merge_parts(self, state_dict: dict, prefix: str) -> None:
        """A checkpoint-named `state_dict`'s projection rows in this module's order (`load_checkpoint_state`)."""
        self._reorder(state_dict, prefix, to_checkpoint=False)

    def _checkpoint_order(self, state_dict: dict, prefix: str, local_metadata: dict) -> None:
        self._reorder(state_dict, prefix, to_checkpoint=True)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, tokens, _ = x.shape
        mixed, z = ops.linear(x, self.in_proj_qkvz).split(
            [2 * self.key_size + self.value_size, self.value_size], dim=-1
        )
        b, a = ops.linear(x, self.in_proj_ba).split([self.v_heads, self.v_heads], dim=-1)
        return mixed, z.view(batch, tokens, self.v_heads, self.v_dim), b, a


class Qwen3_5GatedDeltaNet(GatedDeltaNet):
    """Qwen3.5: in_proj_qkv, in_proj_z, in_proj_b and in_proj_a in plain head order, run as one matmul."""

    def __init__(self, config: dict[str, Any], layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        parts = {"in_proj_qkv": 2 * self.key_size + self.value_size, "in_proj_z": self.value_size}
        self.in_proj = MergedLinear(
            self.hidden, parts | {"in_proj_b": self.v_heads, "in_proj_a": self.v_heads}
        )

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        batch, tokens, _ = x.shape
        mixed, z, b, a = ops.linear(x, self.in_proj).split(list(self.in_proj.parts.values()), dim=-1)
        return mixed, z.view(batch, tokens, self.v_heads, self.v_dim), b, a
