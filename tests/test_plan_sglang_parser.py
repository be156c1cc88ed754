"""Every plan that should work is accepted by SGLang 0.5.23's own argument parser (and ours by `serve`).

DDTree is not in 0.5.23: its argv is checked minus the PR's flags (algorithm DDTREE read as DFLASH), and
those flags are checked against the list read from the PR.
"""

from __future__ import annotations

import contextlib
import io

import pytest
import typer

from specdeploy.cli import app
from specdeploy.errors import SpecdeployError
from specdeploy.plan import MODES, make_plan
from specdeploy.plan.engines import (
    DDTREE_ALGORITHM,
    DDTREE_ENV,
    DDTREE_FLAGS,
    DDTREE_PR,
    DDTREE_TREE_BACKENDS,
    SGLANG_VERSION,
)
from specdeploy.recipes import list_hardware, list_recipes

server_args = pytest.importorskip("sglang.srt.server_args", reason="setup.sh installs sglang for this check")
environ = pytest.importorskip("sglang.srt.environ")

DRAFT_BACKENDS = pytest.importorskip("sglang.srt.arg_groups.choices").DRAFT_ATTENTION_BACKEND_CHOICES


def working_plans():
    plans = []
    for recipe in list_recipes():
        for hardware in list_hardware():
            for mode in MODES:
                budgets = [None, 32] if mode == "ddtree" else [None]
                for budget in budgets:
                    with contextlib.suppress(SpecdeployError):
                        plans.append(make_plan(recipe, hardware, mode, budget=budget))
    return plans


PLANS = working_plans()
SGLANG_PLANS = [plan for plan in PLANS if plan.engine.name == "sglang"]
REFERENCE_PLANS = [plan for plan in PLANS if plan.engine.name == "reference"]


def without_ddtree_flags(args: list[str]) -> tuple[list[str], list[str]]:
    """(args 0.5.23 knows, the PR-only flags that were taken out)."""
    kept, removed = [], []
    skip = False
    for at, arg in enumerate(args):
        if skip:
            skip = False
        elif arg in DDTREE_FLAGS:
            removed.append(arg)
            skip = True
        elif arg == DDTREE_ALGORITHM and args[at - 1] == "--speculative-algorithm":
            kept.append("DFLASH")  # DDTREE runs DFLASH's argument handling first (the PR's _handle_ddtree)
        else:
            kept.append(arg)
    return kept, removed


def parse_with_sglang(args: list[str]):
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return server_args.prepare_server_args(args)
    except SystemExit as exc:  # argparse exits 2 on an unknown flag or a bad choice
        pytest.fail(
            f"SGLang {SGLANG_VERSION} rejected the argv (exit {exc.code}): {errors.getvalue()[-400:]}"
        )


def test_the_matrix_covers_every_mode_and_the_main_cases():
    covered = {(plan.recipe, plan.hardware, plan.mode) for plan in SGLANG_PLANS}
    assert {plan.mode for plan in SGLANG_PLANS} == set(MODES)
    assert ("kimi-k2.6", "rtx-pro-6000-x8", "dflash") in covered
    assert ("kimi-k2.6", "b200-x8", "ddtree") in covered
    assert ("qwen3-8b", "h200-x1", "ar") in covered
    assert len(REFERENCE_PLANS) >= 9


@pytest.mark.parametrize("plan", SGLANG_PLANS, ids=lambda p: f"{p.recipe}-{p.hardware}-{p.mode}-{p.budget}")
def test_sglang_accepts_the_argv(plan):
    args, removed = without_ddtree_flags(plan.server_args)
    assert set(removed) <= set(DDTREE_FLAGS)
    assert (plan.mode == "ddtree") == bool(removed)
    parsed = parse_with_sglang(args)
    assert parsed.tp_size == plan.tp and parsed.port == plan.port
    assert parsed.max_running_requests == int(args[args.index("--max-running-requests") + 1])
    if plan.mode in ("dflash", "ddtree"):
        assert parsed.speculative_draft_attention_backend in DRAFT_BACKENDS
    if (
        plan.mode == "ddtree"
        and plan.budget > int(args[args.index("--speculative-num-draft-tokens") + 1]) - 1
    ):
        # The PR's full-tree mode demands triton for prefill and decode, and page size 1 always.
        assert parsed.attention_backend in DDTREE_TREE_BACKENDS and parsed.page_size == 1


def test_the_api_key_flag_the_launchers_append_is_sglangs():
    # Plans keep the key out of argv; launchers and renderings append `--api-key "$SPECDEPLOY_API_KEY"`.
    plan = make_plan("kimi-k2.6", "rtx-pro-6000-x8", "dflash", api_key=True)
    assert "--api-key" not in plan.argv
    assert parse_with_sglang([*plan.server_args, "--api-key", "k-123"]).api_key == "k-123"


def test_an_unknown_flag_is_caught():
    # The older card's spelling of the window flag: 0.5.23 renamed it, and the parser must say so.
    args = [*SGLANG_PLANS[0].server_args, "--speculative-dflash-draft-window-size", "4096"]
    with pytest.raises(pytest.fail.Exception, match="rejected"):
        parse_with_sglang(args)


def test_environment_variables_exist_in_sglang_or_the_ddtree_pr():
    names = {(name, plan.mode) for plan in SGLANG_PLANS for name in plan.env}
    assert names, "the PCIe plans set SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"
    for name, mode in names:
        known = hasattr(environ.envs, name) or (mode == "ddtree" and name in DDTREE_ENV)
        assert known, f"neither SGLang {SGLANG_VERSION} nor PR #{DDTREE_PR} has environment variable {name}"


@pytest.mark.parametrize("plan", REFERENCE_PLANS, ids=lambda p: f"{p.recipe}-{p.mode}")
def test_reference_argv_is_accepted_by_specdeploy_serve(plan):
    assert plan.argv[:2] == ["specdeploy", "serve"]
    serve = typer.main.get_command(app).get_command(None, "serve")
    serve.make_context("serve", list(plan.server_args))  # raises click.UsageError on an unknown option
