"""`specdeploy demo --quick` and the shipped tiny-code pair: speculation accepts real tokens and changes no output."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.engine.runtime import load_tokenizer
from specdeploy.zoo.measure import ModeSpec, run_modes
from specdeploy.zoo.prompts import DEMO_PROMPTS
from specdeploy.zoo.registry import resolve_pair

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

# The shipped pair's measured tau, with the command that measured it and the tolerance (tests/data/zoo_tau.toml).
TAU = tomllib.loads((Path(__file__).parent / "data" / "zoo_tau.toml").read_text())["tiny-code"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_recorded_tau_is_of_the_shipped_weights() -> None:
    target_dir, draft_dir = resolve_pair("tiny-code")
    stale = "tiny-code was retrained: re-measure tests/data/zoo_tau.toml with the commands it gives"
    assert sha256(target_dir / "model.safetensors") == TAU["target_weights_sha256"], stale
    assert sha256(draft_dir / "model.safetensors") == TAU["draft_weights_sha256"], stale
    log = json.loads((target_dir.parent / "train_log.json").read_text())
    assert log["draft"]["history"][-1]["expected_tau"] == TAU["train_log_expected_tau"], stale


def test_shipped_tiny_code_drafts_are_accepted_and_lossless() -> None:
    target_dir, draft_dir = resolve_pair("tiny-code")
    tokenizer = load_tokenizer(target_dir)
    recorded = TAU["test"]
    prompts = [tokenizer.encode(text) for text in DEMO_PROMPTS[: recorded["prompts"]]]
    modes = (ModeSpec("ar"), ModeSpec("dflash"), ModeSpec("ddtree", recorded["budget"]))
    ar, dflash, ddtree = run_modes(target_dir, draft_dir, prompts, modes, recorded["max_new_tokens"])
    assert dflash.matches(ar) == ddtree.matches(ar) == len(prompts)  # greedy speculation is exact
    # the shipped drafter accepts what it was measured to accept (an untrained one gives 1.0)
    assert abs(dflash.tau - recorded["dflash_tau"]) <= TAU["tolerance"], (dflash.tau, recorded)
    assert abs(ddtree.tau - recorded["ddtree_tau"]) <= TAU["tolerance"], (ddtree.tau, recorded)
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
    assert "--num-prompts must be between 1 and" in str(result.exception)
