"""Host time of `--budget auto`'s policy per call, in process: what a step's choice and observation cost the CPU.

    python benchmarks/policy_host_cost.py --rows 13 --calls 20000

A `BudgetPolicy` over budgets 0-64 with a synthetic start-up cost (three windows, row counts 1 to 64) and load
added (a GPU's policy), warmed with drafting steps, then timed call by call: `choose` (a cached ranking), `observe`
of a drafting step with every row's tree prediction, `observe_overhead`, and a refresh followed by a new ranking
(every REFRESH_EVERY steps in the engine). Prints microseconds per call; the policy's decisions are not the point.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from specdeploy.engine.budget import BudgetPolicy, CostCurve, StepCost  # noqa: E402

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
    for _ in range(2000):  # past the warm-up: calibration, load and overheads measured
        budget = policy.choose(rows, windows)
        policy.observe_overhead(5e-5)
        policy.observe(
            budget, accepted if budget else [1] * rows, 6e-4, prediction if budget else None, windows
        )
    timings = {
        "choose": per_call_us(lambda: policy.choose(rows, windows), args.calls),
        "observe, a drafting step": per_call_us(
            lambda: policy.observe(32, accepted, 6e-4, prediction, windows), args.calls
        ),
        "observe_overhead": per_call_us(lambda: policy.observe_overhead(5e-5), args.calls),
        "refresh, then a ranking": per_call_us(
            lambda: (policy.refresh(), policy.ranking(rows, windows)), args.calls
        ),
    }
    for name, us in timings.items():
        print(f"{name:26s} {us:7.2f} us a call ({rows} rows)")


if __name__ == "__main__":
    main()
