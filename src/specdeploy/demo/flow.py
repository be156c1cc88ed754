"""The demo's flow: reference servers for AR and each speculative mode (through `up`'s deploy code), `bench`
of AR once, then of each speculative mode paired with that AR run on a small built-in workload, then the
report. As in a campaign: one AR figure, against which every mode's speedup is measured.

Run directory:
    OUT/workload.jsonl              the built-in prompts, as a `custom` bench dataset
    OUT/servers/<mode>/             each server's deployment record: plan, log, smoke test, manifest
    OUT/ar/                         the AR bench run, the baseline of the others
    OUT/<mode>/                     each speculative mode's bench run (paired with OUT/ar request by request)
    OUT/report.html                 the report of all three runs

Every server started is stopped again, also on Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from specdeploy.bench.results import RunSummary
from specdeploy.bench.runner import BenchConfig
from specdeploy.bench.runner import run as run_bench
from specdeploy.deploy.deployment import (
    Deployment,
    GreedyReference,
    deploy_down,
    deploy_up,
    deployment_facts,
)
from specdeploy.deploy.orphans import orphan_watch
from specdeploy.errors import SpecdeployError
from specdeploy.interrupts import sigterm_as_interrupt
from specdeploy.plan.launch_plan import LaunchPlan
from specdeploy.plan.make import make_plan
from specdeploy.report.commands import write_report
from specdeploy.report.rows import ReportRow
from specdeploy.zoo.prompts import DEMO_PROMPTS

HEALTH_TIMEOUT_S = 300.0
REPORT_FILE = "report.html"


@dataclass(frozen=True)
class DemoOptions:
    pair: str
    budget: int
    max_new_tokens: int
    prompts: int
    repeats: int
    out: Path


@dataclass(frozen=True)
class DemoRun:
    out: Path
    report: Path
    rows: list[ReportRow]  # the report's rows: the AR run's, then each mode's


def mode_label(mode: str, budget: int | None) -> str:
    return mode if budget is None else f"{mode}-{budget}"


def write_workload(options: DemoOptions) -> Path:
    path = options.out / "workload.jsonl"
    rows = [{"id": f"demo/{i}", "prompt": text} for i, text in enumerate(DEMO_PROMPTS[: options.prompts])]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def bench_config(
    options: DemoOptions, workload: Path, plan: LaunchPlan, url: str, baseline_run: Path | None
) -> BenchConfig:
    """Greedy, one request at a time, the raw prompts (the zoo's models complete code, they know no chat)."""
    return BenchConfig(
        url=url,
        baseline_run=None if baseline_run is None else str(baseline_run),
        dataset="custom",
        data_dir=str(workload),
        num_prompts=options.prompts,
        concurrency=[1],
        repeats=options.repeats,
        warmup=1,
        max_new_tokens=options.max_new_tokens,
        temperature=0.0,
        route="generate",
        chat_template=False,
        mode=plan.mode,
        budget=plan.budget,
    )


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on the loopback interface now (all held open until all are picked)."""
    with ExitStack() as stack:
        probes = [stack.enter_context(socket.socket()) for _ in range(count)]
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]


def run_demo(options: DemoOptions, say: Callable[[str], None], console: Console) -> DemoRun:
    """Serve, bench and report; returns where the report is and its rows."""
    if options.out.exists() and any(options.out.iterdir()):
        raise SpecdeployError(f"{options.out} is not empty: choose another --out for this demo run")
    options.out.mkdir(parents=True, exist_ok=True)
    workload = write_workload(options)
    modes = [("ar", None), ("dflash", None), ("ddtree", options.budget)]
    plans = {
        mode_label(mode, budget): make_plan(options.pair, "cpu", mode, budget=budget, port=port)
        for (mode, budget), port in zip(modes, free_ports(len(modes)), strict=True)
    }
    started: list[Deployment] = []

    def start(label: str, reference: GreedyReference | None) -> Deployment:
        plan = plans[label]
        say(f"starting the {label} reference server on port {plan.port}")
        deployment = deploy_up(
            plan,
            "reference",
            options.out / "servers" / label,
            runs_root=options.out / "servers",
            health_timeout_s=HEALTH_TIMEOUT_S,
            console=console,
            greedy_reference=reference,
            owner=owner,
        )
        started.append(deployment)
        manifest = deployment.manifest
        if manifest is not None:
            checked = " (greedy answers equal AR's)" if manifest.smoke and manifest.smoke.greedy else ""
            say(f"{label} server healthy in {manifest.startup_s:.1f} s{checked}")
        return deployment

    with orphan_watch() as owner, sigterm_as_interrupt():
        try:
            ar = start("ar", None)
            smoke = ar.manifest.smoke if ar.manifest else None
            reference = GreedyReference(smoke=smoke, source=str(ar.run_dir)) if smoke else None
            servers = {"ar": ar} | {label: start(label, reference) for label in plans if label != "ar"}
            ar_run = options.out / "ar"
            for label, deployment in servers.items():
                plan = plans[label]
                against = "" if label == "ar" else " against the ar run"
                say(f"bench {label}{against}: {options.prompts} prompts x {options.repeats} repeats")
                summary = run_bench(
                    bench_config(options, workload, plan, deployment.url, None if label == "ar" else ar_run),
                    options.out / label,
                    progress=cell_progress(say),
                    deployment=deployment_facts(plan, deployment),
                )
                check_errors(summary, label)
        finally:
            for deployment in reversed(started):
                deploy_down(deployment)
    report = options.out / REPORT_FILE
    _, rows = write_report([options.out], report)
    return DemoRun(options.out, report, rows)


def cell_progress(say: Callable[[str], None]) -> Callable[[str, int, int | None], None]:
    def progress(cell: str, done: int, planned: int | None) -> None:
        if done == planned:
            say(f"  {cell}: {done} requests")

    return progress


def check_errors(summary: RunSummary, label: str) -> None:
    failed = sum(cell.metrics.n_errors for cell in summary.cells.values())
    if failed:
        raise SpecdeployError(f"{failed} requests of the {label} run failed: see its records.jsonl")
