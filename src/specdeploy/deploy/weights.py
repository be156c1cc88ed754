"""Make a plan's checkpoints available locally: Hub downloads (pinned, resumable), local dirs, zoo models."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from tqdm import tqdm

from specdeploy.errors import SpecdeployError
from specdeploy.plan.launch_plan import ModelRef

ModelLocation = Literal["hub", "local", "zoo"]
ZOO_PREFIX = "zoo:"


def model_location(path: str) -> ModelLocation:
    """`zoo:NAME`, an existing directory or a path-looking string, else a Hub repo id."""
    if path.startswith(ZOO_PREFIX):
        return "zoo"
    if path.startswith(("/", "./", "../", "~")) or Path(path).expanduser().is_dir():
        return "local"
    return "hub"


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps downloads (HF_HUB_CACHE, HF_HOME/hub, or ~/.cache/huggingface/hub)."""
    # Imported here: httpx and huggingface_hub cost `specdeploy --help` a good part of a second.
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def cached_bytes(repo_id: str, cache_dir: Path) -> int:
    """Bytes of `repo_id` already downloaded into the Hub cache (finished files only)."""
    from huggingface_hub.file_download import repo_folder_name

    blobs = cache_dir / repo_folder_name(repo_id=repo_id, repo_type="model") / "blobs"
    if not blobs.is_dir():
        return 0
    return sum(f.stat().st_size for f in blobs.iterdir() if f.is_file() and f.suffix != ".incomplete")


def validate_checkpoint_dir(directory: Path) -> Path:
    """A usable checkpoint directory has a config.json and at least one *.safetensors file."""
    if not directory.is_dir():
        raise SpecdeployError(
            f"checkpoint directory {directory} does not exist: check the path in the recipe"
        )
    missing = [
        what
        for what, present in (
            ("config.json", (directory / "config.json").is_file()),
            ("*.safetensors weights", any(directory.glob("*.safetensors"))),
        )
        if not present
    ]
    if missing:
        raise SpecdeployError(
            f"{directory} is not a Hugging Face checkpoint: no {' and no '.join(missing)}; "
            "point the recipe at the directory that holds config.json and the safetensors files"
        )
    return directory


def resolve_zoo_model(path: str) -> Path:
    """`zoo:NAME` -> the shipped tiny model's directory, through the zoo registry."""
    from specdeploy.zoo.registry import resolve_model_path  # imported on use: it loads transformers (slow)

    return Path(resolve_model_path(path))  # takes `zoo:NAME` whole, as the engine's loader does


def rich_tqdm_class(progress: Progress) -> type[tqdm]:
    """A tqdm class that draws into `progress` (huggingface_hub reports download progress through tqdm)."""

    class RichTqdm(tqdm):
        def __init__(self, *args, **kwargs) -> None:
            self._task = progress.add_task(kwargs.get("desc") or "download", total=None)
            super().__init__(*args, **kwargs)

        # tqdm keeps the counts (huggingface_hub even assigns `total` directly); only the drawing is replaced.
        def display(self, msg: str | None = None, pos: int | None = None) -> bool:
            progress.update(self._task, completed=self.n, total=self.total or None, description=self.desc)
            return True

    return RichTqdm


def download_from_hub(
    model: ModelRef,
    cache_dir: Path | None = None,
    console: Console | None = None,
    endpoint: str | None = None,
) -> Path:
    """snapshot_download at the pinned revision. Finished files stay in the cache, so a rerun after an
    interruption fetches only the missing ones (huggingface_hub >= 2 restarts a half-finished file)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HTTPError, LocalEntryNotFoundError

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        try:
            directory = snapshot_download(
                model.path,
                revision=model.revision,
                cache_dir=cache_dir,
                tqdm_class=rich_tqdm_class(progress),
                endpoint=endpoint,
            )
        # HTTP errors (401/403/404), and network failures when nothing is cached yet.
        except (HTTPError, LocalEntryNotFoundError) as exc:
            raise SpecdeployError(
                f"downloading {model.path}@{model.revision or 'main'} failed: {exc}; "
                "run `specdeploy up --dry-run` to see the preflight checks"
            ) from exc
    return Path(directory)


def fetch_model(
    model: ModelRef,
    cache_dir: Path | None = None,
    console: Console | None = None,
    endpoint: str | None = None,
) -> Path:
    """The local directory of one of the plan's checkpoints, downloading it if it comes from the Hub."""
    location = model_location(model.path)
    if location == "zoo":
        return validate_checkpoint_dir(resolve_zoo_model(model.path))
    if location == "local":
        return validate_checkpoint_dir(Path(model.path).expanduser())
    return validate_checkpoint_dir(download_from_hub(model, cache_dir, console, endpoint))
