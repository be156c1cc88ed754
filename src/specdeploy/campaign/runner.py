"""Runs a campaign: each server configuration started once per round, its runs' cells of that round measured,
then stopped; the rounds run one after the other (every configuration once, then again).

A server that stops answering during a cell is recorded (state.json and the run's incomplete.jsonl),
restarted once and the cell retried; a second death during the same cell marks it failed, and the
campaign goes on with the next configuration. Ctrl-C or a crash loses no finished cell: `resume`
stops any server a crashed campaign left running and measures only the cells still missing.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from specdeploy.bench.results import RunDirectory
from specdeploy.bench.runner import Progress
from specdeploy.bench.runner import run as run_bench
from specdeploy.bench.workloads import SOURCES, load_prompts, local_dataset_file
from specdeploy.campaign.matrix import (
    BenchRun,
    CampaignServer,
    ar_server_id,
    bench_runs,
    server_configs,
    server_dir,
)
from specdeploy.campaign.spec import CampaignSpec
from specdeploy.campaign.state import (
    CampaignState,
    Death,
    ServerState,
    StartRecord,
    read_state,
    write_state,
)
from specdeploy.deploy.deployment import (
    Deployment,
    GreedyReference,
    deploy_down,
    deploy_up,
    deployment_facts,
    deployment_status,
    load_deployment,
)
from specdeploy.deploy.launchers import LauncherName
from specdeploy.deploy.manifest import STATE_FILE as DEPLOY_STATE_FILE
from specdeploy.deploy.manifest import read_manifest
from specdeploy.deploy.processes import ProcessIdentity
from specdeploy.errors import SpecdeployError
from specdeploy.plan.launch_plan import LaunchPlan
from specdeploy.recipes.lock import LockFile

CAMPAIGN_FILE = "campaign.json"
# What may change on --resume: how patiently servers are started and where they listen, not what is measured.
RESUMABLE_CHANGES = {"health_timeout_s", "smoke", "port", "launcher", "api_key"}

Log = Callable[[str], None]


class ServerControl(Protocol):
    """Starts and stops the campaign's servers; DeployControl does it through the deploy API."""

    def start(self, plan: LaunchPlan, deploy_dir: Path) -> Deployment: ...

    def stop(self, deployment: Deployment) -> None: ...

    def healthy(self, deployment: Deployment) -> bool: ...

    def stop_leftover(self, deploy_dir: Path) -> None: ...


class DeployControl:
    """deploy_up / deploy_down with the campaign's launcher; deployment records under the campaign."""

    def __init__(
        self,
        launcher: LauncherName,
        health_timeout_s: float,
        smoke: bool,
        runs_root: Path,
        console: Console,
        owner: ProcessIdentity | None = None,
    ) -> None:
        self.launcher = launcher
        self.owner = owner  # the process whose death deploy/orphans.py answers by stopping the servers
        self.health_timeout_s = health_timeout_s
        self.smoke = smoke
        self.runs_root = runs_root
        self.console = console

    def start(self, plan: LaunchPlan, deploy_dir: Path) -> Deployment:
        return deploy_up(
            plan,
            self.launcher,
            deploy_dir,
            runs_root=self.runs_root,
            health_timeout_s=self.health_timeout_s,
            smoke=self.smoke,
            console=self.console,
            greedy_reference=self.ar_reference(plan) if self.smoke and plan.mode != "ar" else None,
            owner=self.owner,
        )

    def ar_reference(self, plan: LaunchPlan) -> GreedyReference | None:
        """The smoke answers of this campaign's AR server at the same TP (it always starts first)."""
        ar_dir = self.runs_root / ar_server_id(plan.tp)
        starts = sorted(
            ar_dir.glob("start-*"), key=lambda d: int(d.name.removeprefix("start-")), reverse=True
        )
        for start in starts:
            manifest = read_manifest(start)
            if manifest is not None and manifest.smoke is not None:
                return GreedyReference(smoke=manifest.smoke, source=str(start))
        return None

    def stop(self, deployment: Deployment) -> None:
        deploy_down(deployment)

    def healthy(self, deployment: Deployment) -> bool:
        status = deployment_status(deployment)
        return bool(status["alive"] and status["healthy"])

    def stop_leftover(self, deploy_dir: Path) -> None:
        if not (deploy_dir / DEPLOY_STATE_FILE).is_file():
            return  # the crash came before the launcher started anything
        deployment = load_deployment(deploy_dir)
        if deployment.record.state in ("starting", "running"):
            deploy_down(deployment)


def default_launcher(spec: CampaignSpec, plan: LaunchPlan) -> LauncherName:
    if spec.launcher is not None:
        return spec.launcher
    return "reference" if plan.engine.name == "reference" else "docker"


