"""The zoo trainer's parts: block-diffusion batches and the DFlash objective, rollout prompts, the schedule
and the chunk limit (the resumable pipeline end to end is in test_zoo_train_resume.py)."""

from __future__ import annotations

import math
import os
import signal

import pytest
import torch
from transformers import AutoModelForCausalLM

from specdeploy.engine.drafter import DFlashDrafter
from specdeploy.engine.single_pass import draft_pass
from specdeploy.zoo.chunk import ChunkLimit
from specdeploy.zoo.data import tokenizer_sample
from specdeploy.zoo.rollouts import prompt_starts
from specdeploy.zoo.schedule import TrainBudget
from specdeploy.zoo.specs import drafter_config, pair_spec, target_config
from specdeploy.zoo.train_drafter import (
    IGNORE,
    drafter_loss,
    last_valid_positions,
    make_blocks,
    target_features,
)


def test_blocks_see_only_context_before_their_anchor_and_their_own_block() -> None:
    sequences = torch.arange(100, 164)[None].repeat(2, 1)
    blocks = make_blocks(sequences, torch.tensor([63, 40]), 3, 8, 1, 4.0, torch.Generator().manual_seed(0))
    anchors = blocks.positions[:, 64::8]
    for row in range(2):
        for j in range(3):
            anchor = int(anchors[row, j])
            queries = slice(8 * j, 8 * j + 8)
            visible_context = blocks.attention_mask[row, queries, :64]
            assert visible_context.all(0).sum() == anchor and visible_context[:, :anchor].all()
            visible_blocks = blocks.attention_mask[row, queries, 64:]
            assert visible_blocks[:, queries].all() and visible_blocks.sum() == 64
            assert blocks.block_ids[row, 8 * j] == sequences[row, anchor]
            assert (blocks.block_ids[row, 8 * j + 1 : 8 * j + 8] == 1).all()
            labels = blocks.labels[row, queries]
            expected = sequences[row, anchor : anchor + 8].clone()
            expected[0] = IGNORE
            expected[torch.arange(anchor, anchor + 8) > (63 if row == 0 else 40)] = IGNORE
            assert torch.equal(labels, expected)
    weights = blocks.weights[0, :8]
    assert weights[0] == 0 and torch.allclose(weights[1:], torch.exp(-torch.arange(7) / 4.0))


def test_last_valid_position_is_the_first_generated_eos() -> None:
    rows = torch.tensor([[5, 0, 7, 7, 0, 0], [5, 6, 7, 8, 9, 9]])
    assert last_valid_positions(rows, start=2, eos_token_id=0).tolist() == [4, 5]


def test_training_forward_equals_decode_time_forward_for_every_block() -> None:
    torch.manual_seed(0)
    spec = pair_spec("tiny-code")
    cfg = target_config(spec, eos_token_id=0, scale=0.25)
    target = AutoModelForCausalLM.from_config(cfg).eval()
    drafter = DFlashDrafter(drafter_config(spec, cfg, mask_token_id=1, scale=0.25)).eval()
    sequences = torch.randint(2, cfg.vocab_size, (2, 64))
    blocks = make_blocks(sequences, torch.tensor([63, 63]), 3, 16, 1, 7.0, torch.Generator().manual_seed(1))
    context, _ = target_features(target, sequences, drafter.target_layer_ids)
    noise = target.get_input_embeddings()(blocks.block_ids)
    with torch.no_grad():
        trained = draft_pass(drafter, noise, context, blocks.positions, mask=blocks.attention_mask)
        for row in range(2):
            for j in range(3):
                anchor = int(blocks.positions[row, 64 + 16 * j])
                block = noise[row : row + 1, 16 * j : 16 * j + 16]
                decoded = draft_pass(
                    drafter, block, context[row : row + 1, :anchor], torch.arange(anchor + 16)[None]
                )
                torch.testing.assert_close(decoded, trained[row : row + 1, 16 * j : 16 * j + 16])


def test_slots_learn_the_targets_greedy_tokens_with_decaying_weights() -> None:
    torch.manual_seed(0)
    spec = pair_spec("tiny-mla")
    cfg = target_config(spec, eos_token_id=0, scale=0.25)
    target = AutoModelForCausalLM.from_config(cfg).eval()
    drafter = DFlashDrafter(drafter_config(spec, cfg, mask_token_id=1, scale=0.25))
    sequences = torch.randint(2, cfg.vocab_size, (1, 40))
    blocks = make_blocks(sequences, torch.tensor([36]), 2, 8, 1, 4.0, torch.Generator().manual_seed(0))
    text_labels = blocks.labels.clone()
    _, greedy = target_features(target, sequences, drafter.target_layer_ids)
    with torch.no_grad():
        expected = target(sequences).logits.argmax(-1)
    assert torch.equal(greedy[:, 1:], expected[:, :-1])  # position p holds the choice made at p - 1
    loss, _ = drafter_loss(drafter, target, sequences, blocks)
    block_positions = blocks.positions[:, 40:]
    wanted = torch.where(text_labels == IGNORE, IGNORE, expected.gather(1, block_positions - 1))
    assert torch.equal(blocks.labels, wanted)  # not the text's own tokens: the target's argmax there
    assert (blocks.labels != IGNORE).any() and not torch.equal(blocks.labels, text_labels)
    # The loss is the slot-weighted mean cross-entropy, slot i (1-based) weighted exp(-(i - 1) / gamma).
    with torch.no_grad():
        context, _ = target_features(target, sequences, drafter.target_layer_ids)
        noise = target.get_input_embeddings()(blocks.block_ids)
        hidden = draft_pass(drafter, noise, context, blocks.positions, mask=blocks.attention_mask)
        logits = drafter.compute_logits(hidden, target.get_output_embeddings()).float()
    total, weights = 0.0, 0.0
    for k in range(16):
        slot, label = k % 8, int(wanted[0, k])
        if label == IGNORE:
            continue
        weight = math.exp(-(slot - 1) / 4.0)
        total += weight * float(torch.nn.functional.cross_entropy(logits[0, k][None], torch.tensor([label])))
        weights += weight
    assert float(loss.detach()) == pytest.approx(total / weights, rel=1e-5)


