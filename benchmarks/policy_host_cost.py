"""Host time of `--budget auto`'s policy per call, in process: what a step's choice and observation cost the CPU.

    python benchmarks/policy_host_cost.py --rows 13 --calls 20000

A `BudgetPolicy` over budgets 0-64 with a synthetic start-up cost (three windows, row counts 1 to 64) and load
added (a GPU's policy), warmed with drafting steps that predict and tell what every smaller tree would have
committed (as the batch engine's do), then timed call by call: `choose` (a cached ranking), `observe` of a drafting
step with every row's tree prediction, and with what its smaller trees would have committed, `observe_overhead`,
and a refresh followed by a new ranking (every REFRESH_EVERY steps in the engine), and by a second one where the
largest budget's step reads the next attention window (what a choice then waits for); then
`StepRunner.step_windows`, which the batch engine calls before each auto step, on tiny-code's runner with as many
requests. Prints microseconds per call; the policy's decisions are not the point.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from specdeploy.engine.batch import BatchEngine  # noqa: E402
from specdeploy.engine.budget import BudgetPolicy, CostCurve, StepCost  # noqa: E402
from specdeploy.engine.loading import load_drafter, load_target  # noqa: E402
from specdeploy.engine.sampling import SamplingParams  # noqa: E402
from specdeploy.zoo.registry import resolve_models  # noqa: E402

BUDGETS = [0, 1, 2, 4, 8, 16, 32, 64]
ROWS_MEASURED = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]


def per_call_us(call: Callable[[], object], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=13, help="running requests")
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    cost = StepCost(
        {
            b: {
                w: CostCurve({r: 1e-4 * (3 + b * r / 64 + w / 1000) for r in ROWS_MEASURED})
                for w in (256, 1024, 2304)
            }
            for b in BUDGETS
        }
    )
    policy = BudgetPolicy(BUDGETS, cost, load_adds=True)
    rng = random.Random(0)
    rows, windows = args.rows, (256,) * len(BUDGETS)
    prediction = [[1 + 0.9 * min(b, 6) * rng.uniform(0.5, 0.7) for b in BUDGETS[1:]] for _ in range(rows)]
    accepted = [3] * rows

    def realised(
        budget: int,
    ) -> list[list[float]]:  # what each budget's tree would have committed, as steps tell
        return [[min(3.0, b + 1) if b <= budget else math.nan for b in BUDGETS[1:]] for _ in range(rows)]

    for _ in range(2000):  # past the warm-up: calibration, load and overheads measured
        budget = policy.choose(rows, windows)
        policy.predict_next = False
        policy.observe_overhead(5e-5)
        if budget:
            policy.observe(budget, accepted, 6e-4, prediction, windows, realised(budget))
        else:
            policy.observe(budget, [1] * rows, 6e-4, None, windows)
    told = realised(32)
    crossing = (*windows[:-1], 1024)
    timings = {
        "choose": per_call_us(lambda: policy.choose(rows, windows), args.calls),
        "observe, a drafting step": per_call_us(
            lambda: policy.observe(32, accepted, 6e-4, prediction, windows), args.calls
        ),
        "observe, a predicting step": per_call_us(
            lambda: policy.observe(32, accepted, 6e-4, prediction, windows, told), args.calls
        ),
        "observe_overhead": per_call_us(lambda: policy.observe_overhead(5e-5), args.calls),
        "refresh, then a ranking": per_call_us(
            lambda: (policy.refresh(), policy.ranking(rows, windows)), args.calls
        ),
        # the largest budget's step reads the next window (its tree crosses into it first): a second ranking
        "the same, and at a crossing": per_call_us(
            lambda: (policy.refresh(), policy.ranking(rows, windows), policy.ranking(rows, crossing)),
            args.calls,
        ),
    }
    timings.update(step_windows_us(rows, args.calls))
    for name, us in timings.items():
        print(f"{name:26s} {us:7.2f} us a call ({rows} rows)")


def step_windows_us(rows: int, calls: int) -> dict[str, float]:
    """`StepRunner.step_windows` (each budget's attention window, read before every auto step) on the CPU's
    windows (slots of 64) and on a GPU's (powers of two, from 256), with `rows` requests of tiny-code running."""
    engine = BatchEngine(*tiny_code(), "ddtree", max(BUDGETS), max_running=rows, max_context=512)
    for i in range(rows):
        engine.submit(list(range(5, 40 + i)), SamplingParams(max_new_tokens=64, ignore_eos=True))
    runner = engine.runner
    while len(runner.running) < rows or runner.prefill_remaining:
        engine.iterate()
    timings = {"step_windows, CPU windows": per_call_us(lambda: runner.step_windows(BUDGETS), calls)}
    runner.on_gpu = True  # the GPU's window sizes; nothing runs on the device
    timings["step_windows, GPU windows"] = per_call_us(lambda: runner.step_windows(BUDGETS), calls)
    return timings


def tiny_code():
    """The zoo's tiny-code target and drafter, in float32 on the CPU."""
    target_path, draft_path = resolve_models("zoo:tiny-code", None, "ddtree", max(BUDGETS))
    cpu = torch.device("cpu")
    return load_target(target_path, device=cpu, dtype=torch.float32), load_drafter(
        draft_path, device=cpu, dtype=torch.float32
    )


if __name__ == "__main__":
    main()
