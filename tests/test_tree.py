import itertools
import math

import torch

from specdeploy.engine.tree import DraftTree, accept_path, best_first_tree, chain_tree


def paths_of(tree: DraftTree) -> set[tuple[int, ...]]:
    paths = []
    for node in range(1, tree.size + 1):
        path, i = [], node
        while i:
            path.append(tree.tokens[i - 1])
            i = tree.parents[i - 1]
        paths.append(tuple(reversed(path)))
    return set(paths)


def brute_force_best(logprobs: torch.Tensor, budget: int) -> set[tuple[int, ...]]:
    depth, vocab = logprobs.shape
    scored = []
    for d in range(1, depth + 1):
        for prefix in itertools.product(range(vocab), repeat=d):
            scored.append((sum(float(logprobs[i, t]) for i, t in enumerate(prefix)), prefix))
    scored.sort(reverse=True)
    return {prefix for _, prefix in scored[:budget]}


def test_best_first_tree_keeps_the_highest_probability_prefixes():
    gen = torch.Generator().manual_seed(0)
    for budget in (1, 3, 7, 20, 40):
        logprobs = torch.log_softmax(torch.randn(4, 5, generator=gen) * 2, dim=-1)
        tree = best_first_tree(logprobs, budget)
        assert tree.size == budget
        assert paths_of(tree) == brute_force_best(logprobs, budget)
        # parents precede children and depths are consistent
        for node, (parent, depth) in enumerate(zip(tree.parents, tree.depths, strict=True), start=1):
            assert parent < node
            assert depth == (tree.depths[parent - 1] + 1 if parent else 1)


def test_best_first_tree_is_capped_by_the_number_of_prefixes():
    logprobs = torch.log_softmax(torch.randn(2, 3), dim=-1)
    assert best_first_tree(logprobs, 100).size == 3 + 9


def test_ancestor_mask_sees_exactly_self_and_ancestors():
    tree = DraftTree(tokens=[5, 6, 7, 8], parents=[0, 0, 1, 3], depths=[1, 1, 2, 3])
    mask = tree.ancestor_mask()
    expected = {0: {0}, 1: {0, 1}, 2: {0, 2}, 3: {0, 1, 3}, 4: {0, 1, 3, 4}}
    for i, visible in expected.items():
        assert set(torch.nonzero(mask[i]).flatten().tolist()) == visible


def test_accept_path_walks_matching_children_and_returns_the_bonus():
    tree = DraftTree(tokens=[5, 6, 7, 8], parents=[0, 0, 1, 3], depths=[1, 1, 2, 3])
    target = {0: 5, 1: 7, 3: 9}
    path, bonus = accept_path(tree, target.__getitem__)
    assert path == [0, 1, 3] and bonus == 9
    path, bonus = accept_path(tree, {0: 6, 2: 1}.__getitem__)
    assert path == [0, 2] and bonus == 1
    path, bonus = accept_path(chain_tree([]), {0: 4}.__getitem__)
    assert path == [0] and bonus == 4


def test_chain_tree_is_a_single_path():
    tree = chain_tree([3, 1, 4])
    assert tree.parents == [0, 1, 2] and tree.depths == [1, 2, 3]
    assert paths_of(tree) == {(3,), (3, 1), (3, 1, 4)}
    assert math.isclose(float(tree.ancestor_mask().sum()), 1 + 2 + 3 + 4)
