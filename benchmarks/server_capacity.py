"""How many streamed steps per second the HTTP server delivers when the engine is not the limit.

    python benchmarks/server_capacity.py --concurrency 16,64 --step-ms 0.5 --tokens-per-step 4 --out cap.json

The real server (`specdeploy serve`'s app, worker thread, routes and tokenizer, the zoo's tiny-code pair's
tokenizer and config) runs in a child process over an engine that computes nothing: each iteration sleeps
`--step-ms` (a GPU step's wait, with the interpreter released as a CUDA synchronisation releases it) and gives
every running request `--tokens-per-step` tokens cut from a code text. `specdeploy bench` (HumanEval, streamed
/generate, 128 new tokens, another process) then measures output tok/s at each concurrency; the figure is the
server's ceiling for that tokens-per-step, and the engine loop's times from /server_info say where the
iterations' time went; the mean time to first token is given as the client saw it, from the request's arrival in
the server, from its admission into the engine loop, and for the first token's handoff from the engine thread to
the event loop. `--switch-interval-ms` sets the server's interpreter switch interval (default: the
server's own). `--engine-process` runs the instant engine in a process of its own, as `specdeploy serve` runs its
engine (default: in a thread of the server's process).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from specdeploy.engine.batch import LoopTimes
from specdeploy.engine.request import Step, StopRules
from specdeploy.engine.runtime import load_engine
from specdeploy.server.engine_process import EngineRecipe
from specdeploy.zoo.registry import resolve_models

TEXT = '''def parse(path):
    """Read a CSV file into a list of rows, skipping the header."""
    with open(path) as handle:
        rows = [line.rstrip("\\n").split(",") for line in handle]
    return rows[1:]
'''


@dataclass(eq=False)
class InstantRequest:
    rules: StopRules
    tokens: list[int]
    done: int = 0
    finished: bool = False
    cancelled: bool = False


@dataclass
class InstantEvent:
    request: InstantRequest
    step: Step
    error: str | None = None


@dataclass
class InstantEngine:
    """The worker's `BatchingEngine` without a model: fixed-time steps of fixed length."""

    text_ids: list[int]
    step_s: float
    tokens_per_step: int
    max_running: int
    eos_token_ids: list[int]
    waiting: list[InstantRequest] = field(default_factory=list)
    running: list[InstantRequest] = field(default_factory=list)
    loop: LoopTimes = field(default_factory=LoopTimes)
    graphs_captured: int = 0
    startup_s: float = 0.0

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def idle(self) -> bool:
        return not (self.waiting or self.running)

    def submit(self, prompt_ids, params) -> InstantRequest:
        request = InstantRequest(StopRules(params, self.eos_token_ids), self.text_ids)
        self.waiting.append(request)
        return request

    def cancel(self, request: InstantRequest) -> None:
        request.cancelled = True

    def iterate(self) -> list[InstantEvent]:
        started = time.perf_counter()
        self.running = [r for r in self.running if not (r.finished or r.cancelled)]
        self.waiting = [r for r in self.waiting if not r.cancelled]
        events = []
        while self.waiting and len(self.running) < self.max_running:  # admitted with its first token
            request = self.waiting.pop(0)
            self.running.append(request)
            events.append(self._event(request, 1, 0))
        stepped = time.perf_counter()
        time.sleep(self.step_s)
        self.loop.seconds["step"] += time.perf_counter() - stepped
        events += [self._event(r, self.tokens_per_step, self.tokens_per_step) for r in self.running if
                   not r.finished]  # fmt: skip
        self.loop.iterations += 1
        self.loop.steps += 1
        self.loop.seconds["iterate"] += time.perf_counter() - started
        return events

    def _event(self, request: InstantRequest, count: int, verified: int) -> InstantEvent:
        ids = [request.tokens[(request.done + i) % len(request.tokens)] for i in range(count)]
        request.done += count
        step = request.rules.commit(ids, verified)
        request.finished = step.finish_reason is not None
        return InstantEvent(request, step)


@dataclass(frozen=True)
class InstantRecipe(EngineRecipe):
    """What the engine process builds: an `InstantEngine` (the model's paths and settings unused)."""

    text_ids: tuple[int, ...] = ()
    step_s: float = 0.0
    tokens_per_step: int = 1
    eos_token_ids: tuple[int, ...] = ()

    def engine_maker(self) -> Callable[[], InstantEngine]:
        return lambda: InstantEngine(list(self.text_ids), self.step_s, self.tokens_per_step, self.max_running,
                                     list(self.eos_token_ids))  # fmt: skip


