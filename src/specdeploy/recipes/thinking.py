"""Thinking as an explicit benchmark axis: a thinking target is measured with thinking on or off, never by
accident of its chat template's default."""

from __future__ import annotations

from typing import Any, Literal

from specdeploy.errors import SpecdeployError
from specdeploy.recipes.loader import list_recipes
from specdeploy.recipes.schema import Recipe, ThinkingSwitch

Thinking = Literal["on", "off"]
THINKING_SETTINGS: tuple[Thinking, ...] = ("on", "off")


def thinking_switch(model_path: str | None) -> tuple[str, ThinkingSwitch] | None:
    """(recipe name, switch) of the shipped thinking recipe whose target is `model_path`, if any."""
    for recipe in list_recipes():
        if recipe.thinking is not None and recipe.target.path == model_path:
            return recipe.name, recipe.thinking
    return None


def recipe_thinking(recipe: Recipe) -> tuple[str, ThinkingSwitch] | None:
    return (recipe.name, recipe.thinking) if recipe.thinking is not None else None


def with_thinking(
    found: tuple[str, ThinkingSwitch] | None,
    thinking: Thinking | None,
    kwargs: dict[str, Any],
    how_to_set: str,
) -> dict[str, Any]:
    """The chat_template_kwargs to send: the thinking setting spelled as the model's template reads it.

    Refuses a thinking model with no setting; a setting that contradicts the kwargs given is refused too."""
    if found is None:
        return kwargs
    name, switch = found
    if thinking is None:
        if switch.kwarg in kwargs:  # said through chat_template_kwargs directly
            return kwargs
        state = "on" if switch.default else "off"
        raise SpecdeployError(
            f"{name} is a thinking model (its chat template has thinking {state} unless told otherwise), and "
            f"thinking moves acceptance a lot: say which to measure with {how_to_set}"
        )
    value = thinking == "on"
    if kwargs.get(switch.kwarg, value) != value:
        raise SpecdeployError(
            f"thinking {thinking} contradicts chat_template_kwargs {{{switch.kwarg!r}: {kwargs[switch.kwarg]}}}: "
            "give one of them"
        )
    return {**kwargs, switch.kwarg: value}
