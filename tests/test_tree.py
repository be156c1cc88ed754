"""Device draft trees against independent oracles: brute-force enumeration, the DDTree heap, a host walk."""

import itertools
import math
import random

import pytest
import torch
from tree_oracle import DraftTree, accept_path, certify_best_first, tree_from_batch

from specdeploy.engine.tree import (
    ancestor_matrix,
    best_first_tree,
    chain_tree,
    expected_accept_lengths,
    node_scores,
    realised_accept_lengths,
    top_k,
    walk,
)


def brute_force_best(logprobs: torch.Tensor, budget: int) -> set[tuple[int, ...]]:
    depth, vocab = logprobs.shape
    scored = []
    for d in range(1, depth + 1):
        for prefix in itertools.product(range(vocab), repeat=d):
            scored.append((sum(float(logprobs[i, t]) for i, t in enumerate(prefix)), prefix))
    scored.sort(reverse=True)
    return {prefix for _, prefix in scored[:budget]}


def device_tree(logprobs: torch.Tensor, budget: int) -> DraftTree:
    return tree_from_batch(best_first_tree(torch.tensor([7]), logprobs[None], budget))


def assert_well_formed(tree: DraftTree) -> None:
    for node, (parent, depth) in enumerate(zip(tree.parents, tree.depths, strict=True), start=1):
        assert parent < node
        assert depth == (tree.depths[parent - 1] + 1 if parent else 1)


def test_best_first_tree_keeps_the_highest_probability_prefixes():
    gen = torch.Generator().manual_seed(0)
    for budget in (1, 3, 7, 20, 40):
        logprobs = torch.log_softmax(torch.randn(4, 5, generator=gen) * 2, dim=-1)
        tree = device_tree(logprobs, budget)
        assert tree.size == budget
        assert tree.paths() == brute_force_best(logprobs, budget)
        certify_best_first(tree, logprobs, budget)
        assert_well_formed(tree)


def test_best_first_tree_is_optimal_on_a_realistic_shape():
    gen = torch.Generator().manual_seed(1)
    for budget in (16, 64, 256):
        logprobs = torch.log_softmax(torch.randn(15, 3000, generator=gen) * 3, dim=-1)
        tree = device_tree(logprobs, budget)
        certify_best_first(tree, logprobs, budget)
        assert_well_formed(tree)


def test_ties_keep_the_tree_prefix_closed():
    """A confident drafter's log q is exactly 0 in float32 at many depths: parents must still come first."""
    logprobs = torch.full((6, 10), -1e4)
    logprobs[:, 0] = 0.0
    logprobs[2, 1] = 0.0  # two exact ties at depth 3
    for budget in (3, 6, 9):
        tree = device_tree(logprobs, budget)
        assert_well_formed(tree)
        certify_best_first(tree, logprobs, budget)


def brute_force_expected(logprobs: torch.Tensor, budget: int) -> float:
    """1 + the summed path probabilities of the `budget` most probable prefixes, by enumeration."""
    depth, vocab = logprobs.shape
    scores = sorted(
        (
            sum(float(logprobs[i, t]) for i, t in enumerate(prefix))
            for d in range(1, depth + 1)
            for prefix in itertools.product(range(vocab), repeat=d)
        ),
        reverse=True,
    )
    return 1 + sum(math.exp(s) for s in scores[:budget])


def test_expected_accept_lengths_sum_the_best_prefixes_of_every_budget():
    """Every prefix budget at once, against enumeration of all prefixes (budgets past the count of prefixes
    sum them all), rows independent, and the sum over the engine's own tree on a realistic shape."""
    gen = torch.Generator().manual_seed(3)
    logprobs = torch.log_softmax(torch.randn(3, 4, 5, generator=gen) * 2, dim=-1)
    budgets = [1, 2, 5, 16, 64, 1000]
    got = expected_accept_lengths(logprobs, budgets)
    for row in range(3):
        want = [brute_force_expected(logprobs[row], b) for b in budgets]
        assert got[row].tolist() == pytest.approx(want, rel=1e-5)
    wide = torch.log_softmax(torch.randn(15, 3000, generator=gen) * 3, dim=-1)
    tree = device_tree(wide, 64)
    path_logp = {0: 0.0}
    for node, (token, parent) in enumerate(zip(tree.tokens, tree.parents, strict=True), start=1):
        path_logp[node] = path_logp[parent] + float(wide[tree.depths[node - 1] - 1, token])
    want = 1 + sum(math.exp(v) for node, v in path_logp.items() if node)
    assert float(expected_accept_lengths(wide[None], [64])[0, 0]) == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_a_step_tells_what_every_smaller_budget_would_have_accepted(seed: int):
    """`realised_accept_lengths` from one step's tree and walk against walking each smaller budget's own tree
    (built anew) under the same target: a target that follows a fixed sequence drawn from the draft, so that
    paths run deep and part at every depth. Budgets above the tree's size are unknown (NaN)."""
    gen = torch.Generator().manual_seed(seed)
    rows, depths, vocab, size = 16, 6, 9, 32
    logprobs = torch.log_softmax(torch.randn(rows, depths, vocab, generator=gen) * 2.5, dim=-1)
    sequence = torch.multinomial(logprobs.exp().flatten(0, 1), 1, generator=gen).view(rows, depths)
    sequence = torch.cat([sequence, torch.zeros(rows, 1, dtype=torch.long)], dim=1)  # after the deepest node
    root = torch.zeros(rows, dtype=torch.long)

    def walked(budget: int):
        tree = best_first_tree(root, logprobs, budget)
        return tree, walk(tree, sequence.gather(1, tree.depths), depths)  # the target's token after each node

    tree, acceptance = walked(size)
    budgets = [1, 2, 3, 5, 8, 13, 32, 64]
    got = realised_accept_lengths(node_scores(tree, logprobs), acceptance.path, acceptance.length, budgets)
    for column, budget in enumerate(budgets):
        if budget > size:
            assert got[:, column].isnan().all()
            continue
        assert got[:, column].tolist() == walked(budget)[1].length.float().tolist(), budget
    assert got[:, budgets.index(32)].tolist() == acceptance.length.float().tolist()
    assert len(set(got[:, budgets.index(3)].tolist())) > 1 and got[:, -2].max() > 3  # paths of many lengths