def serve(args: argparse.Namespace) -> None:
    from specdeploy.server.launch import SWITCH_INTERVAL_S, serve_engine
    from specdeploy.server.service import ServerConfig

    target, _ = resolve_models("zoo:tiny-code", None, "ar", None)
    engine = load_engine(target, None, "ar", context_length=1024)
    text_ids = engine.tokenizer(TEXT)["input_ids"]
    eos = engine.target.config.eos_token_ids

    def instant(max_running: int, policy=None) -> InstantEngine:
        return InstantEngine(text_ids, args.step_ms / 1e3, args.tokens_per_step, max_running, eos)

    engine.batch_engine = instant
    interval = SWITCH_INTERVAL_S if args.switch_interval_ms is None else args.switch_interval_ms / 1e3
    recipe = None
    if args.engine_process:
        recipe = InstantRecipe(target, None, "ar", None, "cpu", "float32", None, 1024, args.max_running,
                               text_ids=tuple(text_ids), step_s=args.step_ms / 1e3,
                               tokens_per_step=args.tokens_per_step, eos_token_ids=tuple(eos))  # fmt: skip
    config = ServerConfig(max_running_requests=args.max_running, engine_recipe=recipe)
    serve_engine(engine, config, "127.0.0.1", args.port, "warning", switch_interval_s=interval)


def measure(args: argparse.Namespace) -> None:
    server = subprocess.Popen([sys.executable, __file__, "--serve", *sys.argv[1:]])
    url = f"http://127.0.0.1:{args.port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(0.3)
        with tempfile.TemporaryDirectory() as run:
            subprocess.run([sys.executable, "-m", "specdeploy.cli", "bench", "--url", url, "--dataset", "humaneval",
                            "--concurrency", args.concurrency, "--duration", str(args.duration), "--max-new-tokens",
                            "128", "--out", run], check=True, stdout=subprocess.DEVNULL)  # fmt: skip
            summary = json.loads((Path(run) / "summary.json").read_text())
            states = [
                json.loads(line) for line in (Path(run) / "server_states.jsonl").read_text().splitlines()
            ]
    finally:
        server.terminate()
        server.wait(30)
    cells = []
    for state in states:
        cell = summary["cells"][state["cell"]]
        concurrency, tok_s = cell["key"]["concurrency"], cell["metrics"]["output_tok_s"]
        internal = state["internal_states"][0]
        loop, latency = internal["engine_loop"], internal["server_latency"]
        ttft = cell["metrics"]["ttft_ms"]["mean"]
        cells.append({"concurrency": concurrency, "output_tok_s": round(tok_s, 1), "client_ttft_ms_mean": ttft,
                      "server_latency": latency, "engine_loop": loop})  # fmt: skip
        ms = loop["ms_per_iteration"]
        print(f"c={concurrency:3d}  {tok_s:9.1f} tok/s  iteration: step {ms['step']:.3f} "
              f"ms, rest {ms['rest_of_iteration']:.3f} ms, server between {ms['server_between_iterations']:.3f} ms",
              flush=True)  # fmt: skip
        print(f"       time to first token, mean: client {ttft:.1f} ms, server (from arrival) "
              f"{latency['ttft_ms_mean']:.1f} ms, engine loop (from admission) {loop['ms_admitted_to_first_token']:.1f} "
              f"ms, handoff to the event loop {latency['first_token_handoff_ms_mean']:.1f} ms; engine loop busy "
              f"{100 * loop['busy_share']:.0f}% of the cell; event loop lag mean "
              f"{latency['event_loop_lag_ms_mean']:.2f} ms, largest {latency['event_loop_lag_ms_max']:.1f} ms",
              flush=True)  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "cells": cells}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", default="16,64")
    parser.add_argument("--step-ms", type=float, default=0.5)
    parser.add_argument("--tokens-per-step", type=int, default=4)
    parser.add_argument("--max-running", type=int, default=64)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--switch-interval-ms", type=float)
    parser.add_argument("--engine-process", action="store_true")
    parser.add_argument("--port", type=int, default=30991)
    parser.add_argument("--out")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    serve(args) if args.serve else measure(args)


if __name__ == "__main__":
    main()
