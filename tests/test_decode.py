"""The decoding loops: greedy equality across modes and with transformers, long accepted paths, lossless sampling."""

from __future__ import annotations

import contextlib
import time

import pytest
import torch
from decode_helpers import (
    SAMPLING,
    assert_sampling_is_lossless,
    chi_square_p,
    exact_three_token_distribution,
    sample_counts,
    write_pair,
)
from transformers import AutoModelForCausalLM

from specdeploy.engine import step as step_module
from specdeploy.engine.decode import Decoder, SamplingParams
from specdeploy.engine.loading import load_drafter, load_target
from specdeploy.engine.sampling import sample
from specdeploy.engine.step import StepRunner
from specdeploy.engine.tree import TreeBatch, ancestor_matrix, walk
from specdeploy.errors import SpecdeployError

FAMILIES = ["qwen3", "qwen3_moe", "deepseek_v3"]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")
    return {family: write_pair(root, family) for family in FAMILIES}


def loaded(pair):
    target_dir, draft_dir = pair
    return load_target(target_dir), load_drafter(draft_dir)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_mode_equals_ar_and_transformers_greedy(pairs, family):
    target, drafter = loaded(pairs[family])
    prompt = [3, 17, 9, 41, 5, 22, 8]
    params = SamplingParams(max_new_tokens=40)
    ar = Decoder(target, mode="ar").generate(prompt, params)
    hf = AutoModelForCausalLM.from_pretrained(pairs[family][0]).eval()
    with torch.no_grad():
        expected = hf.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)[0, len(prompt) :]
    assert ar.token_ids == expected.tolist()
    assert ar.accept_lengths == [1] * ar.num_steps
    for mode, budget in [("dflash", None), ("ddtree", 1), ("ddtree", 5), ("ddtree", 40)]:
        with forward_widths(target) as widths:
            result = Decoder(target, drafter, mode, budget).generate(prompt, params)
        assert result.token_ids == ar.token_ids, (mode, budget)
        assert sum(result.accept_lengths) + 1 == len(result.token_ids)
        # what the target was really given per verify step (after the prefill): DFlash verifies the root and
        # block_size - 1 drafts (SGLang: num-draft-tokens = block size), DDTree the root and its B nodes
        limit = drafter.block_size if mode == "dflash" else budget + 1
        assert widths[1:] == result.verified_lengths == [limit] * result.num_steps, (mode, budget)
    # A random drafter is (almost) never accepted, so the dflash row above can equal ar by committing the
    # target's own token every step. Here the chain holds known true tokens: the accept lengths are fixed in
    # advance, and the output must still be ar's.
    oracle = Decoder(target, drafter, "dflash")
    oracle.engine.runner = ChainOracleRunner(
        target, drafter, "dflash", None, truth=ar.token_ids, prompt_len=len(prompt)
    )
    chained = oracle.generate(prompt, params)
    assert chained.token_ids == ar.token_ids
    expected = [
        ChainOracleRunner.KEEP[step % len(ChainOracleRunner.KEEP)] + 1 for step in range(chained.num_steps)
    ]
    assert chained.accept_lengths[:-1] == expected[: chained.num_steps - 1]  # the last step is cut at 40


@contextlib.contextmanager
def forward_widths(target):
    """Records how many tokens each forward of the target ran on (prefill first)."""
    widths, run = [], target.run

    def counted(tokens, *args, **kwargs):
        widths.append(tokens.shape[1])
        return run(tokens, *args, **kwargs)

    target.run = counted
    try:
        yield widths
    finally:
        del target.run


