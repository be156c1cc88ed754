"""The zoo trainer: corpus record, block-diffusion batches, and a few real CPU steps end to end."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from specdeploy.engine.drafter import DFlashDrafter
from specdeploy.engine.loading import load_drafter, load_target
from specdeploy.errors import SpecdeployError
from specdeploy.zoo.corpus import collect_corpus, is_held_out
from specdeploy.zoo.pipeline import TrainSettings, drafter_config, train_zoo
from specdeploy.zoo.specs import pair_spec, target_config
from specdeploy.zoo.train_drafter import (
    IGNORE,
    drafter_loss,
    last_valid_positions,
    make_blocks,
    target_features,
)

CODE = "def add(a, b):\n    return a + b\n\n\nclass Box:\n    def __init__(self, item):\n        self.item = item\n"


def write_corpus(root: Path, files: int) -> Path:
    for i in range(files):
        (root / f"pkg{i % 3}").mkdir(parents=True, exist_ok=True)
        (root / f"pkg{i % 3}" / f"mod{i}.py").write_text(f"# module {i}\n" + CODE * 20)
    return root


def test_corpus_records_files_hashes_and_a_stable_held_out_split(tmp_path: Path) -> None:
    root = write_corpus(tmp_path / "src", 40)
    (root / "latin1.py").write_bytes("x = 'caf\xe9'\n".encode("latin-1"))  # not UTF-8: skipped
    (root / "site-packages").mkdir()
    (root / "site-packages" / "dep.py").write_text(CODE)  # installed packages are not the stdlib: skipped
    corpus = collect_corpus([root])
    paths = [f.path for f in corpus.files]
    assert len(paths) == 40 and all(p.startswith("src/pkg") for p in paths)
    first = corpus.files[0]
    assert first.sha256 == hashlib.sha256((root / first.path.removeprefix("src/")).read_bytes()).hexdigest()
    assert all((f.split == "held_out") == is_held_out(f.path) for f in corpus.files)
    assert 0 < len(corpus.split("held_out")) < 10  # about 5% of 40 files, by the path hash
    manifest = corpus.manifest()
    assert manifest["num_files"] == {
        "train": 40 - len(corpus.split("held_out")),
        "held_out": len(corpus.split("held_out")),
    }
    assert collect_corpus([root]).manifest() == manifest


def test_corpus_rejects_a_folder_without_python(tmp_path: Path) -> None:
    with pytest.raises(SpecdeployError, match="no usable Python files"):
        collect_corpus([tmp_path])
    with pytest.raises(SpecdeployError, match="not a directory"):
        collect_corpus([tmp_path / "missing"])


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
        trained = drafter(noise, context, blocks.positions, None, attention_mask=blocks.attention_mask)
        for row in range(2):
            for j in range(3):
                anchor = int(blocks.positions[row, 64 + 16 * j])
                block = noise[row : row + 1, 16 * j : 16 * j + 16]
                decoded = drafter(block, context[row : row + 1, :anchor], torch.arange(anchor + 16)[None])
                torch.testing.assert_close(decoded, trained[row : row + 1, 16 * j : 16 * j + 16])


def test_trainer_runs_end_to_end_on_cpu_and_writes_loadable_checkpoints(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus", 30)
    settings = TrainSettings(
        scale=0.25,
        target_steps=30,
        target_batch=4,
        seq_len=64,
        target_lr=3e-3,
        rollout_batch=4,
        rollout_batches=1,
        rollout_new_tokens=48,
        draft_steps=6,
        draft_batch=4,
        blocks_per_sequence=4,
        checkpoint_every=5,
        archive_part_bytes=300_000,
    )
    out = tmp_path / "zoo"
    train_zoo(out, ["tiny-code", "tiny-mla"], settings, [corpus], archive_dir=tmp_path / "archive")

    manifest = json.loads((out / "corpus.json").read_text())
    assert manifest["num_files"]["train"] + manifest["num_files"]["held_out"] == 30
    for name in ("tiny-code", "tiny-mla"):
        log = json.loads((out / name / "train_log.json").read_text())
        assert log["target"]["steps"] == 30 and log["draft"]["steps"] == 6
        # From ln(vocab) > 5.5 at the start: a repetitive corpus is learned within 30 steps.
        assert log["target"]["final_train_loss"] < 3.5
        AutoModelForCausalLM.from_pretrained(out / name / "target")
        target = load_target(out / name / "target")
        drafter = load_drafter(out / name / "draft")
        drafter.check_compatible(target.config)
        assert drafter.block_size == pair_spec(name).block_size
        assert next(drafter.parameters()).dtype == torch.float32  # loads in the asked dtype from bf16 files
    parts = sorted((tmp_path / "archive").glob("tiny-code.tar.part*"))
    assert len(parts) >= 2  # 300 kB parts
    restored = tmp_path / "restored"
    restored.mkdir()
    subprocess.run(f"cat {' '.join(map(str, parts))} | tar x -C {restored}", shell=True, check=True)
    assert (restored / "tiny-code" / "target" / "model.safetensors").read_bytes() == (
        out / "tiny-code" / "target" / "model.safetensors"
    ).read_bytes()


def test_unknown_pair_fails_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(SpecdeployError, match="unknown zoo pair 'tiny-gpt'"):
        train_zoo(tmp_path, ["tiny-gpt"], TrainSettings())
    assert not any(tmp_path.iterdir())


def test_target_labels_are_the_targets_greedy_tokens() -> None:
    torch.manual_seed(0)
    spec = pair_spec("tiny-mla")
    cfg = target_config(spec, eos_token_id=0, scale=0.25)
    target = AutoModelForCausalLM.from_config(cfg).eval()
    drafter = DFlashDrafter(drafter_config(spec, cfg, mask_token_id=1, scale=0.25))
    sequences = torch.randint(2, cfg.vocab_size, (1, 40))
    blocks = make_blocks(sequences, torch.tensor([39]), 2, 8, 1, 4.0, torch.Generator().manual_seed(0))
    _, greedy = target_features(target, sequences, drafter.target_layer_ids)
    with torch.no_grad():
        expected = target(sequences).logits.argmax(-1)
    assert torch.equal(greedy[:, 1:], expected[:, :-1])  # position p holds the choice made at p - 1
    _, text_correct = drafter_loss(drafter, target, sequences, blocks)
    _, target_correct = drafter_loss(drafter, target, sequences, blocks, target_labels=True)
    assert text_correct.shape == target_correct.shape
