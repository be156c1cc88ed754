"""The campaign's order of work: server configurations, each started once, and the runs each one serves.

Order: per TP size, the AR server first, then every speculative configuration (DDTree once per
budget). Each configuration runs every dataset as one bench run (concurrency x repeats cells); a
speculative run names the AR run of the same TP and dataset as its baseline run, so each of its
cells is paired with the AR cell of the same prompts, load point and repeat.

Directory layout under the campaign's output directory::

    campaign.json                     the validated campaign (a resume must match it)
    state.json                        CampaignState: starts, deaths, failed cells, status per server
    servers/<server>/start-<n>/       one deployment run directory per server start (deploy manifest, log)
    runs/<server>/<dataset>/          one bench run directory per server configuration and dataset
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specdeploy.bench.results import CellKey, RunDirectory
from specdeploy.bench.runner import BenchConfig
from specdeploy.campaign.spec import CampaignSpec
from specdeploy.errors import SpecdeployError
from specdeploy.plan import make_plan
from specdeploy.plan.launch_plan import LaunchPlan
from specdeploy.recipes.loader import load_hardware
from specdeploy.recipes.lock import LockFile

SERVERS_DIR = "servers"
RUNS_DIR = "runs"


@dataclass(frozen=True)
class CampaignServer:
    """One server launch of the campaign and the plan that starts it."""

    plan: LaunchPlan

    @property
    def id(self) -> str:
        budget = "" if self.plan.budget is None else f"-b{self.plan.budget}"
        return f"tp{self.plan.tp}-{self.plan.mode}{budget}"

    @property
    def is_baseline(self) -> bool:
        return self.plan.mode == "ar"


@dataclass(frozen=True)
class BenchRun:
    """One bench run: a server configuration on one dataset, all concurrency levels and repeats."""

    server: CampaignServer
    dataset: str
    path: Path
    config: BenchConfig  # its url is the plan's; the campaign swaps in the started server's

    @property
    def name(self) -> str:
        return f"{self.server.id}/{self.dataset}"

    def cells(self) -> list[CellKey]:
        return self.config.cells()

    def missing_cells(self) -> list[CellKey]:
        """Cells not yet finished, in run order (all of them before the run directory exists)."""
        run_dir = RunDirectory(self.path)
        finished = run_dir.finished_cells() if run_dir.exists() else set()
        return [key for key in self.cells() if key.id not in finished]


def server_configs(spec: CampaignSpec, lock: LockFile | None = None) -> list[CampaignServer]:
    """Every server configuration in start order; plans are made (and checked) before anything starts.

    `lock`: the campaign's lock file, which pins every plan (and refuses a drifted one).
    """
    configs = []
    for tp in spec.tp_sizes:
        for mode in ["ar", *(m for m in spec.modes if m != "ar")]:
            for budget in spec.budgets if mode == "ddtree" else [None]:
                overrides = {"port": spec.port} if spec.port is not None else {}
                try:
                    plan = make_plan(
                        spec.recipe,
                        spec.hardware,
                        mode,
                        budget=budget,
                        tp=tp,
                        context_length=spec.context_length,
                        max_running_requests=spec.max_running_requests,
                        lock=lock,
                        api_key=spec.api_key,
                        **overrides,
                    )
                except SpecdeployError as exc:
                    where = (
                        f"mode {mode}"
                        + (f", budget {budget}" if budget else "")
                        + (f", tp {tp}" if tp else "")
                    )
                    raise SpecdeployError(f"campaign {spec.name}, {where}: {exc}") from exc
                configs.append(CampaignServer(plan))
    ids = [c.id for c in configs]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise SpecdeployError(
            f"campaign {spec.name} plans the same server twice ({', '.join(duplicates)}): the plan chose the "
            "same TP for two tp values; list distinct tp sizes the hardware supports"
        )
    return configs


def bench_runs(spec: CampaignSpec, server: CampaignServer, out: Path) -> list[BenchRun]:
    """The runs of one server configuration, one per dataset, in the campaign's dataset order."""
    runs = []
    for dataset in spec.datasets:
        baseline = None if server.is_baseline else ar_run_path(out, server.plan.tp, dataset)
        options = spec.bench.model_dump()
        if options["price_per_gpu_hour"] is None:  # [bench] overrides the profile's price
            options["price_per_gpu_hour"] = load_hardware(spec.hardware).price_per_gpu_hour
        config = BenchConfig(
            url=server.plan.base_url,
            baseline_run=None if baseline is None else str(baseline),
            dataset=dataset,
            data_dir=spec.data_dir,
            num_prompts=spec.num_prompts,
            concurrency=list(spec.concurrency),
            request_rates=list(spec.request_rates),
            repeats=spec.repeats,
            max_new_tokens=spec.max_new_tokens,
            mode=server.plan.mode,
            budget=server.plan.budget,
            **options,
        )
        runs.append(BenchRun(server, dataset, out / RUNS_DIR / server.id / dataset, config))
    return runs


def ar_server_id(tp: int) -> str:
    return f"tp{tp}-ar"


def ar_run_path(out: Path, tp: int, dataset: str) -> Path:
    return out / RUNS_DIR / ar_server_id(tp) / dataset


def server_dir(out: Path, server: CampaignServer, start: int) -> Path:
    return out / SERVERS_DIR / server.id / f"start-{start}"
