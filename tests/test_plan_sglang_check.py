"""`plan --check`: SGLang 0.5.23's own start-up resolution (`ServerArgs.resolve_once`) judges every plan.

Its parser alone accepts plans that its start-up refuses; the refusals below are SGLang's own messages
(sglang/srt/arg_groups/speculative_hook.py, `_handle_dflash`), not the planner's. One child process checks the
whole matrix: importing SGLang takes seconds, about 25 s for the matrix and the refusals on a 2-core CPU, so
those run with the CPU suite wherever setup.sh installed SGLang; the CLI paths start a child each and are slow.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.deploy.sglang_check import check_request, release_argv, run_checks
from specdeploy.errors import SpecdeployError
from specdeploy.plan import MODES, make_plan
from specdeploy.recipes import list_hardware, list_recipes, load_hardware, load_recipe

# SGLang's resolution imports in a child process, several seconds; where setup.sh installed it
needs_sglang = [pytest.mark.sglang_parser, pytest.mark.slow]

# (flags added to a plan SGLang's parser accepts, SGLang's message when its start-up refuses them)
REFUSED = {
    "pipeline-parallel": (["--pp-size", "2"], "DFLASH speculative decoding only supports pp_size == 1"),
    "dp-attention": (
        ["--enable-dp-attention", "--dp-size", "8"],
        "DFLASH with dp attention requires --enable-dp-lm-head",
    ),
    "window-below-block": (
        ["--speculative-draft-window-size", "4"],
        "--speculative-draft-window-size must be >= --speculative-num-draft-tokens (block_size)",
    ),
}


def shipped_sglang_plans():
    plans = []
    for recipe in list_recipes():
        if recipe.engine != "sglang":
            continue
        for hardware in list_hardware():
            for mode in MODES:
                for budget in [None, 32] if mode == "ddtree" else [None]:
                    with contextlib.suppress(SpecdeployError):
                        plans.append((make_plan(recipe, hardware, mode, budget=budget), recipe, hardware))
    return plans


def _marked(test):
    for mark in needs_sglang:
        test = mark(test)
    return test


# Text-only plans (a multimodal target gets SGLang's image-encoder allowance on top, memory_hook.py:331-338)
# whose --mem-fraction-static SGLang is left to choose: its choice must be the one plan/headroom.py predicts.
OWN_FRACTION = [
    ("qwen3-8b", "h200-x1", "dflash"),
    ("qwen3-8b", "h100-x8", "ar"),
    ("qwen3-8b", "rtx-pro-6000-x8", "dflash"),
    ("qwen3-8b", "b200-x8", "dflash"),
]


def without_mem_fraction(argv: list[str]) -> list[str]:
    at = argv.index("--mem-fraction-static")
    return argv[:at] + argv[at + 2 :]


@pytest.fixture(scope="module")
def verdicts():
    """SGLang's verdict on every shipped plan, on the refused variants and on plans left to SGLang's own
    memory fraction, from one child process."""
    plans = shipped_sglang_plans()
    requests = [check_request(plan, recipe, hardware) for plan, recipe, hardware in plans]
    kimi = make_plan("kimi-k2.6", "rtx-pro-6000-x8", "dflash")
    for extra, _ in REFUSED.values():
        request = check_request(kimi, load_recipe("kimi-k2.6"), load_hardware("rtx-pro-6000-x8"))
        requests.append({**request, "argv": [*request["argv"], *extra]})
    own = [make_plan(recipe, hardware, mode) for recipe, hardware, mode in OWN_FRACTION]
    for plan in own:
        request = check_request(plan, load_recipe(plan.recipe), load_hardware(plan.hardware))
        requests.append({**request, "argv": without_mem_fraction(request["argv"])})
    answers = run_checks(requests)
    refused = answers[len(plans) : len(plans) + len(REFUSED)]
    own_verdicts = list(zip(own, answers[len(plans) + len(REFUSED) :], strict=True))
    return plans, dict(zip(REFUSED, refused, strict=True)), answers[: len(plans)], own_verdicts


@pytest.mark.sglang_parser
def test_every_shipped_recipe_hardware_and_mode_passes_sglangs_start_up(verdicts):
    plans, _, shipped, _ = verdicts
    assert {plan.mode for plan, _, _ in plans} == set(MODES)
    assert {plan.recipe for plan, _, _ in plans} == {"kimi-k2.6", "qwen3-8b", "qwen3.6-27b"}
    refused = [
        f"{plan.recipe} {plan.hardware} {plan.mode} {plan.budget}: {verdict.message}"
        for (plan, _, _), verdict in zip(plans, shipped, strict=True)
        if not verdict.accepted
    ]
    assert not refused, "\n".join(refused)
    for (plan, _, _), verdict in zip(plans, shipped, strict=True):
        # SGLang kept the plan's own concurrency cap: it resets it to 48 only when none is given
        assert f"max_running_requests {plan.argv[plan.argv.index('--max-running-requests') + 1]}," in (
            verdict.message
        )


@pytest.mark.sglang_parser
@pytest.mark.parametrize("case", REFUSED)
def test_sglangs_start_up_refuses_what_its_parser_accepts(verdicts, case):
    _, refused, _, _ = verdicts
    verdict = refused[case]
    assert not verdict.accepted and REFUSED[case][1] in verdict.message
    assert not verdict.message.startswith("argument parser")  # the parser took it; resolution refused it


@pytest.mark.sglang_parser
def test_sglangs_own_memory_fraction_is_the_one_the_plan_holds_its_headroom_against(verdicts):
    """The reserve plan/headroom.py mirrors is the one SGLang's resolution subtracts when it chooses itself."""
    *_, own = verdicts
    for plan, verdict in own:
        assert verdict.accepted, verdict.message
        gpu = plan.memory.gpu_memory
        predicted = round((gpu - plan.memory.sglang_reserve) / gpu, 3)
        said = float(verdict.message.split("mem_fraction_static ")[1].split(",")[0])
        assert said == predicted, (
            f"{plan.recipe} {plan.hardware} {plan.mode}: SGLang {said}, plan {predicted}"
        )


