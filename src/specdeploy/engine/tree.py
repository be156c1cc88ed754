"""Draft trees as batched, fixed-shape device tensors: DFlash chains, DDTree's best prefixes, the accept walk.

A tree of N nodes is verified as N+1 tokens: index 0 is the root (the last committed token, whose successor
is not yet known) and node i (1..N) sits at index i, after its parent, at position prefix + depth. Nothing
here synchronises with the host, so a decoding step can be captured as a CUDA graph.
"""

from __future__ import annotations

import heapq
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

    FIELDS = ("tokens", "parents", "depths", "valid", "ancestors")

    def copy_(self, other: TreeBatch) -> None:
        for name in self.FIELDS:
            getattr(self, name).copy_(getattr(other, name))

    def rows(self, count: int) -> TreeBatch:
        """Views of the first `count` rows."""
        return TreeBatch(*(getattr(self, name)[:count] for name in self.FIELDS))

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


def root_paths(ancestors: torch.Tensor, depths: int) -> torch.Tensor:
    """[B, N+1, depths]: each index's path from the root, its ancestors by depth and itself last, -1 padded.

    For layers whose state follows the tree (recurrent ones). `depths` must exceed every depth; the depth of
    an index is read from the relation itself (its ancestors but itself), so padding nodes, which see only
    the root and themselves, sit at depth 1.
    """
    depth = ancestors.sum(dim=-1) - 1  # [B, N+1]
    at_depth = depth[:, :, None] == torch.arange(depths, device=depth.device)  # [B, j, d]
    index = torch.arange(1, ancestors.shape[-1] + 1, device=depth.device, dtype=torch.float32)
    # path[b, i, d] = the one ancestor j of i at depth d (+1, so that 0 means none); small integers, exact in float
    paths = torch.bmm(ancestors.float(), at_depth.float() * index[None, :, None])
    return paths.long() - 1


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


def best_first_tree(
    root: torch.Tensor,
    logprobs: torch.Tensor,
    budget: int,
    top: tuple[torch.Tensor, torch.Tensor] | None = None,
    out: TreeBatch | None = None,
    paths: torch.Tensor | None = None,
) -> TreeBatch:
    """The `budget` prefixes with the highest product of per-depth draft marginals (DDTree).

    logprobs [B, L, V] holds log q_d for depths 1..L from one drafter pass. Only the best min(budget, V)
    tokens of each depth can be used. On CUDA one Triton kernel selects the tree (`triton_kernels`); elsewhere
    the reference construction runs on the host, where a heap costs less than many small tensor operations.
    Nodes come in depth order (parents first); trees with fewer prefixes than `budget` are padded with
    invalid nodes. `top`: `top_k(logprobs, k)` for some k >= min(budget, V), when already computed; `out`: a
    tree of this size to write into (the kernel writes there directly); `paths` [B, N+1, D]: filled with the
    tree's `root_paths` (for recurrent layers; on CUDA by the ancestor relation's own launch).
    """
    batch, depth_limit, vocab = logprobs.shape
    width = min(budget, vocab)
    top_logp, top_tokens = top if top is not None else top_k(logprobs, width)
    top_logp, top_tokens = top_logp[..., :width], top_tokens[..., :width]
    kernels = ops.triton_kernels_for(logprobs)
    if kernels is not None:
        if out is None:
            out = TreeBatch.empty(batch, budget, logprobs.device)
        kernels.best_first_tree(root, top_logp, top_tokens, budget, out, paths)
        return out
    rows = [
        heap_tree(logp, tokens, budget)
        for logp, tokens in zip(top_logp.tolist(), top_tokens.tolist(), strict=True)
    ]
    device = logprobs.device
    pad = [[0] * (budget - len(row[0])) for row in rows]
    tree_parents = torch.tensor([[0, *row[1], *p] for row, p in zip(rows, pad, strict=True)], device=device)
    tree = TreeBatch(
        tokens=torch.tensor(
            [[r, *row[0], *p] for r, row, p in zip(root.tolist(), rows, pad, strict=True)], device=device
        ),
        parents=tree_parents,
        depths=torch.tensor([[0, *row[2], *p] for row, p in zip(rows, pad, strict=True)], device=device),
        valid=torch.tensor(
            [[True] * (1 + len(row[0])) + [False] * len(p) for row, p in zip(rows, pad, strict=True)],
            device=device,
        ),
        ancestors=ancestor_matrix(tree_parents, depth_limit),
    )
    if paths is not None:
        paths.copy_(root_paths(tree.ancestors, paths.shape[-1]))
    if out is None:
        return tree
    out.copy_(tree)
    return out


