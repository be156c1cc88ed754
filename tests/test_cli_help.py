"""Every option of every command, sub-apps included, has a help text; `--mode` lists its choices."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.modes import ENGINE_MODES, MODES

ENGINE_COMMANDS = {"generate", "serve", "profile"}  # the reference engine: ar, dflash, ddtree only
DRAFTER_COMMANDS = {"doctor"}  # the reference engine with a drafter: dflash, ddtree


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(name, click command) for every leaf command below `command`, walking groups (sub-apps)."""
    children = getattr(command, "commands", None)
    if children is None:
        yield " ".join(path), command
        return
    for name, child in children.items():
        yield from _commands(child, (*path, name))


def _all() -> dict[str, Any]:
    return dict(_commands(typer.main.get_command(app)))


def test_the_walk_reaches_the_sub_apps():
    assert {
        "plan",
        "up",
        "bench",
        "bench-selftest",
        "zoo list",
        "zoo train",
        "lab hybrid-tree",
        "image build",
    } <= set(_all())


def test_every_option_and_argument_has_help():
    missing = [
        f"{name} {'/'.join(param.opts)}"
        for name, command in _all().items()
        for param in command.params
        if not (getattr(param, "help", None) or "").strip()
    ]
    assert missing == []


def test_mode_options_list_their_choices():
    for name, command in _all().items():
        for param in command.params:
            if "--mode" not in param.opts:
                continue
            modes = ENGINE_MODES if name in ENGINE_COMMANDS else MODES
            if name in DRAFTER_COMMANDS:
                modes = ("dflash", "ddtree")
            assert all(mode in param.help for mode in modes), (name, param.help)
            if name in ENGINE_COMMANDS | DRAFTER_COMMANDS:
                assert "eagle3" not in param.help, name


def test_every_help_names_each_option_whole_at_80_columns():
    runner = CliRunner()
    for name, command in _all().items():
        result = runner.invoke(app, [*name.split(), "--help"], env={"COLUMNS": "80"})
        assert result.exit_code == 0, (name, result.output)
        assert "…" not in result.output, (name, result.output)
        assert max(len(line) for line in result.output.splitlines()) <= 80, name
        words = set(result.output.replace("/", " ").replace(",", " ").split())
        missing = [
            opt for param in command.params for opt in param.opts if opt.startswith("--") and opt not in words
        ]
        assert missing == [], (name, missing)
