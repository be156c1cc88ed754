"""A lock applied to a recipe: the pinned revisions, or a refusal naming what drifted since it was made."""

from __future__ import annotations

from specdeploy.errors import SpecdeployError
from specdeploy.plan.engines import DDTREE_COMMIT, SGLANG_IMAGE, SGLANG_VERSION
from specdeploy.recipes.lock import LockFile, is_hub_id
from specdeploy.recipes.schema import ModelFacts, Recipe

UNPINNED = "main"
MOVE = "re-resolve with --update-lock (on lock, plan, up or campaign) to move the lock, or restore what it was made for"


def drift(lock: LockFile, recipe: Recipe, models: list[ModelFacts], ddtree: bool) -> list[str]:
    """Every way in which `lock` no longer describes what this recipe and specdeploy would run."""
    problems = []
    if lock.recipe != recipe.name:
        problems.append(f"the lock was made for recipe {lock.recipe}, not {recipe.name}")
    for model in (m for m in models if is_hub_id(m.path)):
        locked = lock.model(model.path)
        requested = model.revision or UNPINNED
        if locked is None:
            problems.append(f"the lock has no entry for {model.path} (the recipe names another model now)")
        elif locked.requested != requested:
            problems.append(
                f"the recipe asks for {model.path}@{requested}, the lock was made for @{locked.requested}"
            )
    if lock.image.reference != SGLANG_IMAGE or lock.sglang_version != SGLANG_VERSION:
        problems.append(
            f"the lock pins {lock.image.reference} (SGLang {lock.sglang_version}), this specdeploy plans "
            f"{SGLANG_IMAGE} (SGLang {SGLANG_VERSION})"
        )
    if ddtree and lock.ddtree.commit != DDTREE_COMMIT:
        problems.append(
            f"the lock pins the DDTree build at {lock.ddtree.commit[:10]}, this specdeploy builds {DDTREE_COMMIT[:10]}"
        )
    return problems


def locked_recipe(recipe: Recipe, lock: LockFile, models: list[ModelFacts], ddtree: bool) -> Recipe:
    """`recipe` with each checkpoint pinned to the commit the lock resolved; a drifted lock is refused."""
    problems = drift(lock, recipe, models, ddtree)
    if problems:
        raise SpecdeployError(f"the lock file no longer matches: {'; '.join(problems)}; {MOVE}")

    def pin(model: ModelFacts | None) -> ModelFacts | None:
        locked = lock.model(model.path) if model is not None else None
        return model if locked is None else model.model_copy(update={"revision": locked.revision})

    return recipe.model_copy(
        update={"target": pin(recipe.target), "dflash": pin(recipe.dflash), "eagle3": pin(recipe.eagle3)}
    )
