"""The cache entry of a recurrent (Gated DeltaNet) layer, and the token tree it reads from an attention mask.

An attention mask cannot isolate tree branches inside a recurrent layer: its state is folded over tokens,
so a node processed after its sibling would absorb it. The layer therefore reads the tree from the mask
(the parent of new token i is the latest earlier new token i may attend to; none means the committed
prefix) and runs every node from its parent's state and along its own path for the short convolution.

`RecurrentState` holds the committed (conv, recurrent) state and, after a forward, a record of the new
tokens. `keep` commits the state of the last kept token (the accepted leaf) and the conv inputs along the
kept path; the next forward commits a record that is a plain chain (a prefill, an `ar` step) by itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdeploy.engine.models.gated_delta_rule import RuleInputs, tree_rule
from specdeploy.errors import SpecdeployError


def chain_parents(tokens: int) -> list[int]:
    return list(range(-1, tokens - 1))


def tree_parents(new_visible: torch.Tensor) -> list[int]:
    """Parent of each new token (-1: the committed prefix) from their visibility among themselves [B|1, T, T].

    Each must see exactly itself and its ancestors: anything else has no meaning for a recurrent state.
    """
    tree = new_visible[0]
    if new_visible.shape[0] > 1 and not bool((new_visible == tree).all()):
        raise SpecdeployError(
            "recurrent layers need one token tree for the whole batch: give a [1, T, S] mask"
        )
    tokens = tree.shape[0]
    order = torch.arange(tokens, device=tree.device)
    if torch.equal(tree, order[None, :] <= order[:, None]):
        return chain_parents(tokens)
    earlier = tree & (order[None, :] < order[:, None])
    parents = ((earlier * (order + 1)).amax(dim=1) - 1).tolist()
    ancestors = torch.eye(tokens, dtype=torch.bool, device=tree.device)
    for node, parent in enumerate(parents):
        if parent >= 0:
            ancestors[node] |= ancestors[parent]  # parents come first, so their rows are complete
    if not torch.equal(ancestors, tree):
        raise SpecdeployError(
            "the attention mask over the new tokens is not a tree (each token must see exactly itself and its "
            "ancestors), which a recurrent layer cannot follow"
        )
    return parents


def conv_windows(parents: list[int], width: int, device: torch.device) -> torch.Tensor:
    """[T, width] indices into [committed conv inputs (width-1) | new tokens' inputs (T)], oldest first.

    Token i's window is i, parent(i), grandparent(i), ... and, once the path reaches the prefix, the
    committed inputs from the most recent back.
    """
    history = width - 1
    # Stepping back from a committed column reaches at most column 0 within width-1 steps, so -1 is unused.
    previous = list(range(-1, history - 1)) + [history + p if p >= 0 else history - 1 for p in parents]
    step_back = torch.tensor(previous, device=device)
    columns = [torch.arange(history, history + len(parents), device=device)]
    for _ in range(history):
        columns.append(step_back[columns[-1]])
    return torch.stack(columns[::-1], dim=1)


@dataclass
class PendingTokens:
    """What one forward recorded about its new tokens until some of them are committed."""

    tree_parents: list[int]  # from the mask; -1 = child of the committed prefix
    state_parents: list[int]  # the parents the state actually followed (the tree's, unless leaky)
    conv_inputs: torch.Tensor  # [B, width-1 + T, C]: the committed conv state, then the new tokens' inputs
    windows: torch.Tensor  # [T, width] from conv_windows(state_parents)
    inputs: RuleInputs  # to replay a path whose states were not kept
    states: torch.Tensor | None  # [B, H, T, Dk, Dv] every token's state, or None (chunked form)
    final_state: torch.Tensor  # [B, H, Dk, Dv] after the last token

    @property
    def size(self) -> int:
        return len(self.tree_parents)

    def state_of(self, token: int, committed: torch.Tensor) -> torch.Tensor:
        """The recurrent state after `token`, replayed from `committed` along its path if it was not kept."""
        if self.states is not None:
            return self.states[:, :, token].clone()  # a copy, so the record's other states can be freed
        if token == self.size - 1:
            return self.final_state
        path = [token]
        while self.state_parents[path[-1]] >= 0:
            path.append(self.state_parents[path[-1]])
        path.reverse()
        _, states = tree_rule(self.inputs.select(path), chain_parents(len(path)), committed)
        return states[:, :, -1]


class RecurrentState:
    """Cache entry of one Gated DeltaNet layer (a `CacheEntry`): committed state plus the last forward's record."""

    def __init__(self, conv: torch.Tensor, recurrent: torch.Tensor) -> None:
        self.conv = conv  # [B, width-1, C]: the last conv inputs along the committed sequence
        self.recurrent = recurrent  # [B, H, Dk, Dv] float32
        self.committed = 0  # tokens folded into the state
        self.pending: PendingTokens | None = None

    @property
    def length(self) -> int:
        return self.committed + (self.pending.size if self.pending is not None else 0)

    def record(self, pending: PendingTokens) -> None:
        if self.pending is not None:
            raise SpecdeployError("settle() the previous forward's tokens before recording new ones")
        self.pending = pending

    def settle(self) -> None:
        """Commit a pending chain whole (what a prefill or an `ar` step means); a pending tree needs `keep`."""
        if self.pending is None:
            return
        if self.pending.tree_parents != chain_parents(self.pending.size):
            raise SpecdeployError(
                f"the last forward verified a tree of {self.pending.size} tokens: keep() its accepted path "
                "before running more tokens through a recurrent layer"
            )
        self._commit(list(range(self.pending.size)))

    def keep(self, positions: torch.Tensor) -> None:
        """Keep the committed prefix and a root-to-node path of the pending tokens (positions over the cache)."""
        kept = positions.tolist()
        committed = self.committed
        if kept[:committed] != list(range(committed)):
            raise SpecdeployError(
                f"a recurrent layer can only drop uncommitted tokens: keep positions 0..{committed - 1} first, "
                "in order (its state cannot forget tokens it has folded in)"
            )
        new = [p - committed for p in kept[committed:]]
        pending = self.pending.size if self.pending is not None else 0
        if any(not 0 <= n < pending for n in new):
            raise SpecdeployError(
                f"keep positions {[n + committed for n in new]} are outside the cache (length {self.length})"
            )
        if not new:
            self.pending = None
            return
        parents = self.pending.tree_parents
        if any(parents[n] != (new[j - 1] if j else -1) for j, n in enumerate(new)):
            raise SpecdeployError(
                "a recurrent layer can only keep a path of the verified tree (each kept token the child of "
                "the one before, the first a child of the prefix)"
            )
        self._commit(new)

    def crop(self, length: int) -> None:
        if length < self.committed:
            raise SpecdeployError(
                f"cannot crop a recurrent layer to {length} tokens: its state already holds {self.committed}; "
                "start a new cache instead"
            )
        if length > self.length:
            raise SpecdeployError(f"cannot crop to {length} tokens: the cache holds {self.length}")
        self.keep(torch.arange(length))

    def _commit(self, path: list[int]) -> None:
        pending = self.pending
        leaf = path[-1]
        self.recurrent = pending.state_of(leaf, self.recurrent)
        self.conv = pending.conv_inputs[:, pending.windows[leaf, 1:]]
        self.committed += len(path)
        self.pending = None
