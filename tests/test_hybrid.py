"""Hybrid targets (Qwen3-Next, Qwen3.5): agreement with transformers and exact tree verification with GDN state."""

from __future__ import annotations

import random

import pytest
import torch
from hybrid_helpers import CONFIGS, VOCAB, write_drafter, write_target
from transformers import Qwen3NextForCausalLM
from tree_oracle import DraftTree

from specdeploy.engine.decode import Decoder, SamplingParams
from specdeploy.engine.loading import load_drafter, load_target
from specdeploy.engine.models.gated_delta_rule import chain_rule, chunked_rule, replay, rule_inputs, tree_rule
from specdeploy.engine.recurrent_state import conv_windows
from specdeploy.engine.single_pass import target_pass
from specdeploy.engine.tree import root_paths
from specdeploy.errors import SpecdeployError


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")
    paths = {name: write_target(name, root / name, seed) for seed, name in enumerate(CONFIGS)}
    paths["draft"] = write_drafter(root / "draft")
    return paths


@pytest.fixture(scope="module")
def target(checkpoints):
    return load_target(checkpoints["qwen3_next"])


def random_tree(size: int, seed: int, chain: float = 0.0) -> DraftTree:
    """Parents drawn uniformly among earlier nodes, or with probability `chain` the node just before (deep trees)."""
    rng = random.Random(seed)
    tokens, parents, depths = [], [], []
    for node in range(1, size + 1):
        parent = node - 1 if rng.random() < chain else rng.randrange(0, node)
        tokens.append(rng.randrange(VOCAB))
        parents.append(parent)
        depths.append(depths[parent - 1] + 1 if parent else 1)
    return DraftTree(tokens, parents, depths)


def path_to(tree: DraftTree, node: int) -> list[int]:
    path = [node]
    while path[-1]:
        path.append(tree.parents[path[-1] - 1])
    return path[::-1]


def new_cache(model):
    return model.new_cache(1, 256, tree_tokens=32)


def run_chain(model, cache, ids: list[int] | torch.Tensor, start: int) -> torch.Tensor:
    """Logits [T, V] of `ids` after `start` committed positions, committed at once (a prefill chunk)."""
    ids = torch.as_tensor(ids).reshape(1, -1)
    positions = torch.arange(start, start + ids.shape[1])[None]
    return target_pass(model, ids, positions, cache, cached=start)[0][0]


def fresh_logits(model, ids: list[int]) -> torch.Tensor:
    return run_chain(model, None, ids, 0)


def verify_tree(model, cache, prefix: int, root: int, tree: DraftTree) -> torch.Tensor:
    """Logits [N+1, V] of [root, tree nodes] after `prefix` committed positions, under the ancestor mask."""
    ids = torch.tensor([[root, *tree.tokens]])
    pos = prefix + torch.tensor([[0, *tree.depths]])
    mask = torch.cat([torch.ones(tree.size + 1, prefix, dtype=torch.bool), tree.ancestor_mask()], dim=1)[None]
    return target_pass(model, ids, pos, cache, cached=prefix, mask=mask)[0][0]


