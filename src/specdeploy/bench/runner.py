"""Runs a benchmark: load points (fixed concurrency or Poisson rate) x repeats, target and baseline.

Each cell: flush the server's cache, send the prompts, then write the cell at once (records
appended, summary rewritten). A cell in which the server stopped answering is kept in
incomplete.jsonl and stops the run; `resume=True` then measures only the cells still missing.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

import specdeploy
from specdeploy.bench.client import SERVER_GONE, BenchClient, RequestLabel, error_kind
from specdeploy.bench.collector import collector_paused
from specdeploy.bench.metrics import cell_metrics, compare
from specdeploy.bench.payloads import ChatTemplate, Route, Sampling, build_payload, load_template
from specdeploy.bench.results import (
    CellKey,
    CellSummary,
    Comparison,
    RequestRecord,
    RunDirectory,
    RunManifest,
    RunSummary,
    new_run_id,
)
from specdeploy.bench.telemetry import CellSampler, cell_sampler
from specdeploy.bench.workloads import Prompt, WorkloadOptions, load_prompts
from specdeploy.errors import SpecdeployError
from specdeploy.modes import MODES, Budget
from specdeploy.recipes.thinking import Thinking, thinking_switch, with_thinking

Progress = Callable[[str, int, int | None], None]  # (cell id, requests done, requests planned)


class BenchConfig(BaseModel):
    """Everything that defines a run's cells and requests; saved in the manifest for --resume."""

    url: str
    baseline_url: str | None = None
    baseline_run: str | None = None
    dataset: str
    data_dir: str | None = None
    category: str | None = None
    num_prompts: int | None = None
    concurrency: list[int] = Field(default_factory=list)
    request_rates: list[float] = Field(default_factory=list)
    duration_s: float | None = None
    repeats: int = 1
    warmup: int = 2
    max_new_tokens: int = 256
    temperature: float = 0.0
    route: Route = "generate"
    chat_template: bool = True
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    tokenizer: str | None = None
    model: str | None = None
    mode: str = ""
    budget: Budget | None = None
    timeout_s: float = 600.0
    seed: int = 0
    random_input_len: int = 512
    random_output_len: int = 256
    random_vocab_size: int = 32000
    price_per_gpu_hour: float | None = None  # USD; each cell's telemetry then states $ per million tokens
    thinking: Thinking | None = None  # a thinking target's setting, sent through chat_template_kwargs

    def check(self) -> None:
        if self.baseline_url and self.baseline_run:
            raise SpecdeployError("give either --baseline-url or --baseline-run, not both")
        if any(c < 1 for c in self.concurrency):
            raise SpecdeployError(f"--concurrency values must be >= 1, got {self.concurrency}")
        if any(r <= 0 for r in self.request_rates):
            raise SpecdeployError(f"--request-rate values must be > 0, got {self.request_rates}")
        if self.repeats < 1 or self.warmup < 0:
            raise SpecdeployError("--repeats must be >= 1 and --warmup >= 0")
        if self.duration_s is not None and self.duration_s <= 0:
            raise SpecdeployError(f"--duration must be > 0 seconds, got {self.duration_s}")
        for url in (self.url, self.baseline_url):
            if url is not None and not url.startswith(("http://", "https://")):
                raise SpecdeployError(f"{url!r} is not a server URL: write it as http://HOST:PORT")

    def workload(self) -> WorkloadOptions:
        """The prompts this run sends, as `load_prompts` takes them."""
        return WorkloadOptions(
            dataset=self.dataset,
            data_dir=Path(self.data_dir) if self.data_dir else None,
            num_prompts=self.num_prompts,
            category=self.category,
            random_input_len=self.random_input_len,
            random_output_len=self.random_output_len,
            random_vocab_size=self.random_vocab_size,
            seed=self.seed,
        )

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.max_new_tokens, self.temperature, self.chat_template, self.chat_template_kwargs)

    def cells(self) -> list[CellKey]:
        """In run order: per load point and repeat, the baseline cell just before its target cell."""
        points = [(c, None) for c in self.concurrency] + [(None, r) for r in self.request_rates]
        roles = ("baseline", "target") if self.baseline_url else ("target",)
        return [
            CellKey(role=role, dataset=self.dataset, mode="" if role == "baseline" else self.mode,
                    budget=None if role == "baseline" else self.budget, concurrency=c, request_rate=r, repeat=k)
            for c, r in points or [(1, None)]
            for k in range(self.repeats)
            for role in roles
        ]  # fmt: skip


