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
from specdeploy.engine.models.gated_delta_rule import RuleInputs, chunked_rule, tree_rule
from specdeploy.engine.recurrent_state import conv_windows
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


def positions(start: int, count: int) -> torch.Tensor:
    return torch.arange(start, start + count)[None]


def random_tree(size: int, seed: int) -> DraftTree:
    rng = random.Random(seed)
    tokens, parents, depths = [], [], []
    for node in range(1, size + 1):
        parent = rng.randrange(0, node)
        tokens.append(rng.randrange(VOCAB))
        parents.append(parent)
        depths.append(depths[parent - 1] + 1 if parent else 1)
    return DraftTree(tokens, parents, depths)


def path_to(tree: DraftTree, node: int) -> list[int]:
    path = [node]
    while path[-1]:
        path.append(tree.parents[path[-1] - 1])
    return path[::-1]


def verify_tree(model, cache, root: int, tree: DraftTree) -> torch.Tensor:
    prefix = cache.length
    ids = torch.tensor([[root, *tree.tokens]])
    pos = prefix + torch.tensor([[0, *tree.depths]])
    visible = torch.ones(tree.size + 1, prefix, dtype=torch.bool)
    mask = torch.cat([visible, tree.ancestor_mask()], dim=1)[None]
    return model(ids, pos, cache, mask).logits[0]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers_prefill_and_incremental(checkpoints, name):
    cls, _ = CONFIGS[name]
    hf = cls.from_pretrained(checkpoints[name]).eval()
    ours = load_target(checkpoints[name])
    ids = torch.randint(0, VOCAB, (1, 90), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = hf(ids).logits
    # 90 tokens run the chunked form; the cached run mixes a chunked prefill, a short chain and single tokens.
    assert torch.allclose(ours(ids, positions(0, 90)).logits, expected, atol=1e-4, rtol=0)
    cache = ours.new_cache()
    pieces = [ours(ids[:, :70], positions(0, 70), cache).logits]
    pieces.append(ours(ids[:, 70:80], positions(70, 10), cache).logits)
    for t in range(80, 90):
        pieces.append(ours(ids[:, t : t + 1], positions(t, 1), cache).logits)
    assert torch.allclose(torch.cat(pieces, dim=1), expected, atol=1e-4, rtol=0)
    assert cache.length == 90


def test_every_tree_node_equals_a_causal_forward_over_its_path(target):
    prefix = torch.randint(0, VOCAB, (1, 11), generator=torch.Generator().manual_seed(4)).tolist()[0]
    root = 7
    for seed in range(3):
        tree = random_tree(14, seed)
        cache = target.new_cache()
        target(torch.tensor([prefix]), positions(0, len(prefix)), cache)
        logits = verify_tree(target, cache, root, tree)
        for node in range(tree.size + 1):
            sequence = prefix + [root] + [tree.tokens[i - 1] for i in path_to(tree, node)[1:]]
            expected = target(torch.tensor([sequence]), positions(0, len(sequence))).logits[0, -1]
            assert torch.allclose(logits[node], expected, atol=1e-5, rtol=0), (seed, node)


def test_leaky_order_breaks_branches_but_not_chains(target):
    prefix, root = [3, 9, 27, 17, 51], 5
    tree = random_tree(10, seed=1)
    chain = DraftTree([11, 12, 13], [0, 1, 2], [1, 2, 3])
    results = {}
    for leaky in (False, True):
        target.use_leaky_tree_states(leaky)
        for name, shape in (("tree", tree), ("chain", chain)):
            cache = target.new_cache()
            target(torch.tensor([prefix]), positions(0, len(prefix)), cache)
            results[leaky, name] = verify_tree(target, cache, root, shape)
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
    cache = target.new_cache()
    target(torch.tensor([prefix]), positions(0, len(prefix)), cache)
    verify_tree(target, cache, root, tree)
    leaf = max(range(1, tree.size + 1), key=lambda n: tree.depths[n - 1])
    path = path_to(tree, leaf)
    cache.keep(torch.cat([torch.arange(len(prefix)), len(prefix) + torch.tensor(path)]))
    committed = prefix + [root] + [tree.tokens[i - 1] for i in path[1:]]
    assert cache.length == len(committed)
    # Continue with a second tree on top of the compacted cache, then a plain chain.
    second = random_tree(6, seed=6)
    logits = verify_tree(target, cache, 30, second)
    sequence = committed + [30] + [second.tokens[i - 1] for i in path_to(second, 6)[1:]]
    expected = target(torch.tensor([sequence]), positions(0, len(sequence))).logits[0, -1]
    assert torch.allclose(logits[6], expected, atol=1e-5, rtol=0)
    cache.keep(torch.arange(len(committed) + 1))  # only the root of the second tree
    follow = [4, 44, 21]
    out = target(torch.tensor([follow]), positions(cache.length, 3), cache).logits
    sequence = committed + [30] + follow
    fresh = target(torch.tensor([sequence]), positions(0, len(sequence))).logits[:, -3:]
    assert torch.allclose(out, fresh, atol=1e-5, rtol=0)


def test_crop_within_the_pending_chain_and_clear_errors(target):
    tokens = [5, 6, 7, 8, 9, 10]
    cache = target.new_cache()
    target(torch.tensor([tokens[:2]]), positions(0, 2), cache)
    target(torch.tensor([tokens[2:]]), positions(2, 4), cache)
    cache.crop(4)  # commits the state after token 3 of the pending chain
    out = target(torch.tensor([[50]]), positions(4, 1), cache).logits
    fresh = target(torch.tensor([tokens[:4] + [50]]), positions(0, 5)).logits[:, -1:]
    assert torch.allclose(out, fresh, atol=1e-5, rtol=0)
    with pytest.raises(SpecdeployError, match="cannot crop a recurrent layer"):
        cache.crop(2)

    tree = random_tree(5, seed=2)
    verify_tree(target, cache, 1, tree)
    with pytest.raises(SpecdeployError, match="keep\\(\\) its accepted path"):
        target(torch.tensor([[3]]), positions(cache.length, 1), cache)
    not_a_path = [i for i in range(1, tree.size + 1) if tree.parents[i - 1] != 0][:1]
    with pytest.raises(SpecdeployError, match="path of the verified tree"):
        cache.keep(torch.cat([torch.arange(5), 5 + torch.tensor(not_a_path)]))
    with pytest.raises(SpecdeployError, match="only drop uncommitted"):
        cache.keep(torch.tensor([0, 1, 2, 4, 5]))

    fresh_cache = target.new_cache()
    target(torch.tensor([tokens]), positions(0, 6), fresh_cache)
    sibling_sees_sibling = torch.tensor([[[True] * 6 + [True, False, False], [True] * 6 + [True, True, False],
                                          [True] * 6 + [False, True, True]]])  # fmt: skip
    with pytest.raises(SpecdeployError, match="not a tree"):
        target(torch.tensor([[1, 2, 3]]), positions(6, 3), fresh_cache, sibling_sees_sibling)


def test_crop_inside_a_chunked_prefill_replays_the_kept_tokens(target):
    tokens = torch.randint(0, VOCAB, (1, 70), generator=torch.Generator().manual_seed(8))
    cache = target.new_cache()
    target(
        tokens, positions(0, 70), cache
    )  # long enough for the chunked form, which keeps no per-token state
    cache.crop(66)
    out = target(tokens[:, 66:70], positions(66, 4), cache).logits
    fresh = target(tokens, positions(0, 70)).logits[:, 66:]
    assert torch.allclose(out, fresh, atol=1e-4, rtol=0)


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
    batch, heads, tokens, key_dim, value_dim = 1, 2, 150, 8, 4

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator)

    key = torch.nn.functional.normalize(rand(batch, heads, tokens, key_dim), dim=-1)
    inputs = RuleInputs(
        query=rand(batch, heads, tokens, key_dim) * key_dim**-0.5,
        key=key,
        value=rand(batch, heads, tokens, value_dim),
        decay=-torch.rand(batch, heads, tokens, generator=generator),
        beta=torch.rand(batch, heads, tokens, generator=generator),
    )
    initial = rand(batch, heads, key_dim, value_dim)
    chained, states = tree_rule(inputs, list(range(-1, tokens - 1)), initial)
    chunked, final = chunked_rule(inputs, initial)
    assert torch.allclose(chunked, chained, atol=1e-4)
    assert torch.allclose(final, states[:, :, -1], atol=1e-4)


def test_conv_windows_follow_each_token_path_then_the_committed_inputs():
    # Committed inputs are columns 0..2 (width 4); new tokens are columns 3.., token 2 is a child of token 0.
    windows = conv_windows([-1, 0, 0, 2], width=4, device=torch.device("cpu"))
    assert windows.tolist() == [[0, 1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 5], [2, 3, 5, 6]]
