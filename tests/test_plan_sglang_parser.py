"""Every plan that should work is accepted by SGLang 0.5.23's own argument parser (and ours by `serve`).

DDTree is not in 0.5.23: its argv is checked minus the PR's flags (algorithm DDTREE read as DFLASH). The PR's
flags, environment variables and full-tree backends come from tests/data/sglang_upstream.toml, transcribed
from the PR and from SGLang with their sources, not from the planner: the planner's constants must match them,
and SGLang 0.5.23 itself must confirm the parts it can (the PR's names are not yet in it; DFLASH's are).

SGLang ships a cp311 wheel only, so setup.sh installs it on Python 3.11 alone. There a missing parser fails
every test that needs it; on other Pythons conftest.py deselects those (marked `sglang_parser`) and says so.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer
from conftest import SGLANG_PARSER_PYTHON

from specdeploy.cli import app
from specdeploy.errors import SpecdeployError
from specdeploy.plan import MODES, make_plan
from specdeploy.plan.engines import (
    DDTREE_ALGORITHM,
    DDTREE_COMMIT,
    DDTREE_ENV,
    DDTREE_FLAGS,
    DDTREE_PR,
    DDTREE_TREE_BACKENDS,
    SGLANG_VERSION,
)
from specdeploy.recipes import list_hardware, list_recipes

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

needs_sglang = (
    pytest.mark.sglang_parser
)  # conftest.py deselects these, loudly, where setup.sh cannot install it

UPSTREAM = tomllib.loads((Path(__file__).parent / "data" / "sglang_upstream.toml").read_text())
SGLANG, DDTREE = UPSTREAM["sglang"], UPSTREAM["ddtree"]


@pytest.fixture(scope="module")
def sglang():
    """SGLang 0.5.23's parser modules; their absence is a failure, not a skip (setup.sh installs them)."""
    try:
        return SimpleNamespace(
            server_args=importlib.import_module("sglang.srt.server_args"),
            environ=importlib.import_module("sglang.srt.environ"),
            choices=importlib.import_module("sglang.srt.arg_groups.choices"),
            algorithms=importlib.import_module("sglang.srt.speculative.spec_info").SpeculativeAlgorithm,
            version=importlib.import_module("sglang.version").__version__,
        )
    except ImportError as exc:
        pytest.fail(
            f"SGLang {SGLANG['version']}'s argument parser is not importable ({exc}): setup.sh installs it on "
            "Python 3.11 (`pip install --no-deps sglang==0.5.23` plus its pure-Python imports); run ./setup.sh",
            pytrace=False,
        )


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
    """(args 0.5.23 knows, the PR-only flags that were taken out), by the recorded PR's flags."""
    kept, removed = [], []
    skip = False
    for at, arg in enumerate(args):
        if skip:
            skip = False
        elif arg in DDTREE["flags"]:
            removed.append(arg)
            skip = True  # each of the PR's flags takes one value
        elif arg == DDTREE["algorithm"] and args[at - 1] == "--speculative-algorithm":
            kept.append(DDTREE["handled_as"])  # DDTREE runs DFLASH's argument handling first (_handle_ddtree)
        else:
            kept.append(arg)
    return kept, removed


def parse_with_sglang(sglang, args: list[str]):
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return sglang.server_args.prepare_server_args(args)
    except SystemExit as exc:  # argparse exits 2 on an unknown flag or a bad choice
        pytest.fail(
            f"SGLang {SGLANG['version']} rejected the argv (exit {exc.code}): {errors.getvalue()[-400:]}"
        )


@needs_sglang
def test_the_installed_sglang_is_the_recorded_release(sglang):
    assert sglang.version == SGLANG["version"] == SGLANG_VERSION


@needs_sglang
def test_the_recorded_facts_agree_with_sglang_itself(sglang):
    """What 0.5.23 can confirm: DFLASH's draft backends are its own; none of the PR's names are in it yet."""
    assert sglang.choices.DRAFT_ATTENTION_BACKEND_CHOICES == SGLANG["draft_attention_backend_choices"]
    assert set(SGLANG["dflash_draft_attention_backends"]) <= set(SGLANG["draft_attention_backend_choices"])
    assert [member.name for member in sglang.algorithms] == SGLANG["speculative_algorithms"]
    assert DDTREE["algorithm"] not in SGLANG["speculative_algorithms"]
    for name in DDTREE["env"]:
        assert not hasattr(sglang.environ.envs, name), f"{name} is in {SGLANG['version']}: the PR was merged?"
    for flag in DDTREE["flags"]:  # an unknown flag exits 2: the PR's flags must go before 0.5.23 parses
        with pytest.raises(pytest.fail.Exception, match="rejected"):
            parse_with_sglang(sglang, [*SGLANG_PLANS[0].server_args, flag, "1"])


