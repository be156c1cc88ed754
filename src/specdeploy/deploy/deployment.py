"""deploy_up / deploy_down: a LaunchPlan to a healthy, smoke-tested, recorded server, and back."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from specdeploy.api_key import auth_headers, redact
from specdeploy.deploy.hardware import DetectedHardware, detect_hardware
from specdeploy.deploy.health import probe, wait_for_health
from specdeploy.deploy.launchers import LauncherName, LaunchHandle, get_launcher
from specdeploy.deploy.leases import release_lease, take_lease
from specdeploy.deploy.manifest import (
    DEFAULT_RUNS_ROOT,
    STATE_FILE,
    DeploymentRecord,
    EngineRecord,
    Manifest,
    default_run_dir,
    git_commit,
    image_digest,
    image_id,
    point_latest,
    read_manifest,
    read_state,
    runtime_versions,
    utc_now,
    write_manifest,
    write_state,
)
from specdeploy.deploy.preflight import PreflightReport, run_preflight
from specdeploy.deploy.processes import ProcessIdentity
from specdeploy.deploy.sglang_check import StartupCheck
from specdeploy.deploy.smoke import SmokeReport, compare_greedy, run_smoke_test
from specdeploy.deploy.weights import fetch_model, model_location
from specdeploy.errors import SpecdeployError
from specdeploy.plan.launch_plan import LaunchPlan

if TYPE_CHECKING:
    from huggingface_hub import HfApi

DEFAULT_HEALTH_TIMEOUT_S = 1800.0  # Kimi K2.6 on 8 GPUs loads ~600 GB of weights and captures CUDA graphs
DEFAULT_STOP_GRACE_S = 30.0


@dataclass
class Deployment:
    """A started server: where it runs, how to stop it, and the run directory that records it."""

    run_dir: Path
    record: DeploymentRecord
    manifest: Manifest | None = None  # None until the server became healthy

    @property
    def handle(self) -> LaunchHandle:
        return self.record.launcher

    @property
    def url(self) -> str:
        return self.handle.url


@dataclass(frozen=True)
class GreedyReference:
    """The smoke answers of an AR server of the same model, and where they were recorded."""

    smoke: SmokeReport
    source: str


def check_greedy(smoke: SmokeReport, reference: GreedyReference) -> None:
    """Record the comparison in `smoke`; refuse a server whose greedy answers differ from AR's."""
    smoke.greedy = compare_greedy(smoke, reference.smoke, reference.source)
    if smoke.greedy.passed:
        return
    worst = min(
        range(len(smoke.greedy.agreed)), key=lambda i: smoke.greedy.agreed[i] - smoke.greedy.required[i]
    )
    raise SpecdeployError(
        f"smoke test: greedy answers differ from the AR server's ({reference.source}): prompt {worst} agrees on "
        f"{smoke.greedy.agreed[worst]} of its first {smoke.greedy.required[worst]} {smoke.greedy.unit}; "
        "speculative decoding must reproduce AR at temperature 0, so this server is not measured (a wrong "
        "drafter, or an attention path the engine never tested): see `specdeploy logs`"
    )


@dataclass
class UpPreview:
    """What `up` would do (its `--dry-run`): the checks, the downloads and the exact launch command."""

    preflight: PreflightReport
    downloads: list[str]
    command: list[str]
    run_dir: Path


def needs_gpus(plan: LaunchPlan) -> bool:
    return plan.gpus.gpu_model is not None


def preview_up(
    plan: LaunchPlan,
    launcher: LauncherName,
    run_dir: Path,
    hardware: DetectedHardware | None = None,
    api: HfApi | None = None,
    startup_check: StartupCheck | None = None,
) -> UpPreview:
    if needs_gpus(plan) and hardware is None:
        hardware = detect_hardware()
    return UpPreview(
        preflight=run_preflight(plan, hardware, launcher, api=api, startup_check=startup_check),
        downloads=[
            f"{m.path}@{m.revision or 'main (unpinned)'} ({m.disk_bytes / 1e9:.1f} GB)"
            for m in plan.models
            if model_location(m.path) == "hub"
        ],
        command=get_launcher(launcher).command(plan, run_dir),
        run_dir=run_dir,
    )