# Options that may change on --resume: where the servers are now, not what is measured.
RESUMABLE_CHANGES = {"url", "baseline_url", "timeout_s", "price_per_gpu_hour"}


def open_run(config: BenchConfig, out: Path, resume: bool) -> tuple[RunDirectory, BenchConfig]:
    """The run directory and the config to run: a resumed run keeps the manifest's cells."""
    run_dir = RunDirectory(out)
    if not resume:
        if run_dir.exists():
            raise SpecdeployError(
                f"{out} already holds a run: pass --resume to continue it or choose another --out"
            )
        return run_dir, config
    if not run_dir.exists():
        raise SpecdeployError(f"nothing to resume: {out} holds no run (drop --resume to start one)")
    saved = BenchConfig.model_validate(run_dir.read_manifest().options)
    given = config.model_dump(exclude=RESUMABLE_CHANGES)
    changed = sorted(k for k, v in saved.model_dump(exclude=RESUMABLE_CHANGES).items() if given[k] != v)
    if changed:
        raise SpecdeployError(
            f"--resume with options that differ from the run in {out}: {', '.join(changed)}"
        )
    run_dir.recover()
    return run_dir, saved.model_copy(update={k: getattr(config, k) for k in RESUMABLE_CHANGES})


def run(
    config: BenchConfig,
    out: Path,
    resume: bool = False,
    progress: Progress | None = None,
    deployment: dict[str, Any] | None = None,
    repeats: range | None = None,
) -> RunSummary:
    """Run (or resume) a benchmark into `out`; `deployment` facts go into a new run's manifest. `repeats`: measure
    only the cells of these repeats (a campaign's round: one server start), the rest are left missing."""
    config.check()
    run_dir, config = open_run(config, out, resume)
    return asyncio.run(_run(config, run_dir, progress or (lambda *_: None), deployment or {}, repeats))


@dataclass
class _Server:
    client: BenchClient
    model: str | None
    template: ChatTemplate | None


async def _run(
    config: BenchConfig,
    run_dir: RunDirectory,
    progress: Progress,
    deployment: dict[str, Any],
    repeats: range | None,
) -> RunSummary:
    prompts = load_prompts(config.workload())
    baseline_run = RunDirectory(config.baseline_run) if config.baseline_run else None
    if baseline_run is not None and not baseline_run.exists():
        raise SpecdeployError(f"--baseline-run {config.baseline_run} is not a run directory")
    async with AsyncExitStack() as stack:
        target = await _connect(stack, config, config.url, prompts)
        if not run_dir.exists():  # a resumed run keeps the kwargs its manifest recorded
            config = await _settle_thinking(config, target.client)
        servers = {"target": target}
        if config.baseline_url:
            servers["baseline"] = await _connect(stack, config, config.baseline_url, prompts)
        if not run_dir.exists():
            info = {role: await s.client.get_json("/server_info") for role, s in servers.items()}
            config = labelled_from_server(config, info["target"])
            run_dir.create(_manifest(config, deployment), info)
        finished = run_dir.finished_cells()
        todo = [
            key
            for key in config.cells()
            if key.id not in finished and (repeats is None or key.repeat in repeats)
        ]
        for role, server in servers.items():
            if any(key.role == role for key in todo):
                await _warm_up(server, config, prompts)
        for key in todo:
            server = servers[key.role]
            await server.client.flush_cache()
            records: list[RequestRecord] = []
            sampler = cell_sampler(server.client.url, config.price_per_gpu_hour)
            try:
                # A collection would stall every open stream at once; NVML is read on its own thread.
                with collector_paused(), sampler:
                    await _run_cell(server, key, config, prompts, records, progress)
            except BaseException:
                run_dir.write_incomplete(records)
                raise
            gone = [r for r in records if r.error and error_kind(r.error) in SERVER_GONE]
            if gone:
                run_dir.write_incomplete(records)
                raise SpecdeployError(
                    f"the server at {server.client.url} stopped answering during cell {key.id} "
                    f"({len(gone)} of {len(records)} requests failed, e.g. {gone[0].error}); its records are "
                    f"in incomplete.jsonl. Restart the server and rerun with --resume"
                )
            _write_cell(run_dir, key, records, config, baseline_run, sampler)
            run_dir.append_server_state(key.id, await server.client.get_json("/server_info"))
        if todo:
            run_dir.write_server_info_after(
                {role: await s.client.get_json("/server_info") for role, s in servers.items()}
            )
    return run_dir.read_summary()


