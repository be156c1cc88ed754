"""Resolve everything a recipe can run to pins, and find (or refresh) the lock a command should use."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from specdeploy.errors import SpecdeployError
from specdeploy.lock.build_pins import probe_build
from specdeploy.lock.hub import hub_api, lock_model
from specdeploy.lock.registry import docker_digest, registry_digest
from specdeploy.plan.engines import SGLANG_IMAGE, SGLANG_VERSION, sglang_ddtree_build
from specdeploy.recipes.loader import load_recipe
from specdeploy.recipes.lock import (
    LockedDDTree,
    LockedImage,
    LockFile,
    is_hub_id,
    lock_path_for,
    read_lock,
    write_lock,
)
from specdeploy.recipes.schema import Recipe

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 has no TOML reader in the standard library
    import tomli as tomllib

DigestSource = Literal["registry", "docker"]


@dataclass(frozen=True)
class LockOptions:
    registry_url: str | None = None  # the registry's API base URL (default: from the image's name)
    image_digest_from: DigestSource = "registry"


def resolve_lock(recipe: Recipe, options: LockOptions = LockOptions()) -> LockFile:
    """Ask the Hub, the registry and the image itself: the recipe's models, image, SGLang and DDTree pins."""
    if recipe.engine != "sglang":
        raise SpecdeployError(
            f"{recipe.name} runs models shipped with specdeploy on the reference engine: its version pins them, "
            "there is nothing to lock"
        )
    api = hub_api()
    checkpoints = [
        m for m in (recipe.target, recipe.dflash, recipe.eagle3) if m is not None and is_hub_id(m.path)
    ]
    models = [lock_model(model, api) for model in checkpoints]
    if options.image_digest_from == "docker":
        digest = docker_digest(SGLANG_IMAGE)
    else:
        digest = registry_digest(SGLANG_IMAGE, options.registry_url)
    image = LockedImage(reference=SGLANG_IMAGE, digest=digest)
    build = sglang_ddtree_build().build
    assert build is not None  # the DDTree engine is always a build
    build = build.model_copy(update={"base": image.pinned})
    version, constraints = probe_build(build)
    if version != SGLANG_VERSION:
        raise SpecdeployError(
            f"{image.pinned} holds SGLang {version}, this specdeploy plans {SGLANG_VERSION}: the tag was moved "
            "to another release; pin the image by hand or upgrade specdeploy"
        )
    return LockFile(
        recipe=recipe.name,
        models=models,
        image=image,
        sglang_version=version,
        ddtree=LockedDDTree(pr=build.pull_request, commit=build.commit, constraints=constraints),
    )


def recipe_source(source: str) -> str:
    """The recipe a lock source names: a recipe name or file, or a campaign file's `recipe`."""
    path = Path(source).expanduser()
    if not (source.endswith(".toml") and path.is_file()):
        return source
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    if "modes" not in data or not isinstance(
        data.get("recipe"), str
    ):  # campaigns have modes, recipes a target
        return source
    recipe = data["recipe"]
    # relative to the campaign file, as the campaign reads it
    return (
        str(path.parent / recipe) if recipe.endswith(".toml") and not Path(recipe).is_absolute() else recipe
    )


def current_lock(source: str, update: bool, options: LockOptions = LockOptions()) -> LockFile | None:
    """The lock beside `source` (a recipe or campaign); with `update`, re-resolved and rewritten first."""
    path = lock_path_for(source)
    if not update:
        return read_lock(path)
    lock = resolve_lock(load_recipe(recipe_source(source)), options)
    write_lock(path, lock)
    return lock
