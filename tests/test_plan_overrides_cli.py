"""`up` takes every override `plan` takes and deploys the plan `plan` shows for them."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import typer
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.deploy import commands as deploy_commands
from specdeploy.plan.render import render_plan

runner = CliRunner()
PLAN_ONLY = {"--format", "--help", "--check"}  # how `plan` prints and checks, not what it plans
BASE = ["qwen3-8b", "--hardware", "h200-x8"]
OVERRIDES = [
    ["--mode", "ar"],
    ["--mode", "ddtree", "--budget", "32"],
    ["--tp", "2"],
    ["--context-length", "4096"],
    ["--max-running-requests", "7"],
    ["--nnodes", "2"],
    ["--attention-backend", "triton"],
    ["--port", "31999"],
    ["--api-key"],
]


def _options(name: str) -> set[str]:
    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    return {opt for param in command.params for opt in param.opts if opt.startswith("--")}


def _plan_json(args: list[str]) -> dict:
    result = runner.invoke(app, ["plan", *BASE, *args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _up_plan_json(args: list[str], monkeypatch) -> dict:
    """The plan `up --dry-run` would deploy, as `plan --format json` renders it."""
    seen = []

    def preview(plan, launcher, run_dir, hardware=None, startup_check=None):
        seen.append(plan)
        return SimpleNamespace(preflight=SimpleNamespace(failures=[]))

    monkeypatch.setattr(deploy_commands, "preview_up", preview)
    monkeypatch.setattr(deploy_commands, "print_preview", lambda *a, **k: None)
    result = runner.invoke(app, ["up", *BASE, *args, "--dry-run", "--launcher", "local"])
    assert result.exit_code == 0, result.output
    (plan,) = seen
    return json.loads(render_plan(plan, "json"))


def test_up_has_every_option_plan_has():
    plan_overrides = _options("plan") - PLAN_ONLY
    assert {"--tp", "--context-length", "--max-running-requests", "--nnodes", "--port"} <= plan_overrides
    assert plan_overrides - _options("up") == set()


def test_every_override_is_exercised_here():
    exercised = {arg for args in OVERRIDES for arg in args if arg.startswith("--")}
    assert _options("plan") - PLAN_ONLY - {"--hardware", "--update-lock"} == exercised  # update: network


@pytest.mark.parametrize("args", OVERRIDES, ids=lambda args: " ".join(args))
def test_up_builds_the_plan_that_plan_shows(args, monkeypatch):
    shown = _plan_json(args)
    assert shown != _plan_json([]), "the override changes nothing: the comparison would prove nothing"
    assert _up_plan_json(args, monkeypatch) == shown
