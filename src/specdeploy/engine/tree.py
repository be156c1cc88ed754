"""Draft trees as batched, fixed-shape device tensors: DFlash chains, DDTree's best prefixes, the accept walk.

A tree of N nodes is verified as N+1 tokens: index 0 is the root (the last committed token, whose successor
is not yet known) and node i (1..N) sits at index i, after its parent, at position prefix + depth. Nothing
here synchronises with the host, so a decoding step can be captured as a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdeploy.engine import ops


@dataclass
class TreeBatch:
    tokens: torch.Tensor  # [B, N+1] token at each index; index 0 is the root
    parents: torch.Tensor  # [B, N+1] parent index; the root is its own parent
    depths: torch.Tensor  # [B, N+1] the root has depth 0
    valid: torch.Tensor  # [B, N+1] bool; False for padding (never accepted, sees only itself and the root)
    ancestors: torch.Tensor  # [B, N+1, N+1] bool: (i, j) when j is i itself or one of its ancestors

    @property
    def size(self) -> int:
        return self.tokens.shape[1] - 1

    def copy_(self, other: TreeBatch) -> None:
        for name in ("tokens", "parents", "depths", "valid", "ancestors"):
            getattr(self, name).copy_(getattr(other, name))

    @staticmethod
    def empty(batch: int, size: int, device: torch.device) -> TreeBatch:
        index = torch.zeros(batch, size + 1, dtype=torch.long, device=device)
        return TreeBatch(
            tokens=index.clone(),
            parents=index.clone(),
            depths=index.clone(),
            valid=torch.zeros(batch, size + 1, dtype=torch.bool, device=device),
            ancestors=torch.zeros(batch, size + 1, size + 1, dtype=torch.bool, device=device),
        )


def ancestor_matrix(parents: torch.Tensor, depth_limit: int) -> torch.Tensor:
    """[B, N+1, N+1] ancestor-or-self relation from parents [B, N+1] of trees at most `depth_limit` deep."""
    size = parents.shape[1]
    eye = torch.eye(size, dtype=torch.bool, device=parents.device).expand(parents.shape[0], -1, -1)
    ancestors = eye
    gather = parents[:, :, None].expand(-1, -1, size)
    for _ in range(depth_limit):  # each round adds one more generation of ancestors
        ancestors = eye | ancestors.gather(1, gather)
    return ancestors


def chain_tree(root: torch.Tensor, tokens: torch.Tensor) -> TreeBatch:
    """A DFlash block [root, tokens...] as one path: node i is the child of node i - 1."""
    batch, length = tokens.shape
    index = torch.arange(length + 1, device=tokens.device).expand(batch, -1)
    return TreeBatch(
        tokens=torch.cat([root[:, None], tokens], dim=1),
        parents=(index - 1).clamp(min=0),
        depths=index,
        valid=torch.ones(batch, length + 1, dtype=torch.bool, device=tokens.device),
        ancestors=torch.ones(length + 1, length + 1, dtype=torch.bool, device=tokens.device)
        .tril()
        .expand(batch, -1, -1),
    )


def best_first_tree(root: torch.Tensor, logprobs: torch.Tensor, budget: int) -> TreeBatch:
    """The `budget` prefixes with the highest product of per-depth draft marginals (DDTree).

    logprobs [B, L, V] holds log q_d for depths 1..L from one drafter pass. A prefix's score is the sum of
    log q along it, so extending a prefix never raises its score: the best `budget` prefixes form a tree,
    and those at depth d extend the best `budget` at depth d - 1 by one of the best min(budget, V) tokens
    of depth d. Depth by depth the best `budget` extensions are kept; the tree is the best `budget` of all
    those candidates, ties going to the shallower one (so a parent always precedes its child), in depth
    order. Trees with fewer candidates than `budget` are padded with invalid nodes.
    """
    batch, depth_limit, vocab = logprobs.shape
    device = logprobs.device
    width = min(budget, vocab)
    top_logp, top_tokens = torch.topk(logprobs.float(), width, dim=-1)
    kernels = ops.triton_kernels_for(logprobs)
    if kernels is not None:  # the same selection in one kernel launch
        return TreeBatch(*kernels.best_first_tree(root, top_logp, top_tokens, budget))
    scores, parents, tokens, depths = [top_logp[:, 0]], [], [top_tokens[:, 0]], [width]
    parents.append(torch.full_like(top_tokens[:, 0], -1))  # -1: the root
    offset = 0  # index of the previous depth's first candidate among all candidates
    for depth in range(1, depth_limit):
        extended = scores[-1][:, :, None] + top_logp[:, depth, None, :]
        best, index = torch.topk(extended.flatten(1), min(budget, extended[0].numel()), dim=-1)
        scores.append(best)
        parents.append(offset + index // width)
        tokens.append(top_tokens[:, depth].gather(1, index % width))
        offset += depths[-1]
        depths.append(best.shape[1])
    candidates = sum(depths)
    size = min(budget, candidates)
    # fills, not a tensor from a host list: nothing here may copy from the host inside a CUDA graph
    depth_of = torch.cat([torch.full((n,), d + 1, device=device) for d, n in enumerate(depths)])
    order = torch.sort(torch.cat(scores, dim=1), dim=1, descending=True, stable=True).indices[:, :size]
    chosen = torch.sort(order, dim=1).values  # depth order, so parents come before their children
    node_of = torch.zeros(batch, candidates + 1, dtype=torch.long, device=device)  # last column: the root
    node_of[:, :candidates].scatter_(1, chosen, torch.arange(1, size + 1, device=device).expand(batch, -1))
    parent_candidate = torch.cat(parents, dim=1).gather(1, chosen)
    node_parents = node_of.gather(1, torch.where(parent_candidate < 0, candidates, parent_candidate))
    zeros = torch.zeros(batch, budget - size, dtype=torch.long, device=device)
    tree_parents = torch.cat([torch.zeros_like(root)[:, None], node_parents, zeros], dim=1)
    return TreeBatch(
        tokens=torch.cat([root[:, None], torch.cat(tokens, dim=1).gather(1, chosen), zeros], dim=1),
        parents=tree_parents,
        depths=torch.cat([torch.zeros_like(root)[:, None], depth_of[chosen], zeros], dim=1),
        valid=torch.arange(budget + 1, device=device).expand(batch, -1) <= size,
        ancestors=ancestor_matrix(tree_parents, depth_limit),
    )


@dataclass
class Acceptance:
    path: torch.Tensor  # [B, L+1] accepted indices by depth (root first); entries past `length` are 0
    length: torch.Tensor  # [B] accepted indices, the root included: the tokens this step commits
    bonus: torch.Tensor  # [B] the target's token after the last accepted index (the next root)


def walk(tree: TreeBatch, target_tokens: torch.Tensor, depth_limit: int) -> Acceptance:
    """Walk from the root into the child whose token is the target's token at the current index.

    target_tokens [B, N+1] is the target's token (argmax, or its own sample) after each index; only those
    along the walk matter, so each committed token comes from the target's conditional, which is what
    makes the walk lossless at any temperature. Siblings carry distinct tokens, so the accepted indices
    form one path: every index whose ancestors all match.
    """
    matches = tree.tokens == target_tokens.gather(1, tree.parents)
    matches[:, 0] = True
    matches &= tree.valid
    accepted = ~(tree.ancestors & ~matches[:, None, :]).any(dim=-1)
    leaf = torch.where(accepted, tree.depths, -1).argmax(dim=1)
    length = tree.depths.gather(1, leaf[:, None])[:, 0] + 1
    on_path = tree.ancestors.gather(1, leaf[:, None, None].expand(-1, 1, tree.size + 1))[:, 0]
    # Scatter each on-path index to its depth; off-path indices go to a spare column that is dropped.
    column = torch.where(on_path, tree.depths, depth_limit + 1)
    index = torch.arange(tree.size + 1, device=column.device).expand_as(column)
    path = torch.zeros(column.shape[0], depth_limit + 2, dtype=torch.long, device=column.device)
    path.scatter_(1, column, index)
    return Acceptance(
        path=path[:, : depth_limit + 1], length=length, bonus=target_tokens.gather(1, leaf[:, None])[:, 0]
    )