def keep_path(model, cache, prefix: int, path: list[int]) -> None:
    """Commit the verified tree's path (indices, root first): attention entries move into place, recurrent
    layers replay it."""
    index = torch.tensor([path])
    cache.keep_path(index, torch.tensor([len(path)]), torch.tensor([prefix]))
    model.commit_tree(cache, index, torch.tensor([len(path)]))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers_prefill_and_incremental(checkpoints, name):
    cls, _ = CONFIGS[name]
    hf = cls.from_pretrained(checkpoints[name]).eval()
    ours = load_target(checkpoints[name])
    ids = torch.randint(0, VOCAB, (1, 90), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = hf(ids).logits[0]
    # 90 tokens run the chunked form; the cached run mixes a chunked prefill, a short chain and single tokens.
    assert torch.allclose(fresh_logits(ours, ids), expected, atol=1e-4, rtol=0)
    cache = new_cache(ours)
    pieces = [run_chain(ours, cache, ids[:, :70], 0), run_chain(ours, cache, ids[:, 70:80], 70)]
    for t in range(80, 90):
        pieces.append(run_chain(ours, cache, ids[:, t : t + 1], t))
    assert torch.allclose(torch.cat(pieces), expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize(("name", "projections"), [("qwen3_next", 2), ("qwen3_next_moe", 2), ("qwen3_5", 4)])
def test_state_dict_gives_the_checkpoints_tensors_back(checkpoints, name, projections):
    """Qwen3-Next's projections are stored part by part, not per key head as checkpoints have them, and
    Qwen3.5's four as one: the state_dict (what random pairs and trained targets are saved from) must still be
    the checkpoint."""
    from safetensors.torch import load_file

    saved = {}
    for path in sorted(checkpoints[name].glob("*.safetensors")):
        saved |= load_file(path)
    ours = {k: v for k, v in load_target(checkpoints[name]).state_dict().items() if "in_proj" in k}
    assert len(ours) == projections * 3  # of each of the 3 linear-attention layers
    for key, value in ours.items():
        assert torch.equal(value, saved["model." + key]), key


def test_every_tree_node_equals_a_causal_forward_over_its_path(target):
    prefix = torch.randint(0, VOCAB, (11,), generator=torch.Generator().manual_seed(4)).tolist()
    root = 7
    for seed in range(3):
        tree = random_tree(14, seed)
        cache = new_cache(target)
        run_chain(target, cache, prefix, 0)
        logits = verify_tree(target, cache, len(prefix), root, tree)
        for node in range(tree.size + 1):
            sequence = prefix + [root] + [tree.tokens[i - 1] for i in path_to(tree, node)[1:]]
            expected = fresh_logits(target, sequence)[-1]
            assert torch.allclose(logits[node], expected, atol=1e-5, rtol=0), (seed, node)


def test_leaky_order_breaks_branches_but_not_chains(target):
    prefix, root = [3, 9, 27, 17, 51], 5
    tree = random_tree(10, seed=1)
    chain = DraftTree([11, 12, 13], [0, 1, 2], [1, 2, 3])
    results = {}
    for leaky in (False, True):
        target.use_leaky_tree_states(leaky)
        for name, shape in (("tree", tree), ("chain", chain)):
            cache = new_cache(target)
            run_chain(target, cache, prefix, 0)
            results[leaky, name] = verify_tree(target, cache, len(prefix), root, shape)
    target.use_leaky_tree_states(False)
    assert torch.equal(results[False, "chain"], results[True, "chain"])
    # A node whose predecessor in index order is not its parent absorbs a sibling under the leaky order.
    first_jump = next(i for i, p in enumerate(tree.parents, start=1) if p != i - 1)
    assert torch.equal(results[False, "tree"][:first_jump], results[True, "tree"][:first_jump])
    assert not torch.allclose(
        results[False, "tree"][first_jump], results[True, "tree"][first_jump], atol=1e-3
    )


def test_keeping_an_accepted_path_then_continuing_equals_a_fresh_forward(target):
    prefix, root = [8, 1, 60, 33, 2, 19, 40], 12
    tree = random_tree(16, seed=5)
    cache = new_cache(target)
    run_chain(target, cache, prefix, 0)
    verify_tree(target, cache, len(prefix), root, tree)
    leaf = max(range(1, tree.size + 1), key=lambda n: tree.depths[n - 1])
    path = path_to(tree, leaf)
    keep_path(target, cache, len(prefix), path)
    committed = prefix + [root] + [tree.tokens[i - 1] for i in path[1:]]
    # Continue with a second tree on top of the compacted cache, then a plain chain.
    second = random_tree(6, seed=6)
    logits = verify_tree(target, cache, len(committed), 30, second)
    sequence = committed + [30] + [second.tokens[i - 1] for i in path_to(second, 6)[1:]]
    assert torch.allclose(logits[6], fresh_logits(target, sequence)[-1], atol=1e-5, rtol=0)
    keep_path(target, cache, len(committed), [0])  # only the root of the second tree
    follow = [4, 44, 21]
    out = run_chain(target, cache, follow, len(committed) + 1)
    fresh = fresh_logits(target, committed + [30] + follow)[-3:]
    assert torch.allclose(out, fresh, atol=1e-5, rtol=0)


def test_a_row_that_keeps_nothing_keeps_its_state_and_a_tree_too_large_for_the_record_is_refused(target):
    prefix = [5, 6, 7, 8, 9, 10]
    cache = new_cache(target)
    run_chain(target, cache, prefix, 0)
    before = [t.clone() for t in cache.recurrent.tensors]
    verify_tree(target, cache, len(prefix), 1, random_tree(5, seed=2))
    target.commit_tree(cache, torch.tensor([[0, 1, 2]]), torch.tensor([0]))
    assert all(torch.equal(a, b) for a, b in zip(before, cache.recurrent.tensors, strict=True))
    with pytest.raises(SpecdeployError, match="exceeds the recurrent cache's record of 32"):
        verify_tree(target, cache, len(prefix), 1, random_tree(40, seed=3))
    sibling_sees_sibling = torch.tensor([[[True] * 6 + [True, False, False], [True] * 6 + [True, True, False],
                                          [True] * 6 + [False, True, True]]])  # fmt: skip
    with pytest.raises(SpecdeployError, match="not a tree"):
        target_pass(
            target, torch.tensor([[1, 2, 3]]), torch.tensor([[6, 7, 7]]), cache, 6, sibling_sees_sibling
        )
    hides_the_prefix = torch.ones(1, 1, 7, dtype=torch.bool)
    hides_the_prefix[0, 0, 2] = False
    with pytest.raises(SpecdeployError, match="cannot hide committed tokens"):
        target_pass(target, torch.tensor([[1]]), torch.tensor([[6]]), cache, 6, hides_the_prefix)


def test_greedy_decoding_is_the_same_in_every_mode_and_equals_transformers(checkpoints):
    target, drafter = load_target(checkpoints["qwen3_next"]), load_drafter(checkpoints["draft"])
    prompt = [3, 17, 9, 41, 5, 22, 8, 30, 2]
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    hf = Qwen3NextForCausalLM.from_pretrained(checkpoints["qwen3_next"]).eval()
    hf.generation_config.eos_token_id = None  # run all 40 tokens, as ignore_eos does
    with torch.no_grad():
        generated = hf.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)[0, len(prompt) :]
    ar = Decoder(target, mode="ar").generate(prompt, params)
    assert ar.token_ids == generated.tolist()
    for mode, budget in [("dflash", None), ("ddtree", 1), ("ddtree", 6), ("ddtree", 40)]:
        result = Decoder(target, drafter, mode, budget).generate(prompt, params)
        assert result.token_ids == ar.token_ids, (mode, budget)
        assert sum(result.accept_lengths) + 1 == len(result.token_ids)


def test_chunked_rule_equals_the_token_by_token_rule():
    generator = torch.Generator().manual_seed(0)
    batch, tokens, heads, key_dim, value_dim = 1, 150, 2, 8, 4

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    inputs = rule_inputs(
        rand(batch, tokens, heads, key_dim),
        rand(batch, tokens, heads, key_dim),
        rand(batch, tokens, heads, value_dim),
        -torch.rand(batch, tokens, heads, generator=generator),
        torch.rand(batch, tokens, heads, generator=generator),
    )
    initial = rand(batch, heads, key_dim, value_dim)
    chained, final_chained = chain_rule(inputs, initial)
    chunked, final = chunked_rule(inputs, initial)
    assert torch.allclose(chunked, chained, atol=1e-4)
    assert torch.allclose(final, final_chained, atol=1e-4)


@pytest.mark.parametrize("rows, tokens, chain", [(3, 9, 0.0), (2, 65, 0.0), (2, 65, 0.85)])
def test_tree_rule_runs_every_token_along_its_own_path_and_replay_reaches_the_same_state(
    rows: int, tokens: int, chain: float
) -> None:
    generator = torch.Generator().manual_seed(1)
    key_heads, heads, key_dim, value_dim = 1, 2, 8, 4
    trees = [random_tree(tokens - 1, seed, chain) for seed in range(rows)]
    ancestors = torch.stack([tree.ancestor_mask() for tree in trees])
    paths = root_paths(ancestors, tokens)
    for row, tree in enumerate(trees):  # against the tree's own parent links
        for node in range(tokens):
            own = path_to(tree, node)
            assert paths[row, node].tolist() == own + [-1] * (tokens - len(own))

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    raw = (rand(rows, tokens, key_heads, key_dim), rand(rows, tokens, key_heads, key_dim),
           rand(rows, tokens, heads, value_dim), -torch.rand(rows, tokens, heads, generator=generator),
           torch.rand(rows, tokens, heads, generator=generator))  # fmt: skip
    inputs = rule_inputs(*raw)
    initial = rand(rows, heads, key_dim, value_dim)
    out = tree_rule(inputs, paths, initial)
    for row, tree in enumerate(trees):
        for node in range(tokens):
            own = path_to(tree, node)  # the oracle: the plain chain rule over the node's path alone
            picked = rule_inputs(*(t[row : row + 1, own] for t in raw))
            chained, final = chain_rule(picked, initial[row : row + 1])
            assert torch.allclose(out[row, node], chained[0, -1], atol=1e-5), (row, node)
            state = initial[row : row + 1].clone()
            replay(state, *(t[row : row + 1] for t in raw[1:]), torch.tensor([own]), torch.tensor([len(own)]))
            assert torch.allclose(state, final, atol=1e-5), (row, node)


def test_conv_windows_follow_each_token_path_then_the_committed_inputs():
    # Committed inputs are columns 0..2 (width 4); new tokens are columns 3.., token 2 is a child of token 0.
    paths = torch.tensor([[[0, -1, -1], [0, 1, -1], [0, 2, -1], [0, 2, 3]]])
    windows = conv_windows(paths, width=4)
    assert windows.tolist() == [[[0, 1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 5], [2, 3, 5, 6]]]
