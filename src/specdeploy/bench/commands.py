"""`specdeploy bench` and `specdeploy bench-selftest`: option parsing and presentation only."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from specdeploy.bench.compare import run_compare
from specdeploy.bench.display import (
    cell_progress,
    compare_tables,
    selftest_table,
    speedup_table,
    summary_table,
)
from specdeploy.bench.fakeserver import StreamPlan
from specdeploy.bench.load import run_load
from specdeploy.bench.other_clients import DEFAULT_CLIENTS_DIR
from specdeploy.bench.runner import BenchConfig, run
from specdeploy.bench.selftest import run_selftest
from specdeploy.errors import SpecdeployError
from specdeploy.modes import MODES, parse_budget
from specdeploy.recipes.thinking import THINKING_SETTINGS


def parse_list(text: str | None, kind: type, option: str) -> list[Any]:
    """'1,4,16' -> [1, 4, 16], with an error that names the option."""
    if not text:
        return []
    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise SpecdeployError(f"{option} takes comma-separated numbers like 1,4,16; got {text!r}") from exc


def parse_kwargs(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecdeployError(
            f'--chat-template-kwargs must be a JSON object like {{"thinking": false}}: {exc}'
        ) from exc
    if not isinstance(value, dict):
        raise SpecdeployError('--chat-template-kwargs must be a JSON object like {"thinking": false}')
    return value


def bench(
    url: str = typer.Option(
        ..., help="Server to measure (SGLang or specdeploy serve), e.g. http://127.0.0.1:30000."
    ),
    dataset: str = typer.Option(
        ..., help="gsm8k, humaneval, math500, mbpp, mt-bench, spec-bench, sharegpt, random, custom."
    ),
    baseline_url: str | None = typer.Option(
        None, help="AR server for the paired baseline (same prompts, sampling)."
    ),
    baseline_run: Path | None = typer.Option(
        None, help="Earlier run directory whose cells are the baseline."
    ),
    data_dir: Path | None = typer.Option(
        None, help="Local dataset file or directory (original format); else download."
    ),
    category: str | None = typer.Option(
        None, help="Only this category (spec-bench: mt_bench, translation, qa, ...)."
    ),
    num_prompts: int | None = typer.Option(None, help="First N prompts of the dataset (default: all)."),
    concurrency: str | None = typer.Option(None, help="Fixed-concurrency levels, e.g. 1,4,16 (default 1)."),
    request_rate: str | None = typer.Option(None, help="Poisson request rates in requests/s, e.g. 2,8."),
    duration: float | None = typer.Option(
        None, help="Seconds per cell instead of one pass over the prompts."
    ),
    repeats: int = typer.Option(1, help="Repeats of every cell (the CI resamples them)."),
    warmup: int = typer.Option(2, help="Unmeasured requests per server before the first cell."),
    max_new_tokens: int = typer.Option(256, help="Generation limit per request (natural EOS stops earlier)."),
    temperature: float = typer.Option(
        0.0, help="Sampling temperature; 0 is greedy and enables the output match."
    ),
    route: str = typer.Option(
        "generate", help="generate (native, per-request acceptance), chat or completions."
    ),
    chat_template: bool = typer.Option(
        True, help="Apply the model's chat template (generate/completions: client side)."
    ),
    chat_template_kwargs: str | None = typer.Option(None, help="JSON, e.g. '{\"thinking\": false}'."),
    thinking: str | None = typer.Option(
        None, help="on | off: a thinking model's setting (required for one; sent in chat_template_kwargs)."
    ),
    tokenizer: str | None = typer.Option(
        None, help="Tokenizer for the chat template (default: the server's model path)."
    ),
    model: str | None = typer.Option(
        None, help="Model name for the OpenAI routes (default: from /v1/models)."
    ),
    mode: str = typer.Option(
        "",
        help=f"The target's mode ({', '.join(MODES)}), checked against its /server_info; left out: taken from "
        "there where the server names it.",
    ),
    budget: str | None = typer.Option(
        None, help="The target's DDTree budget (a number or auto), checked the same way."
    ),
    timeout: float = typer.Option(600.0, help="Seconds before a request counts as timed out."),
    seed: int = typer.Option(0, help="Seed of random prompts and Poisson arrivals."),
    random_input_len: int = typer.Option(512, help="random dataset: prompt tokens."),
    random_output_len: int = typer.Option(256, help="random dataset: output tokens (ignore_eos)."),
    random_vocab_size: int = typer.Option(32000, help="random dataset: token ids are drawn below this."),
    price_per_gpu_hour: float | None = typer.Option(
        None,
        help="USD per GPU-hour: each cell's telemetry states $ per million tokens on the GPUs it sampled.",
    ),
    out: Path | None = typer.Option(None, help="Run directory (default runs/bench-<UTC time>)."),
    resume: bool = typer.Option(False, help="Continue the run in --out, measuring only its missing cells."),
    json_output: bool = typer.Option(False, "--json", help="Print summary.json instead of tables."),
) -> None:
    """Benchmark a server: sweeps, repeats, paired baseline; every finished cell is saved at once."""
    if route not in ("generate", "chat", "completions"):
        raise SpecdeployError(f"--route must be generate, chat or completions, got {route!r}")
    if resume and out is None:
        raise SpecdeployError("--resume needs --out: the run directory to continue")
    if thinking not in (None, *THINKING_SETTINGS):
        raise SpecdeployError(f"--thinking must be on or off, got {thinking!r}")
    config = BenchConfig(
        url=url,
        baseline_url=baseline_url,
        baseline_run=str(baseline_run) if baseline_run else None,
        dataset=dataset,
        data_dir=str(data_dir) if data_dir else None,
        category=category,
        num_prompts=num_prompts,
        concurrency=parse_list(concurrency, int, "--concurrency"),
        request_rates=parse_list(request_rate, float, "--request-rate"),
        duration_s=duration,
        repeats=repeats,
        warmup=warmup,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        route=route,
        chat_template=chat_template,
        chat_template_kwargs=parse_kwargs(chat_template_kwargs),
        tokenizer=tokenizer,
        model=model,
        mode=mode,
        budget=parse_budget(budget),
        timeout_s=timeout,
        seed=seed,
        random_input_len=random_input_len,
        random_output_len=random_output_len,
        random_vocab_size=random_vocab_size,
        price_per_gpu_hour=price_per_gpu_hour,
        thinking=thinking,
    )
    out = out or Path("runs") / f"bench-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}"
    console = Console(stderr=json_output)
    with cell_progress(console) as progress:
        summary = run(config, out, resume=resume, progress=progress)
    if json_output:
        typer.echo(summary.model_dump_json(by_alias=True, indent=2))
        return
    console.print(summary_table(summary))
    if summary.speedups:
        console.print(speedup_table(summary))
    console.print(f"results in {out}")


def bench_selftest(
    concurrency: str = typer.Option("1,16,64,256", help="Concurrency levels to try."),
    ttft_ms: float = typer.Option(20.0, help="The loopback server's time to first chunk."),
    gap_ms: float = typer.Option(10.0, help="The loopback server's gap between chunks."),
    tokens_per_chunk: int = typer.Option(
        4, help="Tokens in every chunk (speculative decoding sends several)."
    ),
    output_tokens: int = typer.Option(128, help="Tokens per answer."),
    rounds: int = typer.Option(3, help="Requests per concurrent user at each level."),
    compare: str | None = typer.Option(
        None,
        help="Instead, run specdeploy's client and these on the same levels, in turn at each level, against "
        "the same server, judged by its log (two tables): any of sglang (its /generate and /v1/completions "
        "backends), aiperf, guidellm. Each is used if installed; a missing one is named with its install command.",
    ),
    clients_dir: Path = typer.Option(
        DEFAULT_CLIENTS_DIR, help="Where --compare looks first for the clients' venvs (DIR/aiperf/bin, ...)."
    ),
    json_output: bool = typer.Option(False, "--json", help="Print the results as JSON."),
) -> None:
    """Measure the bench client against a loopback server streaming at a known rate."""
    if min(ttft_ms, gap_ms) < 0 or tokens_per_chunk < 1 or output_tokens < 1 or rounds < 1:
        raise SpecdeployError("times must be >= 0 and tokens per chunk, output tokens and rounds >= 1")
    plan = StreamPlan(ttft_ms / 1e3, gap_ms / 1e3, tokens_per_chunk, output_tokens)
    levels = parse_list(concurrency, int, "--concurrency")
    if compare is not None:
        _compare(
            levels,
            plan,
            rounds,
            [n.strip() for n in compare.split(",") if n.strip()],
            clients_dir,
            json_output,
        )
        return
    results = run_selftest(levels, plan, rounds)
    if json_output:
        typer.echo(
            json.dumps({"plan": asdict(plan), "levels": [_plain(asdict(r)) for r in results]}, indent=2)
        )
        return
    Console().print(selftest_table(results))


def _compare(
    levels: list[int], plan: StreamPlan, rounds: int, names: list[str], clients_dir: Path, json_output: bool
) -> None:
    if not levels or min(levels) < 1:
        raise SpecdeployError(f"concurrency levels must be >= 1, got {levels}")
    console = Console(stderr=json_output)
    # Progress as plain lines: a live spinner's refresh thread would count in specdeploy's CPU per request.
    comparison = run_compare(
        levels, plan, rounds, names, clients_dir, lambda what: typer.echo(what, err=True)
    )
    for package, hint in comparison.missing.items():
        console.print(f"{package}: not installed, skipped; install it with: {hint}", soft_wrap=True)
    if json_output:
        rows = [asdict(r) for r in comparison.rows]
        typer.echo(json.dumps({"plan": asdict(plan), "rows": rows, "missing": comparison.missing}, indent=2))
        return
    for table in compare_tables(comparison.rows):
        console.print(table)


def _plain(value: Any) -> Any:
    """asdict leaves pydantic models inside; turn them into plain JSON values."""
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def load(
    url: Annotated[str, typer.Option(help="Server base URL, e.g. http://127.0.0.1:30000.")],
    concurrency: Annotated[int, typer.Option(help="Requests in flight at once.")] = 8,
    requests: Annotated[int, typer.Option(help="Requests in total.")] = 32,
    max_new_tokens: Annotated[int, typer.Option(help="New tokens per request (greedy).")] = 64,
    prompt: Annotated[
        str, typer.Option(help="Prompt text every request sends.")
    ] = "Write a short story about a lighthouse keeper.",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Send streaming /generate requests at a fixed concurrency; report requests/s, output tokens/s, errors."""
    report = asyncio.run(run_load(url, concurrency, requests, max_new_tokens, prompt))
    if as_json:
        typer.echo(report.to_json())
        return
    accept = "n/a" if report.mean_accept_length is None else f"{report.mean_accept_length:.2f}"
    typer.echo(
        f"concurrency {report.concurrency}  requests {report.requests}  errors {report.errors}  "
        f"{report.requests_per_s:.2f} req/s  {report.output_tokens_per_s:.1f} output tok/s  "
        f"mean latency {report.mean_latency_s:.2f} s  mean accept length {accept}"
    )
    for error in report.first_errors:
        typer.echo(f"  error: {error}")
