"""The lock file: what `specdeploy lock` resolved for a recipe, read by plan, up and campaign.

Checkpoints to commit SHAs (with every file's size and LFS sha256), the container image to a digest, the
SGLang version inside it, and the DDTree build's commit with the pip pins of its dependencies. It lives
beside the recipe or campaign file it was made for; for a shipped recipe name, in the current directory.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from specdeploy.errors import SpecdeployError

LOCK_SCHEMA = "specdeploy.lock/1"
LOCK_SUFFIX = ".lock.json"


class _Locked(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, serialize_by_alias=True)


class LockedFile(_Locked):
    path: str
    size: int
    sha256: str | None  # the LFS object's sha256; None for small files git stores itself
    blob_id: str  # the git blob id (for LFS files, of the pointer)


class LockedModel(_Locked):
    path: str  # the Hub repo id, as the recipe names it
    requested: str  # the revision the recipe asked for ("main" when it pins none)
    revision: str  # the commit SHA that revision resolved to
    files: list[LockedFile]

    @field_validator("revision")
    @classmethod
    def _is_a_commit(cls, value: str) -> str:
        if len(value) != 40 or any(c not in "0123456789abcdef" for c in value):
            raise ValueError(f"{value!r} is not a 40-character commit SHA")
        return value

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


class LockedImage(_Locked):
    reference: str  # the tag specdeploy plans, e.g. lmsysorg/sglang:v0.5.23-cu130
    digest: str  # sha256:... of the manifest (list) that tag pointed to

    @field_validator("digest")
    @classmethod
    def _is_a_digest(cls, value: str) -> str:
        if not value.startswith("sha256:") or len(value) != 71:
            raise ValueError(f"{value!r} is not a sha256 digest")
        return value

    @property
    def pinned(self) -> str:
        """tag@digest: docker pulls by the digest and keeps the tag for people."""
        return f"{self.reference}@{self.digest}"


class LockedDDTree(_Locked):
    pr: int
    commit: str
    # name==version of every package pip installs for the build on the locked image, sorted
    constraints: list[str]


class LockFile(_Locked):
    schema_version: str = Field(LOCK_SCHEMA, alias="schema")
    recipe: str
    models: list[LockedModel]
    image: LockedImage
    sglang_version: str  # as the locked image reports it
    ddtree: LockedDDTree

    def model(self, path: str) -> LockedModel | None:
        return next((m for m in self.models if m.path == path), None)

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


def is_hub_id(path: str) -> bool:
    """Hub repo ids are locked; zoo models ship with specdeploy and local directories are the user's own."""
    return not path.startswith(("zoo:", "/", "./", "../", "~"))


def lock_path_for(source: str | Path) -> Path:
    """Where the lock of a recipe or campaign lives: beside its file; a shipped name's in this directory."""
    text = str(source)
    if text.endswith(".toml"):
        path = Path(text).expanduser()
        return path.with_name(path.name.removesuffix(".toml") + LOCK_SUFFIX)
    return Path(text + LOCK_SUFFIX)


def read_lock(path: Path) -> LockFile | None:
    """The lock at `path`, None when there is none; a damaged one is an error, never silently ignored."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SpecdeployError(
            f"lock file {path} is not valid JSON ({exc}): delete it and run `specdeploy lock`"
        ) from None
    if not isinstance(data, dict) or data.get("schema") != LOCK_SCHEMA:
        raise SpecdeployError(
            f"lock file {path} has schema {data.get('schema') if isinstance(data, dict) else None!r}, this "
            f"specdeploy reads {LOCK_SCHEMA!r}: run `specdeploy lock --update-lock`"
        )
    try:
        return LockFile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise SpecdeployError(
            f"lock file {path} is invalid ({problems}): run `specdeploy lock --update-lock`"
        ) from None


def write_lock(path: Path, lock: LockFile) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(lock.to_json(), encoding="utf-8")
    partial.replace(path)
