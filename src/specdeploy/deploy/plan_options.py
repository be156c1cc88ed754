"""The plan overrides `plan` and `up` share: defined once, added to both commands by `with_plan_options`.

Both commands then build their plan through `plan_with`, so `up` deploys exactly the plan `plan` shows for
the same recipe, hardware and overrides.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Annotated, Any, TypeVar

import typer

from specdeploy.api_key import API_KEY_ENV
from specdeploy.lock.resolve import current_lock  # resolving reaches the Hub: above make_plan, which is pure
from specdeploy.modes import BUDGET_HELP, MODE_HELP, parse_budget
from specdeploy.plan.launch_plan import LaunchPlan
from specdeploy.plan.make import DEFAULT_PORT, make_plan
from specdeploy.recipes.schema import HardwareProfile

API_KEY_HELP = f"Require an API key: the server reads it from ${API_KEY_ENV} at launch (written nowhere)."
UPDATE_LOCK_HELP = "Re-resolve the lock file (Hub, registry, image) before planning, moving its pins."
OVERRIDES_PARAMETER = "overrides"


@dataclass(frozen=True)
class PlanOverrides:
    """Everything about a plan besides its recipe and hardware that the command line may set."""

    mode: Annotated[str, typer.Option(help=MODE_HELP)] = "dflash"
    budget: Annotated[str | None, typer.Option(help=BUDGET_HELP)] = None
    tp: Annotated[int | None, typer.Option(help="Tensor-parallel size (default: chosen to fit).")] = None
    context_length: Annotated[
        int | None, typer.Option(help="Longest request, in tokens (default: the recipe's).")
    ] = None
    max_running_requests: Annotated[
        int | None, typer.Option(help="Concurrent requests the server runs (default: the recipe's).")
    ] = None
    nnodes: Annotated[int, typer.Option(help="Nodes of this profile that serve together.")] = 1
    attention_backend: Annotated[
        str | None, typer.Option(help="Override the target's attention backend (default: chosen to fit).")
    ] = None
    port: Annotated[int, typer.Option(help="HTTP port of the server.")] = DEFAULT_PORT
    api_key: Annotated[bool, typer.Option("--api-key", help=API_KEY_HELP)] = False
    update_lock: Annotated[bool, typer.Option("--update-lock", help=UPDATE_LOCK_HELP)] = False


def plan_with(recipe: str, hardware: HardwareProfile, overrides: PlanOverrides) -> LaunchPlan:
    """The plan of `recipe` on `hardware` under `overrides`, and the recipe's lock file when it has one."""
    o = overrides
    return make_plan(
        recipe,
        hardware,
        o.mode,
        budget=parse_budget(o.budget),
        tp=o.tp,
        context_length=o.context_length,
        max_running_requests=o.max_running_requests,
        nnodes=o.nnodes,
        attention_backend=o.attention_backend,
        port=o.port,
        lock=current_lock(recipe, o.update_lock),
        api_key=o.api_key,
    )


Command = TypeVar("Command", bound=Callable[..., Any])


def with_plan_options(command: Command) -> Command:
    """Replace the command's `overrides: PlanOverrides` parameter by one option per PlanOverrides field.

    Typer reads the wrapper's signature, so each command lists the same options with the same help and
    defaults; the wrapper gathers their values into the PlanOverrides the command receives."""
    signature = inspect.signature(command, eval_str=True)
    resolved = inspect.get_annotations(PlanOverrides, eval_str=True)
    names = [f.name for f in fields(PlanOverrides)]
    kept = [p for p in signature.parameters.values() if p.name != OVERRIDES_PARAMETER]
    clash = set(names) & {p.name for p in kept}
    if OVERRIDES_PARAMETER not in signature.parameters or clash:
        raise TypeError(f"{command.__name__}: needs an `overrides` parameter and none of {sorted(clash)}")
    added = [
        inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=resolved[f.name]
        )
        for f in fields(PlanOverrides)
    ]

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        overrides = PlanOverrides(**{name: kwargs.pop(name) for name in names if name in kwargs})
        return command(*args, overrides=overrides, **kwargs)

    parameters = [*kept, *added]
    wrapper.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in parameters}
    return wrapper  # type: ignore[return-value]