class CellFailed(Exception):
    """A cell during which the server died twice: its configuration stops here."""


class ServerFailed(Exception):
    """A server that did not start."""


def open_campaign(spec: CampaignSpec, out: Path, resume: bool) -> CampaignState:
    """A new campaign directory, or the state of the one to resume (which must hold the same campaign)."""
    path = out / CAMPAIGN_FILE
    if not resume:
        if path.exists():
            raise SpecdeployError(
                f"{out} already holds a campaign: pass --resume to continue it or choose another --out"
            )
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(spec.model_dump_json(indent=2) + "\n", encoding="utf-8")
        state = CampaignState(name=spec.name)
        write_state(out, state)
        return state
    if not path.exists():
        raise SpecdeployError(f"nothing to resume: {out} holds no campaign (drop --resume to start one)")
    saved = CampaignSpec.model_validate_json(path.read_text(encoding="utf-8"))
    changed = sorted(
        name
        for name in CampaignSpec.model_fields
        if name not in RESUMABLE_CHANGES and getattr(saved, name) != getattr(spec, name)
    )
    if changed:
        raise SpecdeployError(
            f"--resume with a campaign that differs from the one in {out} in: {', '.join(changed)}; "
            "resume with the original file, or start a new campaign with another --out"
        )
    return read_state(out)


class CampaignRun:
    """One execution of a campaign (a first run or a resume) and its bookkeeping."""

    def __init__(
        self,
        spec: CampaignSpec,
        out: Path,
        control: ServerControl,
        state: CampaignState,
        log: Log,
        progress: Progress | None = None,
    ) -> None:
        self.spec = spec
        self.out = out
        self.control = control
        self.state = state
        self.log = log
        self.progress = progress
        self.deaths: Counter[tuple[str, str]] = Counter()  # this execution's deaths per (run, cell)

    def save(self) -> None:
        write_state(self.out, self.state)

    def stop_leftovers(self) -> None:
        """Stop servers an earlier, crashed execution recorded as started and never stopped."""
        for server in self.state.servers.values():
            for start in server.starts:
                if start.outcome == "running":
                    self.control.stop_leftover(Path(start.deploy_dir))
                    start.outcome = "stopped"
            if server.status == "running":
                server.status = "interrupted"
        self.save()

    def execute(self, servers: list[CampaignServer], retry_failed: bool) -> CampaignState:
        rounds = self.spec.rounds
        for round_ in range(rounds):
            for index, server in enumerate(servers, 1):
                where = f"[{index}/{len(servers)}] {server.id}"
                if rounds > 1:
                    where = f"[round {round_ + 1}/{rounds}] {where}"
                self.execute_server(server, round_, where, retry_failed)
        return self.state

    def execute_server(self, server: CampaignServer, round_: int, where: str, retry_failed: bool) -> None:
        """Start `server` for round `round_` if any of its cells of that round is missing, and measure them."""
        state = self.state.server(server.id)
        runs = bench_runs(self.spec, server, self.out)
        if state.status == "failed" and not retry_failed:
            self.log(f"{where}: failed earlier ({state.error}); skipped (--retry-failed runs it again)")
            return
        state.complete_runs = [run.name for run in runs if not run.missing_cells()]
        if not any(run.missing_cells(round_) for run in runs):
            if len(state.complete_runs) == len(runs):
                state.status = "complete"
            self.save()
            self.log(f"{where}: all cells finished")
            return
        missing_baselines = [
            r.name for r in runs if r.config.baseline_run and not RunDirectory(r.config.baseline_run).exists()
        ]
        if missing_baselines:
            state.status, state.error = (
                "blocked",
                f"no AR baseline run for {', '.join(missing_baselines)}: the AR configuration did not run",
            )
            self.save()
            self.log(f"{where}: {state.error}; skipped")
            return
        self.serve(server, state, runs, round_, where)

    def serve(
        self, server: CampaignServer, state: ServerState, runs: list[BenchRun], round_: int, where: str
    ) -> None:
        """Start the server once, measure every missing cell of round `round_` of its runs, stop it."""
        state.status, state.error, state.failed_cells = "running", None, []
        self.save()
        deployment: Deployment | None = None
        try:
            self.log(f"{where}: starting ({server.plan.summary})")
            deployment = self.start(server, state)
            for run in runs:
                if run.missing_cells(round_):
                    self.log(f"{where}: {run.label} -> {run.path}")
                    deployment = self.measure(server, state, run, round_, deployment)
                    if not run.missing_cells():
                        state.complete_runs.append(run.name)
                    self.save()
            # more rounds to come leave it pending
            state.status = "complete" if len(state.complete_runs) == len(runs) else "pending"
        except (ServerFailed, CellFailed) as exc:
            state.status, state.error = "failed", str(exc)
            self.log(f"{where}: failed: {exc}; going on with the next configuration")
        except BaseException:
            state.status = "interrupted"
            raise
        finally:
            if state.starts and state.starts[-1].outcome == "running":
                if deployment is not None:
                    self.control.stop(deployment)
                else:  # interrupted between deploy_up's return and the assignment: its record still knows
                    self.control.stop_leftover(Path(state.starts[-1].deploy_dir))
                state.starts[-1].outcome = "stopped"
            self.save()

    def start(self, server: CampaignServer, state: ServerState) -> Deployment:
        deploy_dir = server_dir(self.out, server, len(state.starts) + 1)
        record = StartRecord(deploy_dir=str(deploy_dir), started_unix=time.time())
        state.starts.append(record)
        self.save()
        try:
            return self.control.start(server.plan, deploy_dir)
        except BaseException as exc:  # deploy_up stops what it started itself, Ctrl-C included
            record.outcome, record.error = "failed", str(exc) or type(exc).__name__
            self.save()
            if isinstance(exc, SpecdeployError):
                raise ServerFailed(f"server {server.id} did not start: {exc}") from exc
            raise

    def measure(
        self, server: CampaignServer, state: ServerState, run: BenchRun, round_: int, deployment: Deployment
    ) -> Deployment:
        """Run (or resume) round `round_` of one bench run; a death restarts the server once per cell. Returns
        the live server."""
        while True:
            config = run.config.model_copy(update={"url": deployment.url})
            try:
                run_bench(
                    config,
                    run.path,
                    resume=RunDirectory(run.path).exists(),
                    progress=self.progress,
                    deployment=self.facts(server, deployment),
                    repeats=run.round_repeats(round_),
                )
                return deployment
            except SpecdeployError as exc:
                if self.control.healthy(deployment):
                    raise  # the server is fine: a problem of the campaign itself, not a death
                missing = run.missing_cells(round_)
                cell = missing[0].id if missing else "-"
                state.deaths.append(
                    Death(
                        run=run.name,
                        cell=cell,
                        deploy_dir=str(deployment.run_dir),
                        unix=time.time(),
                        error=str(exc),
                    )
                )
                state.starts[-1].outcome = "died"
                self.save()
                self.control.stop(deployment)  # reap whatever is left of it (workers, a hung leader)
                self.deaths[(run.name, cell)] += 1
                if self.deaths[(run.name, cell)] > 1:
                    state.failed_cells.append(f"{run.name}:{cell}")
                    raise CellFailed(f"the server died twice during {run.name} cell {cell}") from exc
                self.log(f"server {server.id} died during {run.name} cell {cell}; restarting it once")
                deployment = self.start(server, state)

    def facts(self, server: CampaignServer, deployment: Deployment) -> dict[str, Any]:
        """What the bench run's manifest records about the deployment behind it."""
        return {"campaign": self.spec.name, "server": server.id, **deployment_facts(server.plan, deployment)}


