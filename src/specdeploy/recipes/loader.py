"""Find, read and validate recipe TOML files shipped with specdeploy (or given as paths)."""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, ValidationError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 has no TOML reader in the standard library
    import tomli as tomllib

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

from specdeploy.errors import SpecdeployError
from specdeploy.recipes.schema import HardwareProfile, Recipe

PAIRS_DIR = "pairs"
HARDWARE_DIR = "hardware"

Data = TypeVar("Data", bound=BaseModel)


def _shipped(kind: str) -> dict[str, Traversable]:
    folder = resources.files("specdeploy.recipes") / kind
    return {
        entry.name.removesuffix(".toml"): entry for entry in folder.iterdir() if entry.name.endswith(".toml")
    }


def _looks_like_path(name_or_path: str) -> bool:
    return name_or_path.endswith(".toml") or "/" in name_or_path or "\\" in name_or_path


def _load(name_or_path: str, kind: str, model: type[Data], what: str) -> Data:
    shipped = _shipped(kind)
    if name_or_path in shipped:
        source: Traversable | Path = shipped[name_or_path]
    elif _looks_like_path(name_or_path):
        source = Path(name_or_path).expanduser()
        if not source.is_file():
            raise SpecdeployError(f"{what} file {name_or_path} does not exist")
    else:
        raise SpecdeployError(
            f"unknown {what} {name_or_path!r}: choose one of {', '.join(sorted(shipped))} "
            f"or give the path of a .toml file (`specdeploy recipes` lists them)"
        )
    try:
        data = tomllib.loads(source.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise SpecdeployError(f"{what} {name_or_path} is not valid TOML: {exc}") from exc
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in err['loc']) or '(top level)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise SpecdeployError(f"{what} {name_or_path} is invalid: {problems}") from exc


def load_recipe(name_or_path: str) -> Recipe:
    """A shipped model pair by name (`kimi-k2.6`) or a recipe TOML file by path."""
    return _load(name_or_path, PAIRS_DIR, Recipe, "recipe")


def load_hardware(name_or_path: str) -> HardwareProfile:
    """A shipped hardware profile by name (`rtx-pro-6000-x8`) or a profile TOML file by path."""
    return _load(name_or_path, HARDWARE_DIR, HardwareProfile, "hardware profile")


def list_recipes() -> list[Recipe]:
    return [load_recipe(name) for name in sorted(_shipped(PAIRS_DIR))]


def list_hardware() -> list[HardwareProfile]:
    return [load_hardware(name) for name in sorted(_shipped(HARDWARE_DIR))]