def test_setup_installs_the_parser_on_the_python_conftest_expects():
    setup = (Path(__file__).parents[1] / "setup.sh").read_text()
    assert f"sys.version_info[:2] != {SGLANG_PARSER_PYTHON}" in setup
    assert f'--no-deps "sglang=={SGLANG["version"]}"' in setup


def test_the_planners_ddtree_constants_are_the_prs():
    assert (DDTREE_PR, DDTREE_COMMIT) == (DDTREE["pr"], DDTREE["commit"])
    assert DDTREE_ALGORITHM == DDTREE["algorithm"]
    assert set(DDTREE_FLAGS) == set(DDTREE["flags"])
    assert set(DDTREE_ENV) <= set(DDTREE["env"])
    assert set(DDTREE_TREE_BACKENDS) == set(DDTREE["full_tree_attention_backends"])


def test_the_matrix_covers_every_mode_and_the_main_cases():
    covered = {(plan.recipe, plan.hardware, plan.mode) for plan in SGLANG_PLANS}
    assert {plan.mode for plan in SGLANG_PLANS} == set(MODES)
    assert ("kimi-k2.6", "rtx-pro-6000-x8", "dflash") in covered
    assert ("kimi-k2.6", "b200-x8", "ddtree") in covered
    assert ("qwen3-8b", "h200-x1", "ar") in covered
    assert len(REFERENCE_PLANS) >= 9


@needs_sglang
@pytest.mark.parametrize("plan", SGLANG_PLANS, ids=lambda p: f"{p.recipe}-{p.hardware}-{p.mode}-{p.budget}")
def test_sglang_accepts_the_argv(sglang, plan):
    args, removed = without_ddtree_flags(plan.server_args)
    # DDTree plans pass the PR's flags, the others none; whatever else they pass, 0.5.23 must know
    assert (plan.mode == "ddtree") == bool(removed), f"PR #{DDTREE['pr']} flags {DDTREE['flags']} in {args}"
    if plan.mode == "ddtree":
        assert plan.server_args[plan.server_args.index("--speculative-algorithm") + 1] == DDTREE["algorithm"]
    parsed = parse_with_sglang(sglang, args)
    assert parsed.tp_size == plan.tp and parsed.port == plan.port
    assert parsed.max_running_requests == int(args[args.index("--max-running-requests") + 1])
    if plan.mode in ("dflash", "ddtree"):
        assert parsed.speculative_draft_attention_backend in SGLANG["dflash_draft_attention_backends"]
    if (
        plan.mode == "ddtree"
        and plan.budget > int(args[args.index("--speculative-num-draft-tokens") + 1]) - 1
    ):
        # The PR's full-tree mode demands triton for prefill and decode, and page size 1 always.
        assert parsed.attention_backend in DDTREE["full_tree_attention_backends"]
        assert parsed.page_size == DDTREE["full_tree_page_size"]


@needs_sglang
def test_the_api_key_flag_the_launchers_append_is_sglangs(sglang):
    # Plans keep the key out of argv; launchers and renderings append `--api-key "$SPECDEPLOY_API_KEY"`.
    plan = make_plan("kimi-k2.6", "rtx-pro-6000-x8", "dflash", api_key=True)
    assert "--api-key" not in plan.argv
    assert parse_with_sglang(sglang, [*plan.server_args, "--api-key", "k-123"]).api_key == "k-123"


@needs_sglang
def test_an_unknown_flag_is_caught(sglang):
    # The older card's spelling of the window flag: 0.5.23 renamed it, and the parser must say so.
    args = [*SGLANG_PLANS[0].server_args, "--speculative-dflash-draft-window-size", "4096"]
    with pytest.raises(pytest.fail.Exception, match="rejected"):
        parse_with_sglang(sglang, args)


@needs_sglang
def test_environment_variables_exist_in_sglang_or_the_ddtree_pr(sglang):
    names = {(name, plan.mode) for plan in SGLANG_PLANS for name in plan.env}
    assert names, "the PCIe plans set SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"
    for name, mode in names:
        known = hasattr(sglang.environ.envs, name) or (mode == "ddtree" and name in DDTREE["env"])
        assert known, (
            f"neither SGLang {SGLANG['version']} nor PR #{DDTREE['pr']} has environment variable {name}"
        )


@pytest.mark.parametrize("plan", REFERENCE_PLANS, ids=lambda p: f"{p.recipe}-{p.mode}")
def test_reference_argv_is_accepted_by_specdeploy_serve(plan):
    assert plan.argv[:2] == ["specdeploy", "serve"]
    serve = typer.main.get_command(app).get_command(None, "serve")
    serve.make_context("serve", list(plan.server_args))  # raises click.UsageError on an unknown option