async def _connect(stack: AsyncExitStack, config: BenchConfig, url: str, prompts: list[Prompt]) -> _Server:
    client = await stack.enter_async_context(BenchClient(url, config.route, config.timeout_s, config.model))
    if not await client.healthy():
        raise SpecdeployError(f"no server answers at {url}: start it (specdeploy up / serve) or fix --url")
    model = await client.model_name() if config.route != "generate" else None
    template = None
    needs_template = config.route != "chat" and config.chat_template and prompts[0].input_ids is None
    if needs_template:
        path = config.tokenizer or await _served_tokenizer(client)
        if path is None:
            raise SpecdeployError(
                f"{url} does not say where its tokenizer is: pass --tokenizer, --route chat, or --no-chat-template"
            )
        template = load_template(path)
    return _Server(client, model, template)


async def _settle_thinking(config: BenchConfig, client: BenchClient) -> BenchConfig:
    """A thinking target must be told whether to think: refused without a setting, spelled with one."""
    info = await client.get_json("/model_info") or {}
    found = thinking_switch(info.get("model_path"))
    how = '--thinking off or --thinking on (a campaign: thinking = ["off"], ["on"] or both)'
    kwargs = with_thinking(found, config.thinking, config.chat_template_kwargs, how)
    return config.model_copy(update={"chat_template_kwargs": kwargs})


async def _served_tokenizer(client: BenchClient) -> str | None:
    info = await client.get_json("/model_info") or {}
    return info.get("tokenizer_path") or info.get("model_path")


def served_mode(info: dict[str, Any] | None) -> tuple[str | None, Budget | None]:
    """The mode (and DDTree budget) a server's /server_info states: exact for the reference engine, which
    names its own; from SGLang only whether it speculates ("ar" or None for speculating: SGLang's names for
    the DFlash and DDTree algorithms vary with the build)."""
    if not info:
        return None, None
    engine = info.get("engine")
    if isinstance(engine, dict) and engine.get("mode") in MODES:
        return engine["mode"], engine.get("budget") if engine["mode"] == "ddtree" else None
    if "speculative_algorithm" in info and info["speculative_algorithm"] is None:
        return "ar", None
    return None, None


def labelled_from_server(config: BenchConfig, info: dict[str, Any] | None) -> BenchConfig:
    """--mode and --budget checked against what the server says it runs, or filled in from it when left out."""
    mode, budget = served_mode(info)
    speculating = info is not None and info.get("speculative_algorithm") is not None
    where = f"the server at {config.url}"
    if config.mode and mode is not None and config.mode != mode:
        raise SpecdeployError(f"--mode {config.mode}, but {where} runs {mode} (its /server_info): fix --mode")
    if config.mode == "ar" and speculating:
        raise SpecdeployError(
            f"--mode ar, but {where} runs {info['speculative_algorithm']} speculative decoding (its /server_info)"
        )
    if config.budget is not None and budget is not None and config.budget != budget:
        raise SpecdeployError(
            f"--budget {config.budget}, but {where} runs DDTree with budget {budget} (its /server_info): fix --budget"
        )
    if config.mode or mode is None:
        return config
    return config.model_copy(update={"mode": mode, "budget": config.budget if budget is None else budget})


def _manifest(config: BenchConfig, deployment: dict[str, Any]) -> RunManifest:
    return RunManifest(
        run_id=new_run_id(),
        created_unix=time.time(),
        specdeploy_version=specdeploy.__version__,
        options=config.model_dump(),
        deployment=deployment,
    )


async def _warm_up(server: _Server, config: BenchConfig, prompts: list[Prompt]) -> None:
    """Unmeasured requests first, so that lazy initialisation on the server is not timed."""
    label = RequestLabel(cell="warmup", index=0, prompt_id="", turn=0, cell_start_ns=0)
    payloads = [_payload(server, config, p, []) for p in prompts[: config.warmup]]
    await asyncio.gather(*(server.client.send(p, label) for p in payloads))


def _payload(server: _Server, config: BenchConfig, prompt: Prompt, answers: list[str]) -> dict[str, Any]:
    return build_payload(config.route, prompt, answers, config.sampling, server.model, server.template)


def _schedule(config: BenchConfig, prompts: list[Prompt]) -> Iterator[tuple[int, Prompt, str]]:
    """(index, prompt, prompt id) in send order; a duration cell cycles, renaming repeated prompts."""
    index = 0
    while config.duration_s is not None or index < len(prompts):
        cycle, position = divmod(index, len(prompts))
        prompt = prompts[position]
        yield index, prompt, prompt.id if cycle == 0 else f"{prompt.id}#{cycle}"
        index += 1


