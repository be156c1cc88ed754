"""Checkpoints to commit SHAs, with each file's size and LFS sha256, through the Hugging Face Hub API."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from specdeploy.errors import SpecdeployError
from specdeploy.plan.locking import UNPINNED
from specdeploy.recipes.lock import LockedFile, LockedModel
from specdeploy.recipes.schema import ModelFacts

if TYPE_CHECKING:
    from huggingface_hub import HfApi


def hub_api() -> HfApi:
    """An API client for HF_ENDPOINT as set now (huggingface_hub reads it only once, at import)."""
    # Imported here: httpx and huggingface_hub cost `specdeploy --help` a good part of a second.
    from huggingface_hub import HfApi

    return HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)


def lock_model(model: ModelFacts, api: HfApi) -> LockedModel:
    """The commit `model.revision` (or `main`) points to now, and every file of the repo at that commit."""
    from huggingface_hub.errors import HfHubHTTPError, HTTPError

    requested = model.revision or UNPINNED
    try:
        info = api.model_info(model.path, revision=requested, files_metadata=True)
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        hint = {
            401: "the Hugging Face token is missing or invalid: set HF_TOKEN",
            403: f"your account has no access: request it at {model.access_url or 'the repo page'}",
            404: "no such repo or revision: check the path and revision in the recipe",
        }.get(status or 0, "see the message")
        raise SpecdeployError(
            f"locking {model.path}@{requested}: the Hub answered {status} ({hint})"
        ) from None
    except (HTTPError, OSError) as exc:
        raise SpecdeployError(
            f"locking {model.path}@{requested}: the Hugging Face Hub did not answer ({exc}); check the network "
            "or HF_ENDPOINT"
        ) from None
    if not info.sha or not info.siblings or any(s.size is None or s.blob_id is None for s in info.siblings):
        raise SpecdeployError(
            f"locking {model.path}@{requested}: the Hub returned no commit, or files without sizes and blob ids"
        )
    files = [
        LockedFile(
            path=sibling.rfilename,
            size=sibling.lfs.size if sibling.lfs else int(sibling.size or 0),
            sha256=sibling.lfs.sha256 if sibling.lfs else None,
            blob_id=str(sibling.blob_id),
        )
        for sibling in sorted(info.siblings, key=lambda s: s.rfilename)
    ]
    return LockedModel(path=model.path, requested=requested, revision=info.sha, files=files)
