"""A pair's card, written from its files: the figures of its training log, the command that trains it again
(which does, to the bit), and the acceptance measured on held-out prompts with the command that measured it."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner
from zoo_helpers import CODE, TINY_SETTINGS, install_fake_package

from specdeploy.cli import app
from specdeploy.errors import SpecdeployError
from specdeploy.zoo.card import train_command
from specdeploy.zoo.corpus import collect_corpus, is_held_out
from specdeploy.zoo.evaluate import evaluate_pair, write_card
from specdeploy.zoo.pipeline import train_zoo
from specdeploy.zoo.registry import get_pair
from specdeploy.zoo.settings import ChunkOptions, DataOptions


def test_the_card_states_the_log_and_its_commands_reproduce_the_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modules = {f"zoofake/part{i}.py": f"# part {i}\nLIMIT_{i} = {i}\n{CODE * 6}".encode() for i in range(30)}
    install_fake_package(tmp_path / "site", modules, monkeypatch)
    out = tmp_path / "zoo"
    data = DataOptions(corpus_packages=("zoofake==1.2.0",), max_files=40, vocab_size=300)
    train_zoo(out, ["tiny-code"], TINY_SETTINGS, data, ChunkOptions())
    pair = get_pair("tiny-code", out)  # OUT is laid out as the shipped zoo: corpus.json beside the pairs
    log = pair.train_log()

    evaluation = evaluate_pair("tiny-code", (4,), num_prompts=2, max_new_tokens=12, models_dir=out)
    trained = {f["sha256"] for f in pair.corpus()["files"] if f["split"] == "train"}
    stdlib = {f.path: f for f in collect_corpus().files}
    assert len(evaluation.prompt_sources) == 2
    for source in evaluation.prompt_sources:
        assert is_held_out(source) and stdlib[source].sha256 not in trained
    assert [row.label for row in evaluation.rows] == ["ar", "dflash", "ddtree (budget 4)"]
    assert evaluation.command == "specdeploy zoo eval tiny-code --prompts 2 --max-new-tokens 12 --budget 4"

    write_card("tiny-code", evaluation, out)
    card = pair.card_path.read_text()
    for figure in (
        "PyPI packages: zoofake==1.2.0",
        f"{log['target']['steps']} steps in {log['target']['seconds']} s",
        f"held-out loss {log['target']['held_out_loss']}",
        f"{log['rollouts']['sequences']} greedy target continuations",
        f"{log['rollouts']['distinct_prompts']} distinct prompts",
        f"{log['draft']['passes_over_rollouts']} passes over the rollouts",
        f"final loss {log['draft']['final_train_loss']}",
        "trained in 1 invocation of `zoo train` on cpu",
        f"Measured with `{evaluation.command}`",
        f"| ddtree (budget 4) | {evaluation.rows[2].tau:.2f} |",
        ", ".join(evaluation.prompt_sources),
    ):
        assert figure in card, figure

    command = train_command(pair, log, pair.corpus())
    assert f"`{command}`" in card
    again = tmp_path / "again"
    argv = shlex.split(command.replace("--out OUT", f"--out {again}"))[1:]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert "tiny-code finished" in result.output
    for name in ("target/model.safetensors", "draft/model.safetensors"):
        first, second = load_file(out / "tiny-code" / name), load_file(again / "tiny-code" / name)
        assert all((first[k] == second[k]).all() for k in first)
    assert json.loads((again / "tiny-code" / "train_log.json").read_text())["settings"] == log["settings"]


def test_evaluation_needs_the_corpus_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from specdeploy.zoo.registry import MODELS_DIR

    shutil.copytree(MODELS_DIR / "tiny-code", tmp_path / "tiny-code")
    with pytest.raises(SpecdeployError, match="no corpus record at .*corpus.json: without it no prompt"):
        evaluate_pair("tiny-code", (4,), models_dir=tmp_path)
