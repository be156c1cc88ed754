"""The run directory's record of a deployment: an immutable manifest and a small mutable state file."""

from __future__ import annotations

import json
import platform
import subprocess
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

import specdeploy
from specdeploy.api_key import redact
from specdeploy.deploy.hardware import DetectedHardware
from specdeploy.deploy.launchers import LaunchHandle
from specdeploy.deploy.preflight import CheckResult
from specdeploy.deploy.smoke import SmokeReport
from specdeploy.errors import SpecdeployError
from specdeploy.plan.launch_plan import LaunchPlan

MANIFEST_SCHEMA = 1
MANIFEST_FILE = "manifest.json"
STATE_FILE = "deployment.json"
# Holds the path of the newest deployment's run directory, for `down`/`status`/`logs` without arguments.
LATEST_POINTER = "latest-deployment"
DEFAULT_RUNS_ROOT = Path("runs")

DeploymentState = Literal["starting", "running", "failed", "stopped"]


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def default_run_dir(plan: LaunchPlan, runs_root: Path = DEFAULT_RUNS_ROOT) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return runs_root / f"{stamp}-{plan.recipe}-{plan.mode}"


class EngineRecord(BaseModel):
    name: str
    version: str
    image: str | None
    image_digest: str | None  # the image's repo digest, so the exact bits can be pulled again
    # the local image id that ran (the only identity of an image built here, such as the DDTree build)
    image_id: str | None = None


class Manifest(BaseModel):
    """Everything needed to reproduce this deployment or to tell two runs apart."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    schema_version: int = Field(MANIFEST_SCHEMA, alias="schema")
    plan: dict
    specdeploy_version: str
    git_commit: str | None  # of the specdeploy checkout, with "-dirty" when it has local changes
    engine: EngineRecord
    python: str
    torch: str | None  # the torch installed next to specdeploy (the reference engine's)
    hardware: DetectedHardware | None
    launcher: LaunchHandle
    launch_command: list[str]
    weights: dict[str, str]  # model path in the plan -> local directory it was loaded from
    preflight: list[CheckResult]
    smoke: SmokeReport | None
    server_info: dict | None  # the server's own /server_info, when it has one
    started_at: str
    healthy_at: str
    startup_s: float

    def to_json(self) -> str:
        # /server_info of SGLang lists its --api-key; nothing written may hold the key
        return json.dumps(redact(self.model_dump(mode="json", by_alias=True)), indent=2) + "\n"


class DeploymentRecord(BaseModel):
    """The state file: what later commands need to find, check and stop the deployment."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    schema_version: int = Field(MANIFEST_SCHEMA, alias="schema")
    state: DeploymentState
    recipe: str
    mode: str
    launcher: LaunchHandle
    updated_at: str
    error: str | None = None


def git_commit(directory: Path = Path(specdeploy.__file__).parent) -> str | None:
    """The project's commit when it runs from a git checkout; None for an installed wheel."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=directory,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return f"{commit}-dirty" if dirty else commit


def _inspect(image: str, template: str) -> str | None:
    try:
        result = subprocess.run(
            ["docker", "image", "inspect", "--format", template, image],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    return result.stdout.strip() or None


def image_digest(image: str) -> str | None:
    """`docker image inspect` repo digest of a pulled image; None for a local build, or without docker."""
    return _inspect(image, "{{index .RepoDigests 0}}")


def image_id(image: str) -> str | None:
    """The local image id (sha256:...) of `image`; None when docker or the image is absent."""
    return _inspect(image, "{{.Id}}")


def _installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)  # read from the package metadata: importing torch is slow
    except metadata.PackageNotFoundError:
        return None


def runtime_versions() -> dict[str, str | None]:
    return {
        "specdeploy_version": specdeploy.__version__,
        "python": platform.python_version(),
        "torch": _installed_version("torch"),
    }


def write_manifest(run_dir: Path, manifest: Manifest) -> Path:
    path = run_dir / MANIFEST_FILE
    path.write_text(manifest.to_json())
    return path


def write_state(run_dir: Path, record: DeploymentRecord) -> None:
    """Write the state file atomically: a concurrent `status` never reads half of it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    partial = run_dir / f".{STATE_FILE}.partial"
    partial.write_text(json.dumps(redact(record.model_dump(mode="json", by_alias=True)), indent=2) + "\n")
    partial.replace(run_dir / STATE_FILE)


def point_latest(run_dir: Path, runs_root: Path = DEFAULT_RUNS_ROOT) -> None:
    """Make `run_dir` the deployment that `down`, `status` and `logs` use when given no run directory."""
    runs_root.mkdir(parents=True, exist_ok=True)
    (runs_root / LATEST_POINTER).write_text(str(run_dir.resolve()) + "\n")


def read_manifest(run_dir: Path) -> Manifest | None:
    """The manifest of a deployment that became healthy; None for one that never did."""
    path = run_dir / MANIFEST_FILE
    return Manifest.model_validate_json(path.read_text()) if path.is_file() else None


def read_state(run_dir: Path) -> DeploymentRecord:
    path = run_dir / STATE_FILE
    if not path.is_file():
        raise SpecdeployError(
            f"{run_dir} holds no deployment ({STATE_FILE} missing): pass the run directory of `up`"
        )
    return DeploymentRecord.model_validate_json(path.read_text())


def find_run_dir(run_dir: Path | None, runs_root: Path = DEFAULT_RUNS_ROOT) -> Path:
    """The given run directory, or the newest deployment's when none is given."""
    if run_dir is not None:
        return run_dir
    pointer = runs_root / LATEST_POINTER
    if not pointer.is_file():
        raise SpecdeployError(
            f"no deployment found ({pointer} missing): start one with `specdeploy up`, or pass its run directory"
        )
    return Path(pointer.read_text().strip())
