"""Real steps against the dead steps `--budget auto` prices them by, at the same shapes, stage by stage.

    python benchmarks/dead_vs_real_step.py --device cuda --rows 13 --budgets 16,32,64 --out dead_vs_real.json

The policy's start-up cost times dead steps (`StepRunner.dead_step`: the same kernels or CUDA graphs, rows that
hold no sequence and commit nothing). Behind a server on one H200, tiny-code's real steps took about 0.05, 0.08 and
0.11 ms more than their dead steps at budgets 16, 32 and 64 (13 rows; `benchmarks/results/h200-2026-12-05-step-
kernels/`), a gap that grows with the tree and which the policy, on a GPU, adds to every budget alike. This finds
out where it comes from, without a server: `--rows` requests of the zoo pair (`--pair`, the demo's code prompts,
EOS ignored) run real steps, budgets in turn, each step timed whole (to its host synchronisation) and per stage
(context, draft, tree, verify, accept, commit: CUDA events on a GPU, wall time on a CPU); then, the requests
cancelled, dead steps at each real step's rows, budget and attention window (its verify's) are timed the same
way. Prints, per budget, the medians of real and dead step ms, their gap, and each stage's real and dead ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from specdeploy.engine.batch import BatchEngine
from specdeploy.engine.loading import load_drafter, load_target
from specdeploy.engine.runtime import load_tokenizer
from specdeploy.engine.sampling import SamplingParams
from specdeploy.engine.step import StepRunner
from specdeploy.zoo.prompts import DEMO_PROMPTS
from specdeploy.zoo.registry import resolve_models


class StageClock:
    """Times every stage a runner runs (`StepRunner._run`, which real and dead steps both go through), by the
    first element of its graph key."""

    def __init__(self, runner: StepRunner) -> None:
        self.runner, self.run = runner, runner._run
        self.on_gpu = runner.device.type == "cuda"
        self.marks: list[tuple[str, object, object]] = []
        runner._run = self._timed  # an instance attribute: both kinds of step look it up there

    def _timed(self, key, stage, eager, protect, neutral) -> None:
        if self.on_gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.run(key, stage, eager, protect, neutral)
            end.record()
        else:
            start = time.perf_counter()
            self.run(key, stage, eager, protect, neutral)
            end = time.perf_counter()
        self.marks.append((key[0], start, end))

    def take(self) -> dict[str, float]:
        """Milliseconds per stage since the last call (after the step's synchronisation)."""
        stages: dict[str, float] = defaultdict(float)
        for name, start, end in self.marks:
            stages[name] += start.elapsed_time(end) if self.on_gpu else 1e3 * (end - start)
        self.marks.clear()
        return dict(stages)


def median_stages(cells: list[dict]) -> dict[str, float]:
    names = sorted({name for cell in cells for name in cell["stages"]})
    return {name: round(statistics.median(c["stages"].get(name, 0.0) for c in cells), 4) for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pair", default="tiny-code")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rows", type=int, default=13)
    parser.add_argument("--budgets", default="16,32,64")
    parser.add_argument("--steps", type=int, default=12, help="real steps timed per budget")
    parser.add_argument("--max-context", type=int, default=2048)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    budgets = [int(b) for b in args.budgets.split(",")]
    synchronize = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    target_path, draft_path = resolve_models(f"zoo:{args.pair}", None, "ddtree", max(budgets))
    target = load_target(target_path, device=device, dtype=dtype)
    drafter = load_drafter(draft_path, device=device, dtype=dtype)
    tokenize = load_tokenizer(target_path)
    engine = BatchEngine(
        target, drafter, "ddtree", max(budgets), max_running=args.rows, max_context=args.max_context
    )
    runner = engine.runner
    prompts = [tokenize(p)["input_ids"] for p in DEMO_PROMPTS]
    requests = [
        engine.submit(
            prompts[i % len(prompts)], SamplingParams(max_new_tokens=args.max_context // 2, ignore_eos=True)
        )
        for i in range(args.rows)
    ]
    while engine.num_waiting or runner.prefill_remaining or len(runner.running) < args.rows:
        engine.iterate()
    clock = StageClock(runner)
    for budget in budgets:  # warm-up: a first step at each budget may capture its graphs
        runner.step(budget)
    synchronize()
    clock.take()
    real: list[dict] = []
    for _ in range(args.steps):
        for budget in budgets:
            used = max(row.prefix for row in runner.running)
            if used + max(budgets) + 2 > runner.cache.capacity - 1:
                break
            (window,) = runner.step_windows([budget])  # what the policy reads this step's cost at
            synchronize()
            started = time.perf_counter()
            runner.step(budget)  # ends in its host synchronisation
            wall = time.perf_counter() - started
            real.append({"budget": budget, "rows": args.rows, "window": window, "ms": 1e3 * wall,
                         "stages": clock.take()})  # fmt: skip
    for request in requests:
        engine.cancel(request)
    while not engine.idle:
        engine.iterate()
    clock.take()
    dead: list[dict] = []
    for cell in real:
        runner.dead_step(cell["rows"], cell["budget"], cell["window"])  # warm-up at this shape
        synchronize()
        clock.take()
        started = time.perf_counter()
        runner.dead_step(cell["rows"], cell["budget"], cell["window"])
        synchronize()
        dead.append({**cell, "ms": 1e3 * (time.perf_counter() - started), "stages": clock.take()})
    summary = {}
    for budget in budgets:
        pairs = [(r, d) for r, d in zip(real, dead, strict=True) if r["budget"] == budget]
        if not pairs:
            continue
        row = {
            "steps": len(pairs),
            "windows": sorted({r["window"] for r, _ in pairs}),
            "real_ms": round(statistics.median(r["ms"] for r, _ in pairs), 4),
            "dead_ms": round(statistics.median(d["ms"] for _, d in pairs), 4),
            "gap_ms": round(statistics.median(r["ms"] - d["ms"] for r, d in pairs), 4),
            "real_stage_ms": median_stages([r for r, _ in pairs]),
            "dead_stage_ms": median_stages([d for _, d in pairs]),
        }
        summary[budget] = row
        print(f"budget {budget:3d}, {args.rows} rows, windows {row['windows']}: real {row['real_ms']:.3f} ms, dead "
              f"{row['dead_ms']:.3f}, gap {row['gap_ms']:.3f} (median of {row['steps']} pairs)")  # fmt: skip
        for name in row["real_stage_ms"]:
            print(
                f"    {name:8s} real {row['real_stage_ms'][name]:.4f}  dead {row['dead_stage_ms'].get(name, 0.0):.4f}"
            )
    if args.out:
        result = {
            "command": " ".join(["python", "benchmarks/dead_vs_real_step.py", *sys.argv[1:]]),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "summary": summary,
            "real": real,
            "dead": dead,
        }
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