@_marked
def test_plan_check_prints_sglangs_refusal_and_fails(tmp_path: Path):
    """The CLI path: a recipe whose drafter window is shorter than its block, refused by SGLang's words."""
    text = (Path(__file__).parents[1] / "src/specdeploy/recipes/pairs/kimi-k2.6.toml").read_text()
    recipe = tmp_path / "kimi-short-window.toml"
    recipe.write_text(text.replace("draft_window_size = 4096", "draft_window_size = 4"))
    result = CliRunner().invoke(app, ["plan", str(recipe), "--hardware", "rtx-pro-6000-x8", "--check"])
    assert result.exit_code == 1, result.output
    assert "SGLang 0.5.23 start-up validation refused" in result.output
    assert "window_size=4, block_size=8" in result.output


def test_ddtree_argv_is_checked_as_dflash_without_the_prs_flags():
    plan = make_plan("kimi-k2.6", "b200-x8", "ddtree", budget=32)
    argv = release_argv(plan)
    assert "--speculative-ddtree-budget" not in argv
    assert argv[argv.index("--speculative-algorithm") + 1] == "DFLASH"
    assert len(argv) == len(plan.server_args) - 2


@_marked
def test_up_dry_run_stops_at_sglangs_refusal(tmp_path: Path, monkeypatch):
    """`up` runs the same validation in its preflight: SGLang's refusal is a failed check, nothing launches."""
    from deploy_helpers import recorded_nvidia_smi

    from specdeploy.deploy import deployment
    from specdeploy.deploy.hardware import detect_with_nvidia_smi

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(
        deployment, "detect_hardware", lambda: detect_with_nvidia_smi(recorded_nvidia_smi("rtx-pro-6000-x8"))
    )
    text = (Path(__file__).parents[1] / "src/specdeploy/recipes/pairs/kimi-k2.6.toml").read_text()
    recipe = tmp_path / "kimi-short-window.toml"
    recipe.write_text(text.replace("draft_window_size = 4096", "draft_window_size = 4"))
    result = CliRunner().invoke(
        app, ["up", str(recipe), "--hardware", "rtx-pro-6000-x8", "--dry-run", "--launcher", "local"]
    )
    assert isinstance(result.exception, SpecdeployError)
    assert "check(s) failed (sglang start-up" in str(result.exception)
    output = " ".join(result.output.split())
    assert "SGLang 0.5.23 start-up validation refused" in output and "window_size=4, block_size=8" in output
    assert not (tmp_path / "runs").exists()
