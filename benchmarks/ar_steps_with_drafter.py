"""What keeping a drafter ready costs AR steps: an AR engine against a drafting engine whose policy picks AR every step.

    python benchmarks/ar_steps_with_drafter.py --pair zoo:tiny-code --rows 8,64 --rounds 3

`--budget auto` at a load where drafting does not pay runs AR steps (budget 0) in an engine that holds a drafter: its
prefills also write the drafter's context, its steps keep the target's features and take them in every
PENDING_BLOCKS blocks, its rows move with the drafter's cache, and the policy observes every step. This runs the same
greedy requests (all admitted at once, new tokens cycling through `--new-tokens`) through both engines in turn, in process, on this
machine's device, and prints wall time and the engine loop's ms per iteration (prefill, step, policy, the rest of the
iteration, and the policy's work overlapped with the step). No exploring step is taken, so the gap is the overhead
alone, not the policy's choices.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from specdeploy.engine.batch import BatchEngine  # noqa: E402
from specdeploy.engine.budget import BudgetPolicy, CostCurve, StepCost  # noqa: E402
from specdeploy.engine.runtime import load_engine  # noqa: E402
from specdeploy.engine.sampling import SamplingParams  # noqa: E402
from specdeploy.zoo.registry import resolve_models  # noqa: E402

BUDGET = 16  # the drafting budget the policy could pick: it sizes the tree buffers, not these AR steps


class AlwaysAR(BudgetPolicy):
    """The policy's bookkeeping (observations, rankings), but an AR step every time."""

    def choose(self, running: int, window: int | None = None) -> int:
        self.choices += 1
        return 0


def run_engine(engine: BatchEngine, prompts: list[list[int]], params: list[SamplingParams]) -> float:
    for prompt, each in zip(prompts, params, strict=True):
        engine.submit(prompt, each)
    started = time.perf_counter()
    while not engine.idle:
        engine.iterate()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pair", default="zoo:tiny-code")
    parser.add_argument("--rows", default="8,64", help="requests running together")
    parser.add_argument("--new-tokens", default="24,48,36,60", help="per request, in turn")
    parser.add_argument("--prompt-tokens", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.device == "cpu":
        torch.set_num_threads(1)
    target_dir, draft_dir = resolve_models(args.pair, None, "ddtree", BUDGET)
    loaded = load_engine(target_dir, draft_dir, "ddtree", BUDGET, device=args.device)
    target, drafter = loaded.target, loaded.drafter
    vocab = target.config.vocab_size
    lengths = [int(n) for n in args.new_tokens.split(",")]
    context = args.prompt_tokens + max(lengths) + 64
    results: dict = {
        "command": " ".join(["python", "benchmarks/ar_steps_with_drafter.py", *sys.argv[1:]]),
        "rows": {},
    }
    for rows in (int(r) for r in args.rows.split(",")):
        prompts = [[(7 * i + j) % (vocab - 3) + 3 for j in range(args.prompt_tokens)] for i in range(rows)]
        params = [
            SamplingParams(max_new_tokens=lengths[i % len(lengths)], ignore_eos=True) for i in range(rows)
        ]
        cells: dict[str, list[dict]] = {"ar": [], "drafting engine, AR steps": []}
        for _ in range(args.rounds):
            for label in cells:
                if label == "ar":
                    engine = BatchEngine(target, None, "ar", None, max_running=rows, max_context=context)
                else:
                    # a start-up cost given, not measured: the policy's choice is fixed, its bookkeeping is not
                    cost = StepCost(
                        {b: {64: CostCurve({1: 1e-3 * (1 + b), rows: 2e-3 * (1 + b)})} for b in (0, BUDGET)}
                    )
                    engine = BatchEngine(target, drafter, "ddtree", BUDGET, max_running=rows, max_context=context,
                                         policy=AlwaysAR([0, BUDGET], cost))  # fmt: skip
                wall = run_engine(engine, prompts, params)
                loop = engine.loop.describe()
                cells[label].append({"wall_s": round(wall, 4), **loop})
                print(
                    f"{rows:3d} rows  {label:26s} wall {wall:6.3f} s  {loop['ms_per_iteration']}", flush=True
                )
        walls = {label: statistics.median(c["wall_s"] for c in runs) for label, runs in cells.items()}
        ratio = walls["drafting engine, AR steps"] / walls["ar"]
        print(
            f"{rows:3d} rows  drafting engine's AR steps take {ratio:.3f}x the AR engine's wall time (medians)"
        )
        results["rows"][rows] = {"cells": cells, "median_wall_ratio": round(ratio, 4)}
        if args.out:
            args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