def heap_tree(
    top_logp: list[list[float]], top_tokens: list[list[int]], budget: int
) -> tuple[list[int], list[int], list[int]]:
    """DDTree's best-first construction for one row: (tokens, parents, depths) of nodes 1..N in depth order.

    A heap holds candidates scored by the sum of log q along their path; popping one adds it to the tree
    and pushes its next sibling (same parent, next-ranked token) and its first child (next depth, best
    token). Pops come out best first, so parents precede children; nodes are then sorted by depth.
    """
    depth_limit, width = len(top_logp), len(top_logp[0])
    nodes: list[tuple[int, int, int]] = []  # (token, parent, depth); parent 0 is the root
    heap = [(-top_logp[0][0], 0, 1, 0, 0, 0.0)]  # (-score, order, depth, rank, parent, parent score)
    order = 1
    while heap and len(nodes) < budget:
        neg_score, _, depth, rank, parent, parent_score = heapq.heappop(heap)
        nodes.append((top_tokens[depth - 1][rank], parent, depth))
        node, score = len(nodes), -neg_score
        if rank + 1 < width:
            sibling = -(parent_score + top_logp[depth - 1][rank + 1])
            heapq.heappush(heap, (sibling, order, depth, rank + 1, parent, parent_score))
            order += 1
        if depth < depth_limit:
            heapq.heappush(heap, (-(score + top_logp[depth][0]), order, depth + 1, 0, node, score))
            order += 1
    # renumber in depth order (stable, so parents, popped earlier, still precede their children)
    by_depth = sorted(range(len(nodes)), key=lambda i: nodes[i][2])
    new_index = {old + 1: new + 1 for new, old in enumerate(by_depth)}
    new_index[0] = 0
    return (
        [nodes[i][0] for i in by_depth],
        [new_index[nodes[i][1]] for i in by_depth],
        [nodes[i][2] for i in by_depth],
    )


@dataclass
class Acceptance:
    path: torch.Tensor  # [B, L+1] accepted indices by depth (root first); entries past `length` are 0
    length: torch.Tensor  # [B] accepted indices, the root included: the tokens this step commits
    bonus: torch.Tensor  # [B] the target's token after the last accepted index (the next root)


def walk(
    tree: TreeBatch, target_tokens: torch.Tensor, depth_limit: int, out: Acceptance | None = None
) -> Acceptance:
    """Walk from the root into the child whose token is the target's token at the current index.

    target_tokens [B, N+1] is the target's token (argmax, or its own sample) after each index; only those
    along the walk matter, so each committed token comes from the target's conditional, which is what
    makes the walk lossless at any temperature. Siblings carry distinct tokens, so the accepted indices
    form one path: every index whose ancestors all match. `out`: buffers to write the result into (on CUDA
    one Triton launch does the whole walk there, `triton_step.walk`).
    """
    kernels = ops.step_kernels_for(target_tokens)
    if kernels is not None:
        if out is None:
            batch = target_tokens.shape[0]
            out = Acceptance(
                path=target_tokens.new_empty(batch, depth_limit + 1),
                length=target_tokens.new_empty(batch),
                bonus=target_tokens.new_empty(batch),
            )
        kernels.walk(tree.tokens, tree.parents, tree.depths, tree.valid, tree.ancestors, target_tokens,
                     out.path, out.length, out.bonus)  # fmt: skip
        return out
    acceptance = _walk(tree, target_tokens, depth_limit)
    if out is None:
        return acceptance
    for name in ("path", "length", "bonus"):
        getattr(out, name).copy_(getattr(acceptance, name))
    return out


def _walk(tree: TreeBatch, target_tokens: torch.Tensor, depth_limit: int) -> Acceptance:
    """`walk` in torch operations."""
    if tree.size == 0:  # the root alone (AR): it commits itself, and the target's token after it is next
        path = torch.zeros(tree.tokens.shape[0], depth_limit + 1, dtype=torch.long, device=tree.tokens.device)
        return Acceptance(path=path, length=torch.ones_like(target_tokens[:, 0]), bonus=target_tokens[:, 0])
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