def check_datasets(spec: CampaignSpec, servers: list[CampaignServer], out: Path, download: bool) -> list[str]:
    """Read every dataset's prompts as the bench runs will, before any server starts, so that short data or a
    failed download stops the campaign before a (possibly hour-long) server start. With download False, a
    dataset that only a download would give is left alone; the returned lines name those."""
    needs_network = []
    for run in bench_runs(spec, servers[0], out):  # every server's runs send the same prompts
        run.config.check()
        workload = run.config.workload()
        source = SOURCES.get(workload.dataset)
        if (
            not download
            and source is not None
            and local_dataset_file(workload.dataset, workload.data_dir, workload.cache_dir) is None
        ):
            needs_network.append(
                f"{workload.dataset} is not on this machine: the campaign downloads {source.url} before "
                "its first server starts (offline, put that file in the campaign's data_dir)"
            )
            continue
        load_prompts(workload)
    return needs_network


def run_campaign(
    spec: CampaignSpec,
    out: Path,
    control: ServerControl,
    resume: bool = False,
    retry_failed: bool = False,
    log: Log = print,
    progress: Progress | None = None,
    lock: LockFile | None = None,
) -> CampaignState:
    """Run (or resume) a campaign into `out`; returns its final state. `lock` pins every plan."""
    out = out.resolve()  # run manifests name their baseline run by path: the same from any directory
    servers = server_configs(spec, lock)  # every plan is made before anything starts: a bad one fails now
    check_datasets(spec, servers, out, download=True)  # so is every dataset read
    campaign = CampaignRun(spec, out, control, open_campaign(spec, out, resume), log, progress)
    if resume:
        campaign.stop_leftovers()
    return campaign.execute(servers, retry_failed)
