"""`specdeploy lock`: resolve and write the lock file of a recipe or campaign, and show what it pins."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from specdeploy.errors import SpecdeployError
from specdeploy.lock.registry import REGISTRY_URL_ENV
from specdeploy.lock.resolve import DigestSource, LockOptions, current_lock
from specdeploy.recipes.lock import LockFile, lock_path_for, read_lock
from specdeploy.terminal_tables import add_columns, narrow_table


def lock_table(lock: LockFile) -> Table:
    table = narrow_table(f"lock of {lock.recipe}")
    headers = ("what", "asked for", "pinned to", "detail")
    add_columns(table, headers, headers, headers)
    for model in lock.models:
        lfs = sum(1 for f in model.files if f.sha256)
        count = f"{len(model.files)} file{'s' if len(model.files) != 1 else ''}"
        detail = f"{count} ({lfs} LFS with sha256), {model.total_bytes / 1e9:.1f} GB"
        table.add_row(model.path, model.requested, model.revision, detail)
    table.add_row("image", lock.image.reference, lock.image.digest, f"SGLang {lock.sglang_version}")
    ddtree = lock.ddtree
    table.add_row(
        f"DDTree PR #{ddtree.pr}", "its commit", ddtree.commit, f"{len(ddtree.constraints)} pip pins"
    )
    return table


def lock(
    source: Annotated[
        str, typer.Argument(help="Recipe name (`kimi-k2.6`), a recipe .toml, or a campaign .toml.")
    ],
    update_lock: Annotated[
        bool,
        typer.Option(
            "--update-lock", help="Replace an existing lock with what the Hub and registry hold now."
        ),
    ] = False,
    registry_url: Annotated[
        str | None,
        typer.Option(
            envvar=REGISTRY_URL_ENV, help="The image registry's API base URL (default: from the image name)."
        ),
    ] = None,
    image_digest_from: Annotated[
        str, typer.Option(help="registry (the distribution API) or docker (pull, then inspect).")
    ] = "registry",
) -> None:
    """Pin a recipe or campaign: model commits and file hashes, image digest, SGLang version, DDTree pins.

    Checkpoints resolve to commit SHAs (each file's size and LFS sha256), the image tag to its digest, and the
    DDTree build to its commit and the pip pins of its dependencies. The lock is written beside the recipe or
    campaign file (a shipped recipe's in this directory); plan, up and campaign then use it and refuse drift.
    """
    if image_digest_from not in ("registry", "docker"):
        raise SpecdeployError(f"--image-digest-from {image_digest_from!r}: choose registry or docker")
    path = lock_path_for(source)
    existing = read_lock(path)
    if existing is not None and not update_lock:
        raise SpecdeployError(
            f"{path} already pins {existing.recipe}: plan, up and campaign use it as it is; pass --update-lock to "
            "move it to what the Hub and registry hold now"
        )
    source_of: DigestSource = "docker" if image_digest_from == "docker" else "registry"
    written = current_lock(source, update=True, options=LockOptions(registry_url, source_of))
    assert written is not None
    console = Console()
    console.print(lock_table(written))
    console.print(f"wrote {path}")
