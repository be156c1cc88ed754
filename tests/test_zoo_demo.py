"""`specdeploy demo --quick` and the shipped tiny-code pair: speculation accepts real tokens and changes no output."""

from __future__ import annotations

from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.engine.runtime import load_tokenizer
from specdeploy.zoo.measure import ModeSpec, run_modes
from specdeploy.zoo.prompts import DEMO_PROMPTS
from specdeploy.zoo.registry import resolve_pair


def test_shipped_tiny_code_drafts_are_accepted_and_lossless() -> None:
    target_dir, draft_dir = resolve_pair("tiny-code")
    tokenizer = load_tokenizer(target_dir)
    prompts = [tokenizer.encode(text) for text in DEMO_PROMPTS[:2]]
    ar, dflash, ddtree = run_modes(
        target_dir, draft_dir, prompts, (ModeSpec("ar"), ModeSpec("dflash"), ModeSpec("ddtree", 16)), 48
    )
    assert dflash.matches(ar) == ddtree.matches(ar) == 2  # greedy speculation is exact
    assert dflash.tau > 1.1  # drafts are accepted: an untrained drafter gives 1.0
    assert ddtree.tau >= dflash.tau  # the tree holds the chain's path and its alternatives


def test_quick_demo_prints_the_engine_comparison_table() -> None:
    result = CliRunner().invoke(
        app, ["demo", "--quick", "--prompts", "1", "--max-new-tokens", "16", "--budget", "8"]
    )
    assert result.exit_code == 0, result.output
    for text in ("ar", "dflash", "ddtree (budget 8)", "baseline", "1/1", "speedup"):
        assert text in result.output


def test_demo_rejects_a_prompt_count_it_does_not_have() -> None:
    result = CliRunner().invoke(app, ["demo", "--prompts", "99"])
    assert result.exit_code != 0
    assert "--prompts must be between 1 and" in str(result.exception)
