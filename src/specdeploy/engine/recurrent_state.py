"""The cache of recurrent (Gated DeltaNet) layers: each row's committed state, and what a tree verification recorded.

An attention mask cannot isolate tree branches inside a recurrent layer: its state is folded over tokens, so
a node processed after its sibling would absorb it. So a verification runs every new token from its own
parent's state and along its own path for the short convolution (`ForwardBatch.tree_paths`), and records
each new token's inputs; once the accepted path is known, `commit` replays that path from the committed
state (the same arithmetic, so the same state the verification gave its last token) and takes the last
convolution inputs along it. A chain that is committed whole (a prefill chunk) updates the state at once.

Everything is fixed-shape device work over rows 0..B-1, so a step with recurrent layers is captured as a CUDA
graph like any other. Rows that commit nothing (count 0) keep their state.
"""

from __future__ import annotations

import torch

from specdeploy.engine import ops
from specdeploy.engine.models.gated_delta_rule import replay
from specdeploy.errors import SpecdeployError


def chain_paths(batch: int, tokens: int, device: torch.device) -> torch.Tensor:
    """[B, T, T] root paths of a chain: token i's path is 0..i."""
    order = torch.arange(tokens, device=device)
    paths = torch.where(order[None, :] <= order[:, None], order[None, :], -1)
    return paths.expand(batch, -1, -1)


def conv_windows(paths: torch.Tensor, width: int) -> torch.Tensor:
    """[B, T, width] indices into [committed conv inputs (width-1) | new tokens' inputs (T)], oldest first.

    Token i's window is its `width` latest inputs along its own path (`paths` [B, T, D]): itself, its parent,
    ..., and once the path reaches the prefix, the committed inputs from the most recent back.
    """
    history = width - 1
    depth = (paths >= 0).sum(dim=-1, keepdim=True) - 1  # [B, T, 1]
    taps = depth - torch.arange(
        history, -1, -1, device=paths.device
    )  # the depth each tap reads, oldest first
    along = history + paths.gather(2, taps.clamp(min=0))
    return torch.where(taps >= 0, along, history + taps)  # taps below the root: committed columns


def causal_windows(tokens: int, width: int, device: torch.device) -> torch.Tensor:
    """[1, T, width] conv windows of a chain: token i reads columns i..i+width-1."""
    return (torch.arange(tokens, device=device)[:, None] + torch.arange(width, device=device))[None]


class RecurrentCache:
    """Per cache row, every recurrent layer's conv inputs and float32 state; per verified token, its inputs."""

    def __init__(
        self,
        layers: list[int],
        rows: int,
        conv_width: int,
        heads: tuple[int, int],
        dims: tuple[int, int],
        tree_tokens: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        """`heads`: (key heads, value heads); `dims`: (key dim, value dim); `tree_tokens`: the most tokens a
        verification may hold (its record's size). Conv channels are q|k|v: 2 * key heads * key dim + values."""
        (key_heads, value_heads), (key_dim, value_dim) = heads, dims
        self.key_size, self.value_size = key_heads * key_dim, value_heads * value_dim
        self.heads, self.dims = heads, dims
        channels = 2 * self.key_size + self.value_size
        count = len(layers)
        self.index = {layer: i for i, layer in enumerate(layers)}
        self.tree_tokens = tree_tokens
        self.conv = torch.zeros(count, rows, conv_width - 1, channels, dtype=dtype, device=device)
        self.state = torch.zeros(count, rows, value_heads, key_dim, value_dim, device=device)
        record = (count, rows, tree_tokens)
        self.inputs = torch.zeros(*record, channels, dtype=dtype, device=device)  # before the convolution
        self.conved = torch.zeros(*record, channels, dtype=dtype, device=device)  # q|k|v after it
        self.decay = torch.zeros(*record, value_heads, device=device)
        self.beta = torch.zeros(*record, value_heads, device=device)

    @property
    def tensors(self) -> list[torch.Tensor]:
        """The committed state: what a row move copies and what must survive a stage's warm-up."""
        return [self.conv, self.state]

    def reset_row(self, row: int) -> None:
        """An empty sequence in `row` (before its prefill)."""
        for tensor in self.tensors:
            tensor[:, row] = 0

    def copy_row(self, source: torch.Tensor, dest: torch.Tensor) -> None:
        """Row `source`'s state to row `dest` (one-element tensors, as `StaticCache.copy_row`'s)."""
        for tensor in self.tensors:
            tensor.index_copy_(1, dest, tensor.index_select(1, source))

    def record(self, layer: int, rows: slice, tokens: int) -> tuple[torch.Tensor, ...]:
        """Where a verification of `tokens` tokens writes what `commit` needs, [B, T, ...] each: the conv
        inputs, the convolved q|k|v, decay and beta."""
        if tokens > self.tree_tokens:
            raise SpecdeployError(
                f"a verification of {tokens} tokens exceeds the recurrent cache's record of {self.tree_tokens}: "
                "make the cache for the largest tree (new_cache(tree_tokens=...))"
            )
        return tuple(t[rows, :tokens] for t in self._record(self.index[layer]))

    def _record(self, index: int) -> tuple[torch.Tensor, ...]:
        return tuple(t[index] for t in (self.inputs, self.conved, self.decay, self.beta))

    def split(self, conved: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k [..., key heads, key dim] and v [..., value heads, value dim]: views of q|k|v [..., C]."""
        (key_heads, value_heads), (key_dim, value_dim) = self.heads, self.dims
        q, k, v = conved.split([self.key_size, self.key_size, self.value_size], dim=-1)
        shape = conved.shape[:-1]
        return (q.view(*shape, key_heads, key_dim), k.view(*shape, key_heads, key_dim),
                v.view(*shape, value_heads, value_dim))  # fmt: skip

    def commit(self, path: torch.Tensor, count: torch.Tensor) -> None:
        """Rows 0..B-1 keep the first count[b] recorded tokens of path[b] ([B, P] token indices, root first):
        each layer's state is replayed along them and its conv inputs end with theirs."""
        rows = path.shape[0]
        kernels = ops.gdn_kernels_for(self.state)
        if kernels is not None:  # every layer in one launch each
            _, key, value = self.split(self.conved[:, :rows])
            kernels.conv_commit(self.conv[:, :rows], self.inputs[:, :rows], path, count)
            kernels.replay(
                self.state[:, :rows], key, value, self.decay[:, :rows], self.beta[:, :rows], path, count
            )
            return
        source = self._conv_sources(path, count)
        for i in range(len(self.index)):
            inputs, conved, decay, beta = (t[:rows] for t in self._record(i))
            conv = self.conv[i, :rows]
            joined = torch.cat([conv, inputs], dim=1)
            conv.copy_(joined.gather(1, source[..., None].expand(-1, -1, joined.shape[-1])))
            _, key, value = self.split(conved)
            replay(self.state[i, :rows], key, value, decay, beta, path, count)

    def _conv_sources(self, path: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        """[B, W-1]: the new conv inputs' columns in [committed | recorded tokens]: the last W-1 of the committed
        ones followed by the kept path's."""
        history = self.conv.shape[2]
        position = count[:, None] + torch.arange(history, device=path.device)
        node = path.gather(1, (position - history).clamp(0, path.shape[1] - 1))
        return torch.where(position >= history, history + node, position)
