"""`zoo train` in chunks: a run cut into many invocations ends with exactly the weights of one uninterrupted
run, its log complete; shared data and pairs are guarded against mismatched options and double use."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from zoo_helpers import CODE, TINY_SETTINGS

from specdeploy.engine.loading import load_drafter, load_target
from specdeploy.errors import SpecdeployError
from specdeploy.zoo.chunk import ChunkLimit
from specdeploy.zoo.locks import exclusive
from specdeploy.zoo.pipeline import train_zoo
from specdeploy.zoo.settings import ChunkOptions, DataOptions, TrainSettings
from specdeploy.zoo.specs import PAIRS, pair_spec


class StopAfter(ChunkLimit):
    """A chunk limit reached after `checks` questions: cuts a run at a different point in every stage."""

    def __init__(self, checks: int) -> None:
        super().__init__(None)
        self.left = checks

    def reached(self) -> bool:
        self.left -= 1
        return self.left < 0


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    for i in range(30):
        (root / f"pkg{i % 3}").mkdir(exist_ok=True)
        (root / f"pkg{i % 3}" / f"mod{i}.py").write_text(f"# module {i}\nVALUE_{i} = {i * 7}\n" + CODE * 8)
    return root


def data_options(corpus: Path) -> DataOptions:
    return DataOptions(corpus_roots=(str(corpus),), vocab_size=300)


def test_a_run_cut_into_chunks_ends_where_an_uninterrupted_run_ends(tmp_path: Path, corpus: Path) -> None:
    whole, chunked = tmp_path / "whole", tmp_path / "chunked"
    assert train_zoo(whole, ["tiny-code"], TINY_SETTINGS, data_options(corpus), ChunkOptions()) == {
        "tiny-code": True
    }
    invocations = 0
    while not train_zoo(
        chunked, ["tiny-code"], TINY_SETTINGS, data_options(corpus), ChunkOptions(), StopAfter(9)
    )["tiny-code"]:
        invocations += 1
        assert invocations < 30, "no progress between chunks"
    for name in ("target/model.safetensors", "draft/model.safetensors"):
        expected, got = load_file(whole / "tiny-code" / name), load_file(chunked / "tiny-code" / name)
        assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)
    assert torch.equal(torch.load(whole / "tiny-code/state/rollouts/shard-00002.pt"),
                       torch.load(chunked / "tiny-code/state/rollouts/shard-00002.pt"))  # fmt: skip

    log = json.loads((chunked / "tiny-code" / "train_log.json").read_text())
    assert log["stage"] == "done" and len(log["chunks"]) == invocations + 1 > 4
    assert [c["ended"] for c in log["chunks"]] == ["time limit of this invocation"] * invocations + [
        "finished"
    ]
    assert {stage for c in log["chunks"] for stage in c["stages"]} == {"target", "rollouts", "draft"}
    assert log["target"]["steps"] == 24 and log["draft"]["steps"] == 8 and log["rollouts"]["sequences"] == 12
    losses = [entry["step"] for entry in log["target"]["history"] if "loss" in entry]
    assert losses == sorted(losses) and losses[-1] == 24  # the history of every chunk, in order
    assert log["target"]["held_out_loss"] > 0 and log["draft"]["passes_over_rollouts"] == pytest.approx(
        8 * 4 / 12, abs=0.01
    )
    assert train_zoo(chunked, ["tiny-code"], TINY_SETTINGS, data_options(corpus), ChunkOptions())["tiny-code"]
    again = json.loads((chunked / "tiny-code" / "train_log.json").read_text())
    assert again["chunks"] == log["chunks"]  # a finished run is left as it is
    whole_log = json.loads((whole / "tiny-code" / "train_log.json").read_text())
    assert whole_log["target"]["final_train_loss"] == log["target"]["final_train_loss"]
    assert whole_log["draft"]["final_train_loss"] == log["draft"]["final_train_loss"]

    AutoModelForCausalLM.from_pretrained(chunked / "tiny-code" / "target")
    target = load_target(chunked / "tiny-code" / "target")
    drafter = load_drafter(chunked / "tiny-code" / "draft")
    drafter.check_compatible(target.config)
    assert drafter.block_size == pair_spec("tiny-code").block_size
    assert next(drafter.parameters()).dtype == torch.float32  # loads in the asked dtype from bf16 files


def test_a_finished_pair_archives_without_its_resume_state(tmp_path: Path, corpus: Path) -> None:
    out, archive = tmp_path / "zoo", tmp_path / "archive"
    chunk = ChunkOptions(archive_dir=archive, archive_part_bytes=100_000)
    train_zoo(out, ["tiny-code"], TINY_SETTINGS, data_options(corpus), chunk)
    parts = sorted(archive.glob("tiny-code.tar.part*"))
    assert len(parts) >= 2  # 100 kB parts
    restored = tmp_path / "restored"
    restored.mkdir()
    subprocess.run(f"cat {' '.join(map(str, parts))} | tar x -C {restored}", shell=True, check=True)
    assert sorted(p.name for p in (restored / "tiny-code").iterdir()) == ["draft", "target", "train_log.json"]
    assert (restored / "tiny-code" / "target" / "model.safetensors").read_bytes() == (
        out / "tiny-code" / "target" / "model.safetensors"
    ).read_bytes()


def test_a_run_continues_only_with_its_own_settings_and_data(
    tmp_path: Path, corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "zoo"
    train_zoo(out, ["tiny-code"], TINY_SETTINGS, data_options(corpus), ChunkOptions(), StopAfter(4))
    changed = TrainSettings(**{**TINY_SETTINGS.__dict__, "target_steps": 30})
    with pytest.raises(SpecdeployError, match=r"holds a run with other settings \(target_steps\)"):
        train_zoo(out, ["tiny-code"], changed, data_options(corpus), ChunkOptions())
    with pytest.raises(SpecdeployError, match="holds data made from other corpus options"):
        train_zoo(
            out,
            ["tiny-code"],
            TINY_SETTINGS,
            DataOptions(corpus_roots=(str(corpus),), vocab_size=280),
            ChunkOptions(),
        )
    redefined = dataclasses.replace(pair_spec("tiny-code"), loss_gamma=5.0)
    with monkeypatch.context() as patch:
        patch.setitem(PAIRS, "tiny-code", redefined)
        with pytest.raises(SpecdeployError, match=r"other settings \(pair loss_gamma\)"):
            train_zoo(out, ["tiny-code"], TINY_SETTINGS, data_options(corpus), ChunkOptions())
    with exclusive(out / "tiny-code" / ".lock", wait=False, what="test"):
        with pytest.raises(SpecdeployError, match=r"tiny-code is in use by process \d+: wait for it"):
            train_zoo(out, ["tiny-code"], TINY_SETTINGS, data_options(corpus), ChunkOptions())


def test_unknown_pair_fails_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(SpecdeployError, match="unknown zoo pair 'tiny-gpt'"):
        train_zoo(tmp_path, ["tiny-gpt"], TrainSettings(), DataOptions(), ChunkOptions())
    assert not any(tmp_path.iterdir())
