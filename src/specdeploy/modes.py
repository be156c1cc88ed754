"""The decoding modes, once for everything that names one: plans, campaigns, the reference engine."""

from __future__ import annotations

from typing import Literal, get_args

from specdeploy.errors import SpecdeployError

Mode = Literal["ar", "dflash", "ddtree", "eagle3"]
MODES: tuple[str, ...] = get_args(Mode)  # what a plan can launch (eagle3 on SGLang only)
ENGINE_MODES: tuple[str, ...] = ("ar", "dflash", "ddtree")  # what the reference engine runs
MODE_HELP = f"Decoding mode: {', '.join(MODES)} (eagle3 on SGLang only)."
ENGINE_MODE_HELP = f"Decoding mode of the reference engine: {', '.join(ENGINE_MODES)}."


# A DDTree budget: draft-tree nodes per step, or "auto" (the reference engine picks one every step).
AUTO_BUDGET = "auto"
Budget = int | Literal["auto"]
BUDGET_HELP = "DDTree draft-tree nodes per step (ddtree only), or auto (reference engine: chosen every step)."


def parse_budget(text: str | None) -> Budget | None:
    """`--budget` as typed: a number of nodes, `auto`, or nothing."""
    if text is None or text == AUTO_BUDGET:
        return text
    try:
        return int(text)
    except ValueError:
        raise SpecdeployError(
            f"--budget must be a number of draft-tree nodes or auto, got {text!r}"
        ) from None


def budget_order(budget: Budget | None) -> float:
    """Sorts budgets by size, with auto after every fixed budget."""
    return float("inf") if budget == AUTO_BUDGET else float(budget or 0)


def check_mode(mode: str, budget: Budget | None, modes: tuple[str, ...] = MODES) -> None:
    """A known mode, and a DDTree budget (--budget) only with ddtree, of at least one node or auto."""
    if mode not in modes:
        raise SpecdeployError(f"unknown mode {mode!r}: choose one of {', '.join(modes)}")
    if budget is not None and mode != "ddtree":
        raise SpecdeployError(f"--budget is DDTree's tree size; mode {mode} takes none (use --mode ddtree)")
    if isinstance(budget, int) and budget < 1:
        raise SpecdeployError(f"--budget must be at least 1 draft-tree node, got {budget}")
