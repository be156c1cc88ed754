"""Recipes: model pairs and hardware profiles as TOML data, loaded and validated with pydantic."""

from specdeploy.recipes.loader import list_hardware, list_recipes, load_hardware, load_recipe
from specdeploy.recipes.schema import HardwareProfile, Recipe

__all__ = ["HardwareProfile", "Recipe", "list_hardware", "list_recipes", "load_hardware", "load_recipe"]
