"""`specdeploy lab hybrid-tree`: exact per-node state stays lossless, the leaky order does not."""

from __future__ import annotations

import json

import pytest
from decode_helpers import write_pair
from hybrid_helpers import write_drafter, write_target
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.engine.decode import SamplingParams
from specdeploy.engine.loading import load_drafter, load_target
from specdeploy.errors import SpecdeployError
from specdeploy.lab.commands import parse_budgets
from specdeploy.lab.hybrid_tree import hybrid_tree_experiment, random_prompts


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    return write_target("qwen3_next", root / "target"), write_drafter(root / "draft")


def test_exact_state_is_lossless_and_the_leaky_order_is_not(pair):
    target, drafter = load_target(pair[0]), load_drafter(pair[1])
    prompts = random_prompts(3, 16, 64, avoid={62, 63}, seed=0)
    rows = hybrid_tree_experiment(
        target, drafter, prompts, [6], SamplingParams(max_new_tokens=24, ignore_eos=True)
    )
    by_key = {(r.mode, r.tree_state): r for r in rows}
    assert [(r.mode, r.budget, r.tree_state) for r in rows] == [
        ("dflash", None, "exact"),
        ("dflash", None, "leaky"),
        ("ddtree", 6, "exact"),
        ("ddtree", 6, "leaky"),
    ]
    assert all(r.equal_to_ar == 3 for r in rows if r.tree_state == "exact")
    # A chain has no siblings: the leaky order changes nothing there.
    leaky_chain, exact_chain = by_key["dflash", "leaky"].as_dict(), by_key["dflash", "exact"].as_dict()
    assert {**leaky_chain, "tree_state": "exact"} == exact_chain
    assert by_key["ddtree", "leaky"].equal_to_ar < 3
    assert by_key["ddtree", "exact"].verified_per_step == 7.0
    assert not target.layers[0].mixer.leaky  # the experiment leaves the model exact


def test_cli_prints_json_rows_and_rejects_bad_input(pair, tmp_path_factory):
    runner = CliRunner()
    args = ["lab", "hybrid-tree", "--target", str(pair[0]), "--draft", str(pair[1]), "--prompts", "1"]
    result = runner.invoke(app, [*args, "--budgets", "3", "--max-new-tokens", "8", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["prompts"] == 1 and "random" in report["prompt_source"]
    assert [(r["mode"], r["tree_state"]) for r in report["rows"]][-2:] == [
        ("ddtree", "exact"),
        ("ddtree", "leaky"),
    ]

    with pytest.raises(SpecdeployError, match="comma-separated integers"):
        parse_budgets("4,x")
    with pytest.raises(SpecdeployError, match="at least 1"):
        parse_budgets("0")
    attention_only, draft = write_pair(tmp_path_factory.mktemp("plain"), "qwen3")
    plain = runner.invoke(app, ["lab", "hybrid-tree", "--target", str(attention_only), "--draft", str(draft)])
    assert isinstance(plain.exception, SpecdeployError)
    assert "no recurrent layers" in str(plain.exception)