def top_k(logprobs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each depth's `k` best float32 log-probabilities, descending, and their tokens."""
    top = torch.topk(logprobs.float(), k, dim=-1)
    return top.values, top.indices


def expected_accept_lengths(
    logprobs: torch.Tensor, budgets: list[int], top: tuple[torch.Tensor, torch.Tensor] | None = None
) -> torch.Tensor:
    """[B, len(budgets)]: the tokens a step is expected to commit (the root included) with the best-first
    tree of each budget, were the target to follow the draft marginals: 1 + the sum of its nodes' path
    probabilities. One pass serves every budget, as each tree is a prefix of the largest one.

    logprobs [B, L, V] as for `best_first_tree`. Fixed-shape device work (no host synchronisation; on CUDA
    one Triton kernel after the top-k, as the tree's own selection, instead of three operations per depth). Exact:
    the marginals of a depth are shared by every parent there, so a prefix among the best K of its depth
    extends one among the best K of the depth above (any of those K beats its parent, and so each has a child
    that beats it); the best K of each depth, merged, hold the best K overall. `top` as for `best_first_tree`.
    """
    batch, depth_limit, vocab = logprobs.shape
    largest = max(budgets)
    width = min(largest, vocab)
    top = (top if top is not None else top_k(logprobs, width))[0][..., :width]  # [B, L, W] best first
    kernels = ops.triton_kernels_for(logprobs)
    if kernels is not None:  # the same selection in one launch, not three per depth
        return kernels.expected_accept_lengths(top, budgets)
    level = top[:, 0]
    levels = [level]
    for depth in range(1, depth_limit):
        children = (level[:, :, None] + top[:, depth, None, :]).flatten(1)
        level = torch.topk(children, min(largest, children.shape[1]), dim=-1).values
        levels.append(level)
    merged = torch.cat(levels, dim=1)
    best = torch.topk(merged, min(largest, merged.shape[1]), dim=-1).values.exp().cumsum(dim=-1)
    # column slices, not an index tensor: nothing is copied from the host (a CUDA graph can capture this)
    return 1 + torch.stack([best[:, min(b, best.shape[1]) - 1] for b in budgets], dim=1)


def node_scores(tree: TreeBatch, logprobs: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """[B, N+1] float32: each node's path score, the sum of log q_d of the tokens from the root's child to it (the
    order of the best-first construction: a budget's tree holds the best `budget` of them); -inf at the root
    and at padding. logprobs [B, L, V] as for `best_first_tree`. Fixed-shape device work (a CUDA graph can
    capture it)."""
    vocab = logprobs.shape[-1]
    own = (tree.depths - 1).clamp(min=0) * vocab + tree.tokens  # each node's (depth, token) in the draft
    logq = torch.where(tree.depths > 0, logprobs.float().flatten(1).gather(1, own), 0.0)
    scores = torch.bmm(tree.ancestors.float(), logq[..., None])[..., 0]  # its own and its ancestors' log q
    scores = torch.where(tree.valid & (tree.depths > 0), scores, float("-inf"))
    if out is None:
        return scores
    return out.copy_(scores)


def realised_accept_lengths(
    scores: torch.Tensor, path: torch.Tensor, length: torch.Tensor, budgets: list[int]
) -> torch.Tensor:
    """[B, len(budgets)]: the tokens each row would have committed had its step verified the best-first tree of
    each budget, from the step it ran: a smaller budget's tree is the best-scored prefix of this one, and a
    node's ancestors score above it, so the walk there follows this step's accepted path as far as the path's
    nodes are among that budget's best scores. NaN for budgets above this tree's size (nothing tells what a
    larger tree would have accepted). `scores` [B, N+1]: `node_scores` of this step's tree; `path` [B, L+1]
    and `length` [B]: its `Acceptance`. Exact up to ties between path scores (a node tied with the last one a
    budget keeps may be counted in or out)."""
    size = scores.shape[1] - 1
    ranked = scores[:, 1:].sort(dim=1, descending=True).values  # [B, N] best first (padding last)
    cut = ranked[:, [min(b, size) - 1 for b in budgets]]  # [B, NB] the lowest score each budget keeps
    depth = torch.arange(1, path.shape[1], device=path.device)
    on_path = depth[None, :] < length[:, None]  # depths 1 .. length-1 were accepted
    along = scores.gather(1, path)[:, 1:]  # [B, L] the path's scores by depth
    kept = (along[:, None, :] >= cut[:, :, None]) & on_path[:, None, :]
    counts = 1.0 + kept.sum(dim=-1).float()
    above = torch.tensor([b > size for b in budgets], device=scores.device)
    return torch.where(above[None, :], float("nan"), counts)
