"""The campaign's order of work: server configurations, each started once per round, and the runs each one serves.

Order: per TP size, the AR server first, then every speculative configuration (DDTree once per
budget); with `rounds` > 1 that order runs again, each server started once per round. Each
configuration runs every dataset as one bench run (concurrency x repeats x rounds cells; round r
measures repeats r * repeats to (r + 1) * repeats - 1); a speculative run names the AR run of the
same TP and dataset as its baseline run, so each of its cells is paired with the AR cell of the same
prompts, load point and repeat (so of the same round).

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
from specdeploy.plan.make import WorkingContext
from specdeploy.recipes.loader import load_hardware, load_recipe
from specdeploy.recipes.lock import LockFile
from specdeploy.recipes.thinking import Thinking, recipe_thinking, with_thinking

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
    repeats_per_round: int = 1

    @property
    def label(self) -> str:
        """The dataset, and the thinking setting it runs under when the target thinks."""
        return self.dataset + thinking_suffix(self.config.thinking)

    @property
    def name(self) -> str:
        return f"{self.server.id}/{self.label}"

    def cells(self) -> list[CellKey]:
        return self.config.cells()

    def round_repeats(self, round_: int) -> range:
        """The repeats that round `round_` (from 0) measures."""
        return range(round_ * self.repeats_per_round, (round_ + 1) * self.repeats_per_round)

    def missing_cells(self, round_: int | None = None) -> list[CellKey]:
        """Cells not yet finished, in run order (all of them before the run directory exists); of one round's
        repeats when `round_` is given."""
        run_dir = RunDirectory(self.path)
        finished = run_dir.finished_cells() if run_dir.exists() else set()
        repeats = None if round_ is None else self.round_repeats(round_)
        return [
            key
            for key in self.cells()
            if key.id not in finished and (repeats is None or key.repeat in repeats)
        ]


def server_configs(spec: CampaignSpec, lock: LockFile | None = None) -> list[CampaignServer]:
    """Every server configuration in start order; plans are made (and checked) before anything starts.

    `lock`: the campaign's lock file, which pins every plan (and refuses a drifted one).
    """
    _check_thinking(spec)
    working = working_context(spec)
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
                        working_context=working,
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


def working_context(spec: CampaignSpec) -> WorkingContext | None:
    """What the campaign's requests hold at their longest, for the plan's concurrency sizing: random workloads
    fix their prompt and output lengths; a dataset's prompts vary, so the recipe's figure stands in for them.
    None where the recipe sizes no concurrency from a working context."""
    recipe_tokens = load_recipe(spec.recipe).working_context_length
    if recipe_tokens is None:
        return None
    random_tokens = spec.bench.random_input_len + spec.bench.random_output_len
    if spec.datasets == ["random"]:
        return WorkingContext(random_tokens, "the working context of the campaign's random workloads")
    named = ", ".join(d for d in spec.datasets if d != "random")
    if "random" in spec.datasets and random_tokens > recipe_tokens:
        return WorkingContext(random_tokens, f"the campaign's random workloads (longer than {named} may be)")
    return WorkingContext(
        recipe_tokens, f"the recipe's working context (the campaign's {named} fix no lengths)"
    )


def bench_runs(spec: CampaignSpec, server: CampaignServer, out: Path) -> list[BenchRun]:
    """The runs of one server configuration, one per dataset (and thinking setting), in the file's order."""
    runs = []
    for dataset in spec.datasets:
        for thinking in spec.thinking or [None]:
            baseline = None if server.is_baseline else ar_run_path(out, server.plan.tp, dataset, thinking)
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
                repeats=spec.repeats * spec.rounds,
                max_new_tokens=spec.max_new_tokens,
                mode=server.plan.mode,
                budget=server.plan.budget,
                thinking=thinking,
                **options,
            )
            path = out / RUNS_DIR / server.id / (dataset + thinking_suffix(thinking))
            runs.append(BenchRun(server, dataset, path, config, spec.repeats))
    return runs


def thinking_suffix(thinking: Thinking | None) -> str:
    return "" if thinking is None else f"-thinking-{thinking}"


def _check_thinking(spec: CampaignSpec) -> None:
    """A thinking recipe runs with its settings named; a recipe that does not think takes none."""
    switch = recipe_thinking(load_recipe(spec.recipe))
    where = f"campaign {spec.name}"
    if switch is None and spec.thinking:
        raise SpecdeployError(f"{where}: recipe {spec.recipe} declares no thinking switch: remove `thinking`")
    if not spec.thinking:
        how = 'thinking = ["off"], ["on"] or ["off", "on"] (both, each run labelled) in the campaign file'
        try:
            with_thinking(switch, None, spec.bench.chat_template_kwargs, how)
        except SpecdeployError as exc:
            raise SpecdeployError(f"{where}: {exc}") from exc


def ar_server_id(tp: int) -> str:
    return f"tp{tp}-ar"


def ar_run_path(out: Path, tp: int, dataset: str, thinking: Thinking | None = None) -> Path:
    return out / RUNS_DIR / ar_server_id(tp) / (dataset + thinking_suffix(thinking))


def server_dir(out: Path, server: CampaignServer, start: int) -> Path:
    return out / SERVERS_DIR / server.id / f"start-{start}"
