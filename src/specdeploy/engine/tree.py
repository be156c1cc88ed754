"""Draft trees: the DDTree best-first construction, chains as the one-branch case, masks, and the accept walk.

A tree of N nodes is verified as N+1 tokens: index 0 is the root (the last committed token, whose successor
is not yet known) and node i (1..N) sits at index i, after its parent, at position prefix + depth.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    tokens: list[int]  # token of node i at tokens[i-1]
    parents: list[int]  # parent index (0 = root) of node i at parents[i-1]; always < i
    depths: list[int]  # depth of node i at depths[i-1]; the root has depth 0

    @property
    def size(self) -> int:
        return len(self.tokens)

    def children(self) -> list[dict[int, int]]:
        """For every index 0..N, a map token -> child index."""
        kids: list[dict[int, int]] = [{} for _ in range(self.size + 1)]
        for node, (token, parent) in enumerate(zip(self.tokens, self.parents, strict=True), start=1):
            kids[parent].setdefault(token, node)
        return kids

    def ancestor_mask(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """[N+1, N+1] bool: entry (i, j) is True when j is i itself or one of its ancestors."""
        n = self.size + 1
        mask = torch.eye(n, dtype=torch.bool)
        for node, parent in enumerate(self.parents, start=1):
            mask[node] |= mask[parent]  # parents come first, so their rows are already complete
        return mask.to(device)


def chain_tree(tokens: list[int]) -> DraftTree:
    """A DFlash block: one path, node i child of node i-1."""
    return DraftTree(
        tokens=list(tokens), parents=list(range(len(tokens))), depths=list(range(1, len(tokens) + 1))
    )


def best_first_tree(draft_logprobs: torch.Tensor, budget: int) -> DraftTree:
    """The `budget` prefixes with the highest product of per-depth draft marginals (DDTree).

    draft_logprobs is [L, V]: log q_d for depths 1..L from one drafter pass. A heap holds candidate nodes
    scored by the sum of log q along their path; popping one adds it to the tree and pushes its next sibling
    (same parent, next-ranked token) and its first child (next depth, best token). Only the top-min(budget, V)
    tokens per depth can ever be reached, so only those are sorted.
    """
    depth_limit, vocab = draft_logprobs.shape
    width = min(budget, vocab)
    top_logp, top_tokens = torch.topk(draft_logprobs.float(), width, dim=-1)
    top_logp, top_tokens = top_logp.tolist(), top_tokens.tolist()
    tree = DraftTree(tokens=[], parents=[], depths=[])
    if depth_limit == 0 or budget < 1:
        return tree
    # (negated score, tie-break order, depth, rank, parent index, parent score)
    heap = [(-top_logp[0][0], 0, 1, 0, 0, 0.0)]
    order = 1
    while heap and tree.size < budget:
        neg_score, _, depth, rank, parent, parent_score = heapq.heappop(heap)
        tree.tokens.append(top_tokens[depth - 1][rank])
        tree.parents.append(parent)
        tree.depths.append(depth)
        node, score = tree.size, -neg_score
        if rank + 1 < width:
            heapq.heappush(
                heap,
                (
                    -(parent_score + top_logp[depth - 1][rank + 1]),
                    order,
                    depth,
                    rank + 1,
                    parent,
                    parent_score,
                ),
            )
            order += 1
        if depth < depth_limit:
            heapq.heappush(heap, (-(score + top_logp[depth][0]), order, depth + 1, 0, node, score))
            order += 1
    return tree


def accept_path(tree: DraftTree, target_token_at) -> tuple[list[int], int]:
    """Walk from the root into the child whose token is the target's own token at the current node.

    `target_token_at(i)` gives the target's token (argmax, or a fresh sample at T > 0) after index i; it is
    called only along the walk, so each committed token is drawn from the target's conditional exactly once,
    which is what makes the walk lossless at any temperature. Returns the accepted indices (root first) and
    the target token that left the tree (the next bonus token).
    """
    kids = tree.children()
    path = [0]
    while True:
        token = target_token_at(path[-1])
        child = kids[path[-1]].get(token)
        if child is None:
            return path, token
        path.append(child)