def test_the_loss_trains_every_drafter_weight_under_bf16_autocast() -> None:
    # The GPU run trains an fp32 drafter under bf16 autocast: keys and values come out of the projections in
    # bf16 while the drafter's cache is fp32, and attention must take autograd's path (no fused kernel).
    torch.manual_seed(0)
    spec = pair_spec("tiny-code")
    cfg = target_config(spec, eos_token_id=0, scale=0.25)
    target = AutoModelForCausalLM.from_config(cfg).eval()
    drafter = DFlashDrafter(drafter_config(spec, cfg, mask_token_id=1, scale=0.25))
    sequences = torch.randint(2, cfg.vocab_size, (2, 40))
    blocks = make_blocks(sequences, torch.tensor([30, 36]), 2, 8, 1, 4.0, torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = drafter_loss(drafter, target, sequences, blocks)
    loss.backward()
    untouched = [name for name, p in drafter.named_parameters() if p.grad is None or not p.grad.any()]
    assert torch.isfinite(loss) and untouched == []


def test_anchors_start_at_first_anchor_and_prefer_rows_with_labels_left() -> None:
    sequences = torch.arange(100, 164)[None].repeat(3, 1)
    last_valid = torch.tensor([63, 30, 40])
    for seed in range(20):
        blocks = make_blocks(
            sequences, last_valid, 4, 8, 1, 4.0, torch.Generator().manual_seed(seed), first_anchor=24
        )
        anchors = blocks.positions[:, 64::8]
        assert (anchors >= 24).all() and (anchors <= 56).all()
        assert (anchors[1] < 30).all() and (anchors[2] < 40).all()  # 6 and 16 anchors have labels: 4 picked
        assert all(len(set(row.tolist())) == 4 for row in anchors)
    with pytest.raises(ValueError, match="cannot hold 4 blocks"):
        make_blocks(sequences, last_valid, 4, 8, 1, 4.0, torch.Generator(), first_anchor=55)


def test_rollout_prompts_start_at_distinct_positions() -> None:
    for positions in (1, 7, 1000, 123_457):
        count = min(positions, 5000)
        starts = prompt_starts(positions, 0, count, seed=3)
        assert len(set(starts.tolist())) == count and int(starts.min()) >= 0 and int(starts.max()) < positions
    first, second = prompt_starts(10_000, 0, 300, 1), prompt_starts(10_000, 300, 300, 1)
    assert not set(first.tolist()) & set(second.tolist())  # the next shard continues the same order
    assert torch.equal(prompt_starts(10_000, 300, 300, 1), second)


def test_the_budget_ends_at_its_steps_or_its_seconds_with_a_cosine_rate() -> None:
    budget = TrainBudget(
        max_steps=1000, max_seconds=60.0, warmup_steps=10, peak_lr=1.0, final_lr_fraction=0.1
    )
    assert budget.learning_rate(0, 0.0) == pytest.approx(0.1)  # warming up
    assert budget.learning_rate(500, 0.0) == pytest.approx(0.55)  # half way by steps
    assert budget.learning_rate(10, 30.0) == pytest.approx(0.55)  # half way by time
    assert not budget.done(999, 59.0) and budget.done(1000, 0.0) and budget.done(1, 60.0)


def test_a_signal_asks_the_loops_to_stop_at_their_next_check() -> None:
    limit = ChunkLimit(None)
    with limit.catching_signals():
        assert not limit.reached()
        os.kill(os.getpid(), signal.SIGTERM)
        assert limit.reached() and limit.reason == "SIGTERM received"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert ChunkLimit(0.0).reached() and ChunkLimit(0.0).reason == "time limit of this invocation"


def test_the_tokenizer_learns_from_an_evenly_spread_sample() -> None:
    texts = [f"text {i:05d}" for i in range(10)]  # 10 characters each
    assert tokenizer_sample(texts, max_bytes=30) == texts[::4]
    assert tokenizer_sample(texts, max_bytes=1000) == texts