def test_best_first_tree_pads_when_there_are_fewer_prefixes_than_the_budget():
    logprobs = torch.log_softmax(torch.randn(2, 3), dim=-1)
    batch = best_first_tree(torch.tensor([1]), logprobs[None], 20)
    assert batch.size == 20 and int(batch.valid.sum()) == 1 + 3 + 9
    assert tree_from_batch(batch).paths() == brute_force_best(logprobs, 12)


def test_ancestor_matrix_sees_exactly_self_and_ancestors():
    tree = DraftTree(tokens=[5, 6, 7, 8], parents=[0, 0, 1, 3], depths=[1, 1, 2, 3])
    got = ancestor_matrix(torch.tensor([[0, *tree.parents]]), depth_limit=3)[0]
    assert torch.equal(got, tree.ancestor_mask())


@pytest.mark.parametrize("seed", range(20))
def test_walk_agrees_with_the_host_walk_on_random_trees(seed: int):
    rng = random.Random(seed)
    tokens, parents, depths = [], [], []
    for node in range(1, 13):
        parent = rng.randrange(0, node)
        siblings = {t for t, p in zip(tokens, parents, strict=True) if p == parent}
        tokens.append(rng.choice([t for t in range(6) if t not in siblings] or [99]))
        parents.append(parent)
        depths.append(depths[parent - 1] + 1 if parent else 1)
    tree = DraftTree(tokens, parents, depths)
    depth_limit = max(depths)
    target = [rng.randrange(6) for _ in range(tree.size + 1)]
    path, bonus = accept_path(tree, target.__getitem__)
    got = walk(tree.batch(9, depth_limit), torch.tensor([target]), depth_limit)
    assert got.length.item() == len(path) and got.bonus.item() == bonus
    assert got.path[0, : len(path)].tolist() == path


def test_walk_over_a_chain_and_an_empty_tree():
    chain = chain_tree(torch.tensor([4]), torch.tensor([[3, 1, 4]]))
    got = walk(chain, torch.tensor([[3, 1, 5, 9]]), depth_limit=3)
    assert got.path.tolist() == [[0, 1, 2, 0]] and got.length.item() == 3 and got.bonus.item() == 5
    empty = chain_tree(torch.tensor([4]), torch.zeros(1, 0, dtype=torch.long))
    got = walk(empty, torch.tensor([[8]]), depth_limit=0)
    assert got.length.item() == 1 and got.bonus.item() == 8


def test_padding_nodes_are_never_accepted():
    logprobs = torch.log_softmax(torch.tensor([[0.0, 5.0]]), dim=-1)  # one depth, two tokens
    tree = best_first_tree(torch.tensor([0]), logprobs[None], 4)  # two real nodes, two padding
    target = torch.zeros(1, 5, dtype=torch.long)  # token 0 everywhere: a padding node also holds token 0
    got = walk(tree, target, depth_limit=1)
    assert got.length.item() == 2 and tree.tokens[0, got.path[0, 1]].item() == 0
    assert bool(tree.valid[0, got.path[0, 1]])


def test_a_wider_top_k_given_to_the_tree_and_the_prediction_changes_neither():
    """The engine selects each depth's best tokens once, as wide as its largest budget, for the tree of a
    smaller budget and the prediction of every budget: the same as each selecting its own (no ties here)."""
    gen = torch.Generator().manual_seed(5)
    logprobs = torch.log_softmax(torch.randn(2, 6, 40, generator=gen) * 2, dim=-1)
    root, wide = torch.tensor([1, 2]), top_k(logprobs, 32)
    got, want = best_first_tree(root, logprobs, 8, wide), best_first_tree(root, logprobs, 8)
    for name in ("tokens", "parents", "depths", "valid", "ancestors"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    budgets = [1, 4, 16]
    assert torch.equal(
        expected_accept_lengths(logprobs, budgets, wide), expected_accept_lengths(logprobs, budgets)
    )
