"""Host-side draft trees for tests: a plain tree type and DDTree's best-first heap (the reference construction).

The engine builds trees as batched device tensors (`specdeploy.engine.tree`); these are the independent
oracle the tests compare it with, written as the DDTree paper and its reference code describe them.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

from specdeploy.engine.tree import TreeBatch, ancestor_matrix


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

    def paths(self) -> set[tuple[int, ...]]:
        """Every node's token path from the root."""
        found = set()
        for node in range(1, self.size + 1):
            path, i = [], node
            while i:
                path.append(self.tokens[i - 1])
                i = self.parents[i - 1]
            found.add(tuple(reversed(path)))
        return found

    def batch(self, root: int, depth_limit: int) -> TreeBatch:
        """The same tree as the engine's one-row TreeBatch."""
        parents = torch.tensor([[0, *self.parents]])
        return TreeBatch(
            tokens=torch.tensor([[root, *self.tokens]]),
            parents=parents,
            depths=torch.tensor([[0, *self.depths]]),
            valid=torch.ones(1, self.size + 1, dtype=torch.bool),
            ancestors=ancestor_matrix(parents, depth_limit),
        )


def tree_from_batch(tree: TreeBatch, row: int = 0) -> DraftTree:
    valid = tree.valid[row, 1:].tolist()
    keep = [i for i, v in enumerate(valid) if v]
    return DraftTree(
        tokens=[tree.tokens[row, 1 + i].item() for i in keep],
        parents=[tree.parents[row, 1 + i].item() for i in keep],
        depths=[tree.depths[row, 1 + i].item() for i in keep],
    )


def heap_best_first_tree(draft_logprobs: torch.Tensor, budget: int) -> DraftTree:
    """The DDTree reference construction: a heap of (depth, rank) candidates scored by the sum of log q;
    each pop adds a node and pushes its next sibling and its first child."""
    depth_limit, vocab = draft_logprobs.shape
    width = min(budget, vocab)
    top_logp, top_tokens = torch.topk(draft_logprobs.float(), width, dim=-1)
    top_logp, top_tokens = top_logp.tolist(), top_tokens.tolist()
    tree = DraftTree(tokens=[], parents=[], depths=[])
    if depth_limit == 0 or budget < 1:
        return tree
    heap = [(-top_logp[0][0], 0, 1, 0, 0, 0.0)]  # (-score, order, depth, rank, parent, parent score)
    order = 1
    while heap and tree.size < budget:
        neg_score, _, depth, rank, parent, parent_score = heapq.heappop(heap)
        tree.tokens.append(top_tokens[depth - 1][rank])
        tree.parents.append(parent)
        tree.depths.append(depth)
        node, score = tree.size, -neg_score
        if rank + 1 < width:
            sibling = -(parent_score + top_logp[depth - 1][rank + 1])
            heapq.heappush(heap, (sibling, order, depth, rank + 1, parent, parent_score))
            order += 1
        if depth < depth_limit:
            heapq.heappush(heap, (-(score + top_logp[depth][0]), order, depth + 1, 0, node, score))
            order += 1
    return tree


def accept_path(tree: DraftTree, target_token_at) -> tuple[list[int], int]:
    """Walk from the root into the child whose token is the target's own token at the current node."""
    kids = tree.children()
    path = [0]
    while True:
        token = target_token_at(path[-1])
        child = kids[path[-1]].get(token)
        if child is None:
            return path, token
        path.append(child)
