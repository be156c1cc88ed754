"""The decoding modes, once for everything that names one: plans, campaigns, the reference engine."""

from __future__ import annotations

from typing import Literal, get_args

from specdeploy.errors import SpecdeployError

Mode = Literal["ar", "dflash", "ddtree", "eagle3"]
MODES: tuple[str, ...] = get_args(Mode)  # what a plan can launch (eagle3 on SGLang only)
ENGINE_MODES: tuple[str, ...] = ("ar", "dflash", "ddtree")  # what the reference engine runs
MODE_HELP = f"Decoding mode: {', '.join(MODES)} (eagle3 on SGLang only)."
ENGINE_MODE_HELP = f"Decoding mode of the reference engine: {', '.join(ENGINE_MODES)}."


def check_mode(mode: str, budget: int | None, modes: tuple[str, ...] = MODES) -> None:
    """A known mode, and a DDTree budget (--budget) only with ddtree, of at least one node."""
    if mode not in modes:
        raise SpecdeployError(f"unknown mode {mode!r}: choose one of {', '.join(modes)}")
    if budget is not None and mode != "ddtree":
        raise SpecdeployError(f"--budget is DDTree's tree size; mode {mode} takes none (use --mode ddtree)")
    if budget is not None and budget < 1:
        raise SpecdeployError(f"--budget must be at least 1 draft-tree node, got {budget}")