def _server_info(base_url: str) -> dict | None:
    # Imported here: httpx and huggingface_hub cost `specdeploy --help` a good part of a second.
    import httpx

    try:
        response = httpx.get(f"{base_url}/server_info", timeout=10.0, headers=auth_headers())
    except httpx.HTTPError:
        return None
    # SGLang lists its --api-key among the server arguments
    return redact(response.json()) if response.status_code == 200 else None


def deploy_up(
    plan: LaunchPlan,
    launcher: LauncherName,
    run_dir: Path | None = None,
    *,
    runs_root: Path = DEFAULT_RUNS_ROOT,
    hardware: DetectedHardware | None = None,
    health_timeout_s: float = DEFAULT_HEALTH_TIMEOUT_S,
    smoke: bool = True,
    api: HfApi | None = None,
    console: Console | None = None,
    show_preflight: Callable[[PreflightReport], None] | None = None,
    greedy_reference: GreedyReference | None = None,
    owner: ProcessIdentity | None = None,
    startup_check: StartupCheck | None = None,
) -> Deployment:
    """Preflight, weights, launch, health wait, smoke test, manifest. Stops the server again on any failure.

    `show_preflight` sees the checks before anything is downloaded, whether they passed or not.
    `greedy_reference`: an AR server's smoke answers, which this server's greedy answers must reproduce.
    `owner`: the process that will stop the server (deploy/orphans.py stops it if that process is killed).
    `startup_check`: SGLang's own start-up validation, run in the preflight (a refusal stops the deploy).
    """
    console = console or Console(stderr=True)
    # Absolute, so that the recorded log path works from any directory a later command runs in.
    run_dir = (run_dir or default_run_dir(plan, runs_root)).resolve()
    if (run_dir / STATE_FILE).is_file() and read_state(run_dir).state in ("starting", "running"):
        # Overwriting the state file would lose the only handle on a server that may still hold the GPUs.
        raise SpecdeployError(
            f"{run_dir} already holds a deployment that was not stopped: `specdeploy down {run_dir}` first, "
            "or choose another --run-dir"
        )
    if needs_gpus(plan) and hardware is None:
        hardware = detect_hardware()
    preflight = run_preflight(plan, hardware, launcher, api=api, startup_check=startup_check)
    if show_preflight is not None:
        show_preflight(preflight)
    preflight.raise_on_failure()
    weights = {model.path: str(fetch_model(model, console=console)) for model in plan.models}

    chosen = get_launcher(launcher)
    command = chosen.command(plan, run_dir)
    started_at = utc_now()
    start = time.monotonic()
    if owner is not None:
        take_lease(run_dir, owner)  # before the start: a kill right after it must not lose the server
    try:
        handle = chosen.start(plan, run_dir)
    except BaseException:
        release_lease(run_dir)
        raise
    record = DeploymentRecord(
        state="starting", recipe=plan.recipe, mode=plan.mode, launcher=handle, updated_at=started_at
    )
    # Everything from here to the return is covered: a signal that lands while the manifest is written
    # (after the server became healthy) must stop the server too, or it outlives its command.
    try:
        write_state(run_dir, record)
        point_latest(run_dir, runs_root)
        wait_for_health(
            handle.url,
            is_alive=lambda: chosen.is_running(handle),
            log_tail=lambda lines: chosen.tail(handle, lines),
            timeout_s=health_timeout_s,
            console=console,
        )
        healthy_at = utc_now()
        startup_s = time.monotonic() - start
        smoke_report: SmokeReport | None = (
            run_smoke_test(handle.url, speculative=plan.mode != "ar") if smoke else None
        )
        if smoke_report is not None and greedy_reference is not None:
            check_greedy(smoke_report, greedy_reference)
        manifest = Manifest(
            plan=plan.to_json_dict(),
            git_commit=git_commit(),
            engine=EngineRecord(
                name=plan.engine.name,
                version=plan.engine.version,
                image=plan.engine.image,
                image_digest=image_digest(plan.engine.image)
                if launcher == "docker" and plan.engine.image
                else None,
                image_id=image_id(plan.engine.image) if launcher == "docker" and plan.engine.image else None,
            ),
            hardware=hardware,
            launcher=handle,
            launch_command=command,
            weights=weights,
            preflight=preflight.checks,
            smoke=smoke_report,
            server_info=_server_info(handle.url),
            started_at=started_at,
            healthy_at=healthy_at,
            startup_s=round(startup_s, 2),
            **runtime_versions(),
        )
        write_manifest(run_dir, manifest)
        running = record.model_copy(update={"state": "running", "updated_at": utc_now()})
        write_state(run_dir, running)
        return Deployment(run_dir=run_dir, record=running, manifest=manifest)
    except BaseException as exc:  # includes Ctrl-C: never leave a half-started server holding the GPUs
        chosen.stop(handle, DEFAULT_STOP_GRACE_S)
        failed = record.model_copy(update={"state": "failed", "updated_at": utc_now(), "error": str(exc)})
        write_state(run_dir, failed)
        release_lease(run_dir)
        raise


