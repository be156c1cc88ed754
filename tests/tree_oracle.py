"""Host-side draft trees for tests: a plain tree type, the accept walk as the DDTree paper states it, and an
optimality certificate for best-first trees.

The engine builds trees as batched device tensors (`specdeploy.engine.tree`); these are independent of it.
"""

from __future__ import annotations

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


def path_score(logprobs: torch.Tensor, path: tuple[int, ...]) -> float:
    return sum(float(logprobs[d, t]) for d, t in enumerate(path))


def certify_best_first(tree: DraftTree, logprobs: torch.Tensor, budget: int) -> None:
    """Assert that `tree` holds `budget` (or all) prefixes with the highest scores, whatever the vocabulary.

    Scores fall along a path, so every prefix outside the tree either has an unselected ancestor or is an
    unselected child of the root or of a tree node; checking that no such child beats the tree's worst prefix
    proves optimality (ties may go either way).
    """
    depth_limit, vocab = logprobs.shape
    paths = tree.paths()
    assert len(paths) == tree.size == min(budget, sum(vocab**d for d in range(1, depth_limit + 1)))
    worst = min(path_score(logprobs, p) for p in paths)
    for parent in [(), *paths]:
        if len(parent) == depth_limit:
            continue
        scores = path_score(logprobs, parent) + logprobs[len(parent)]
        outside = [t for t in range(vocab) if (*parent, t) not in paths]
        if outside:
            assert float(scores[outside].max()) <= worst + 1e-6, (parent, float(scores[outside].max()), worst)