async def _run_cell(
    server: _Server,
    key: CellKey,
    config: BenchConfig,
    prompts: list[Prompt],
    records: list[RequestRecord],
    progress: Progress,
) -> None:
    """Send the cell's requests, appending each finished one to `records` (also on cancellation)."""
    start_ns = time.monotonic_ns()
    deadline = None if config.duration_s is None else start_ns + int(config.duration_s * 1e9)
    planned = None if deadline is not None else sum(len(p.turns) or 1 for p in prompts)
    schedule = _schedule(config, prompts)

    async def conversation(index: int, prompt: Prompt, prompt_id: str) -> None:
        answers: list[str] = []
        for turn in range(max(len(prompt.turns), 1)):
            label = RequestLabel(key.id, index, prompt_id, turn, start_ns)
            record = await server.client.send(_payload(server, config, prompt, answers), label)
            records.append(record)
            progress(key.id, len(records), planned)
            if not record.ok:
                return  # a later turn needs this turn's answer
            answers.append(record.output_text)

    def open_for_sending() -> bool:
        return deadline is None or time.monotonic_ns() < deadline

    if key.request_rate is None:

        async def worker() -> None:
            for item in schedule:  # the workers share one iterator: each item is sent once
                if not open_for_sending():
                    return
                await conversation(*item)

        await asyncio.gather(*(worker() for _ in range(key.concurrency or 1)))
        return
    arrivals = random.Random(f"{config.seed}/{key.repeat}")  # same arrival times for target and baseline
    tasks = []
    due_ns = start_ns
    try:
        for item in schedule:
            due_ns += int(arrivals.expovariate(key.request_rate) * 1e9)
            await asyncio.sleep(max(due_ns - time.monotonic_ns(), 0) / 1e9)
            if not open_for_sending():
                break
            tasks.append(asyncio.create_task(conversation(*item)))
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


def _write_cell(
    run_dir: RunDirectory,
    key: CellKey,
    records: list[RequestRecord],
    config: BenchConfig,
    baseline_run: RunDirectory | None,
    sampler: CellSampler,
) -> None:
    records.sort(key=lambda r: (r.index, r.turn))
    comparison = None
    speedups: dict[str, Comparison] = {}
    if key.role == "target":
        baseline = _baseline_records(run_dir, baseline_run, key)
        if baseline is not None:
            cell_id, base_records = baseline
            comparison = compare({key.repeat: records}, {key.repeat: base_records}, cell_id, _greedy(config))
            speedups[key.point_id] = _pooled(run_dir, baseline_run, key, records, config)
    metrics = cell_metrics(records)
    telemetry = sampler.result(metrics.output_tokens, metrics.duration_s)
    summary = CellSummary(
        key=key, metrics=metrics, comparison=comparison, telemetry=telemetry, finished_unix=time.time()
    )
    run_dir.write_cell(summary, records, speedups)


def _greedy(config: BenchConfig) -> bool:
    return config.temperature == 0


def _baseline_records(
    run_dir: RunDirectory, baseline_run: RunDirectory | None, key: CellKey
) -> tuple[str, list[RequestRecord]] | None:
    """The finished baseline cell for a target cell: in this run (role baseline) or an earlier run."""
    source, role = (baseline_run, "target") if baseline_run is not None else (run_dir, "baseline")
    for cell_id, cell in source.read_summary().cells.items():
        if cell.key.role == role and cell.key.load_point == key.load_point:
            return cell_id, source.read_records(cell_id)
    return None


def _pooled(
    run_dir: RunDirectory,
    baseline_run: RunDirectory | None,
    key: CellKey,
    records: list[RequestRecord],
    config: BenchConfig,
) -> Comparison:
    """The comparison over every finished repeat of this target load point, this cell included."""
    target = {key.repeat: records}
    baseline: dict[int, list[RequestRecord]] = {}
    for cell in run_dir.read_summary().cells.values():
        if cell.key.role == "target" and cell.key.point_id == key.point_id:
            target[cell.key.repeat] = run_dir.read_records(cell.key.id)
    baseline_point = ""
    for repeat in target:
        found = _baseline_records(run_dir, baseline_run, key.model_copy(update={"repeat": repeat}))
        if found is not None:
            baseline_point, baseline[repeat] = found[0].rsplit("/", 1)[0], found[1]
    return compare(target, baseline, baseline_point, _greedy(config))