class ChainOracleRunner(StepRunner):
    """DFlash whose drafted chain is replaced by the true greedy continuation, wrong from position k on.

    k cycles through KEEP (7 = the whole chain of block 8 is right), so step i must commit KEEP[i] + 1 tokens.
    The real drafter and chain builder still run; the oracle chain then takes the built chain's place.
    """

    KEEP = (7, 0, 3, 7, 5, 1)

    def __init__(self, *args, truth: list[int], prompt_len: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.truth, self.prompt_len_host, self.steps = truth, prompt_len, 0

    def _build_tree(self, active: int, size: int, greedy: bool, predict: bool = False) -> None:
        super()._build_tree(active, size, greedy, predict)
        done = self.running[0].prefix - self.prompt_len_host + 1  # tokens committed so far, the root included
        keep = self.KEEP[self.steps % len(self.KEEP)]
        self.steps += 1
        chain = (self.truth[done : done + size] + [0] * size)[:size]  # past the end: anything
        if keep < size:
            chain[keep] = (chain[keep] + 1) % self.target.config.vocab_size
        self._trees[size].tree.tokens[0, 1:] = torch.tensor(chain)


class PathOracleRunner(StepRunner):
    """Replaces each draft with a tree holding the true greedy continuation among decoys.

    The real drafter and tree builder still run, so their bookkeeping is exercised; the oracle tree, padded
    to the budget, then takes the built tree's place.
    """

    def __init__(self, *args, truth: list[int], prompt_len: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.truth, self.prompt_len_host = truth, prompt_len

    def _build_tree(self, active: int, size: int, greedy: bool, predict: bool = False) -> None:
        super()._build_tree(active, size, greedy, predict)
        done = self.running[0].prefix - self.prompt_len_host + 1  # tokens committed so far, the root included
        tokens, parents, depths = [], [], []
        parent = 0
        for depth, token in enumerate(self.truth[done : done + 6], start=1):
            decoy = (token + 1) % 64
            tokens += [decoy, token]  # the decoy first, so the true child is not simply node parent+1
            parents += [parent, parent]
            depths += [depth, depth]
            tokens.append((token + 2) % 64)  # a dead-end grandchild under the decoy
            parents.append(len(tokens) - 2)
            depths.append(depth + 1)
            parent = len(tokens) - 1  # the true token's node
        pad = size - len(tokens)
        parents_row = torch.tensor([[0, *parents] + [0] * pad])
        self._trees[size].tree.copy_(
            TreeBatch(
                tokens=torch.tensor([[int(self.root), *tokens] + [0] * pad]),
                parents=parents_row,
                depths=torch.tensor([[0, *depths] + [0] * pad]),
                valid=torch.arange(size + 1)[None] <= len(tokens),
                ancestors=ancestor_matrix(parents_row, self.depth_limit),
            )
        )


@pytest.mark.parametrize("family", FAMILIES)
def test_long_accepted_paths_are_compacted_correctly(pairs, family):
    target, drafter = loaded(pairs[family])
    prompt = [7, 1, 30, 2]
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    truth = Decoder(target, mode="ar").generate(prompt, params).token_ids
    oracle = Decoder(target, drafter, "ddtree", 64)
    oracle.engine.runner = PathOracleRunner(
        target, drafter, "ddtree", 64, truth=truth, prompt_len=len(prompt)
    )
    result = oracle.generate(prompt, params)
    assert result.token_ids == truth
    # six true tokens drafted per step plus the bonus; only the last step is cut by max_new_tokens
    assert result.accept_lengths[:-1] == [7] * (result.num_steps - 1)


@pytest.fixture(scope="module")
def small_vocab_pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("small")
    made = {f: write_pair(root, f, vocab=6, block_size=4, logit_scale=3.0) for f in ("qwen3", "deepseek_v3")}
    return {family: (load_target(t), load_drafter(d)) for family, (t, d) in made.items()}


@pytest.fixture(scope="module")
def small_vocab_pair(small_vocab_pairs):
    return small_vocab_pairs["qwen3"]


@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3"])
@pytest.mark.parametrize(
    "mode,budget,params",
    [
        ("dflash", None, SAMPLING[0]),
        ("dflash", None, SAMPLING[1]),
        ("ddtree", 8, SAMPLING[0]),
        ("ddtree", 8, SAMPLING[1]),
    ],
    ids=["dflash-t1", "dflash-t0.7-topk3-topp0.9", "ddtree-t1", "ddtree-t0.7-topk3-topp0.9"],
)
def test_sampling_is_lossless(small_vocab_pairs, family, mode, budget, params):
    target, drafter = small_vocab_pairs[family]
    assert_sampling_is_lossless(Decoder(target, drafter, mode, budget), target, [1, 2, 3], params)


def test_the_chi_square_test_catches_a_lossy_acceptance_rule(small_vocab_pair, monkeypatch):
    """A rule that always walks into the first drafted child (no target check) must fail the same test."""
    target, drafter = small_vocab_pair

    def accept_the_draft(tree, target_tokens, depth_limit, out=None):
        first_child = target_tokens.clone()
        for index in range(tree.size, 0, -1):  # the lowest-numbered child wins
            if tree.valid[0, index]:
                first_child[0, tree.parents[0, index]] = tree.tokens[0, index]
        return walk(tree, first_child, depth_limit, out)

    monkeypatch.setattr(step_module, "walk", accept_the_draft)
    params = SAMPLING[0]
    counts = sample_counts(Decoder(target, drafter, "ddtree", 8), [1, 2, 3], params, 600)
    table = exact_three_token_distribution(target, [1, 2, 3], params)
    with pytest.raises(AssertionError):
        assert chi_square_p(counts, table, 600) > 1e-3


def test_stop_tokens_and_length_limits(pairs):
    target, drafter = loaded(pairs["qwen3"])
    prompt = [3, 4, 5]
    free = Decoder(target, drafter, "ddtree", 8).generate(
        prompt, SamplingParams(max_new_tokens=12, ignore_eos=True)
    )
    assert len(free.token_ids) == 12 and free.finish_reason == "length"
    stop = free.token_ids[5]
    first = free.token_ids.index(stop)
    stopped = Decoder(target, drafter, "dflash").generate(
        prompt, SamplingParams(max_new_tokens=12, ignore_eos=True, stop_token_ids=(stop,))
    )
    assert stopped.token_ids == free.token_ids[: first + 1] and stopped.finish_reason == "stop"


def test_one_decoder_grows_between_requests_and_frees_a_left_stream(pairs):
    """The decoder's engine grows its caches for a longer request, and a stream its consumer leaves early
    frees the row: later requests still give AR's tokens, timed from the call to the last step."""
    target, drafter = loaded(pairs["qwen3"])
    prompt = [3, 4, 5]
    long = SamplingParams(max_new_tokens=150, ignore_eos=True)
    truth = Decoder(target, mode="ar").generate(prompt, long).token_ids
    decoder = Decoder(target, drafter, "ddtree", 8)
    stream = decoder.stream(prompt, SamplingParams(max_new_tokens=6, ignore_eos=True))
    assert len(next(stream).token_ids) == 1  # the prefill's first token
    stream.close()
    assert decoder.engine.idle and decoder.runner.active == 0
    capacity = decoder.runner.cache.capacity
    started = time.perf_counter()
    result = decoder.generate(prompt, long)
    wall = time.perf_counter() - started
    assert result.token_ids == truth and decoder.runner.cache.capacity > capacity
    assert 0 < result.prefill_s and 0 < result.decode_s and result.prefill_s + result.decode_s <= wall


def test_requests_of_growing_length_reallocate_the_caches_rarely(pairs):
    """Each longer request may reallocate the caches (and, on a GPU, re-capture every graph): requests whose
    needs grow from n to N positions reallocate them at most once per doubling, log2(N / n) + 1 times, not at
    every new longest request; the tokens stay those of a fresh AR decoder."""
    target, drafter = loaded(pairs["qwen3"])
    decoder = Decoder(target, drafter, "ddtree", 8)
    params = SamplingParams(max_new_tokens=3, ignore_eos=True)
    lengths = range(8, 500, 12)
    caches = [decoder.runner.cache]
    for length in lengths:
        prompt = [3 + (i * 7) % 50 for i in range(length)]
        tokens = decoder.generate(prompt, params).token_ids
        assert tokens == Decoder(target, mode="ar").generate(prompt, params).token_ids, length
        if decoder.runner.cache is not caches[-1]:
            caches.append(decoder.runner.cache)
    first, last = lengths[0] + params.max_new_tokens, lengths[-1] + params.max_new_tokens
    assert len(caches) - 1 <= last.bit_length() - first.bit_length() + 1, [c.capacity for c in caches]


def test_an_ar_decoder_given_a_drafter_runs_no_drafter_work(pairs, monkeypatch):
    """AR ignores a drafter it is handed: no context writes or target features per step."""
    target, drafter = loaded(pairs["qwen3"])
    calls = []
    monkeypatch.setattr(drafter, "write_context", lambda *args, **kwargs: calls.append(args))
    prompt = [3, 4, 5, 6]
    params = SamplingParams(max_new_tokens=6, ignore_eos=True)
    tokens = Decoder(target, drafter, "ar").generate(prompt, params).token_ids
    assert not calls and tokens == Decoder(target, mode="ar").generate(prompt, params).token_ids


def test_decoder_rejects_bad_configurations(pairs):
    target, drafter = loaded(pairs["qwen3"])
    with pytest.raises(SpecdeployError, match="drafter"):
        Decoder(target, None, "dflash")
    with pytest.raises(SpecdeployError, match="budget"):
        Decoder(target, drafter, "ddtree", 0)
    with pytest.raises(SpecdeployError, match="mode"):
        Decoder(target, drafter, "eagle")
    with pytest.raises(SpecdeployError, match="top_p"):
        SamplingParams(top_p=0)


def test_a_seed_gives_the_same_sample_in_ar_and_ddtree(small_vocab_pair):
    """The tree walk draws one target sample per committed token, in order, so ar and ddtree share a seed's
    stream (the DFlash chain at T > 0 uses rejection sampling, which draws differently)."""
    target, drafter = small_vocab_pair
    ar, ddtree = Decoder(target, mode="ar"), Decoder(target, drafter, "ddtree", 8)
    for seed in range(20):
        params = SamplingParams(temperature=1.0, max_new_tokens=24, ignore_eos=True, seed=seed)
        assert ar.generate([1, 2, 3], params).token_ids == ddtree.generate([1, 2, 3], params).token_ids, seed


def test_rejection_sampling_accepts_more_than_matching_samples(small_vocab_pair, monkeypatch):
    """On the same chains, rejection sampling commits more tokens per step than the sample-and-match walk."""
    target, drafter = small_vocab_pair
    params = [SamplingParams(temperature=1.0, max_new_tokens=24, ignore_eos=True, seed=s) for s in range(30)]
    rejection = [Decoder(target, drafter, "dflash").generate([1, 2, 3], p).tau for p in params]

    def sample_and_match(tree, draft_probs, target_probs, accept_uniform, bonus_uniform):
        return walk(tree, sample(target_probs, bonus_uniform), draft_probs.shape[1])

    monkeypatch.setattr(step_module, "accept_sampled_chain", sample_and_match)
    matching = [Decoder(target, drafter, "dflash").generate([1, 2, 3], p).tau for p in params]
    assert sum(rejection) / len(rejection) > sum(matching) / len(matching)