def deployment_facts(plan: LaunchPlan, deployment: Deployment) -> dict[str, Any]:
    """What a bench run's manifest records about the deployment behind it (reports group runs by these)."""
    return {
        "recipe": plan.recipe,
        "hardware": plan.hardware,
        "interconnect": plan.gpus.interconnect,
        "mode": plan.mode,
        "budget": plan.budget,
        "tp": plan.tp,
        "engine": f"{plan.engine.name} {plan.engine.version}",
        "deploy_dir": str(deployment.run_dir),
        "plan": plan.to_json_dict(),
        "deploy_manifest": deployment.manifest.model_dump(mode="json") if deployment.manifest else None,
    }


def load_deployment(run_dir: Path) -> Deployment:
    """A deployment recorded by an earlier `up`, from its run directory."""
    return Deployment(run_dir=run_dir, record=read_state(run_dir), manifest=read_manifest(run_dir))


def deploy_down(deployment: Deployment, grace_s: float = DEFAULT_STOP_GRACE_S) -> Deployment:
    """Stop the server (SIGTERM, then SIGKILL after `grace_s`) and mark the run directory stopped."""
    get_launcher(deployment.handle.launcher).stop(deployment.handle, grace_s)
    stopped = deployment.record.model_copy(update={"state": "stopped", "updated_at": utc_now()})
    write_state(deployment.run_dir, stopped)
    release_lease(deployment.run_dir)
    return Deployment(run_dir=deployment.run_dir, record=stopped, manifest=deployment.manifest)


def deployment_status(deployment: Deployment) -> dict:
    """The `status --json` document: recorded state plus whether the server is alive and healthy now."""
    launcher = get_launcher(deployment.handle.launcher)
    alive = launcher.is_running(deployment.handle)
    healthy = False
    if alive:
        import httpx

        with httpx.Client(timeout=10.0, headers=auth_headers()) as client:
            healthy = probe(client, deployment.url, ["/health"])
    return {
        "schema": 1,
        "run_dir": str(deployment.run_dir),
        "state": deployment.record.state,
        "recipe": deployment.record.recipe,
        "mode": deployment.record.mode,
        "launcher": deployment.handle.model_dump(mode="json"),
        "url": deployment.url,
        "alive": alive,
        "healthy": healthy,
        "updated_at": deployment.record.updated_at,
        "error": deployment.record.error,
    }
