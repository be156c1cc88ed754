"""The adaptive DDTree budget: each step's tree size chosen from how many requests share the step.

A bigger tree commits more tokens per step but costs more to verify, and the verify cost grows with the
tokens of every running request together: at batch 1 a 64-node tree is almost free, at 32 requests it
competes for the same FLOPs. The policy keeps two curves:

- cost: seconds of one whole step (draft, tree, verify, accept, commit) per budget and running count,
  measured at start-up on the engine's own step runner, with dead rows (`StepRunner.dead_step`: the same
  kernels, or CUDA graphs, as a real step, committing nothing); row counts in between are interpolated;
- acceptance: the mean tokens a request commits per step at each budget, observed on the steps run so far;

and picks, for r running requests, the budget b that maximises r * accept(b) / cost(r, b), where cost(r, b) is
the start-up cost times the median ratio of measured to predicted time over the budget's recent steps (real
steps read longer contexts than the start-up ones; a budget not yet measured takes the median ratio of those
that were). Budgets never tried count as optimistic (their larger neighbour's acceptance, or twice the best
seen) until they have been tried a few times, and every `explore_every`-th choice tries the runner-up, so the
observed curve keeps up with the traffic.
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections import deque
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from specdeploy.engine.step import StepRunner

MIN_SAMPLES = 3  # steps at a budget before its observed acceptance is trusted
EWMA = 0.05  # weight of each new step in a budget's running acceptance
COST_WINDOW = 16  # recent steps per budget whose measured/predicted time ratios are kept (median: robust to
# the few steps that include compiling or capturing a new CUDA graph)


def powers_of_two(limit: int) -> list[int]:
    return [1 << i for i in range(limit.bit_length()) if 1 << i <= limit]


class CostCurve:
    """Seconds as a function of a size, from measurements at a few sizes (linear in between and beyond)."""

    def __init__(self, points: dict[int, float]) -> None:
        self.sizes = sorted(points)
        self.seconds = [points[size] for size in self.sizes]

    def __call__(self, size: int) -> float:
        if len(self.sizes) == 1:
            return self.seconds[0]
        i = bisect.bisect_left(self.sizes, size)
        if i < len(self.sizes) and self.sizes[i] == size:
            return self.seconds[i]
        i = min(max(i, 1), len(self.sizes) - 1)
        (x0, x1), (y0, y1) = self.sizes[i - 1 : i + 1], self.seconds[i - 1 : i + 1]
        return max(0.0, y0 + (y1 - y0) * (size - x0) / (x1 - x0))

    def as_dict(self) -> dict[int, float]:
        return dict(zip(self.sizes, self.seconds, strict=True))


class StepCost:
    """Seconds of one step per budget, as a function of the running rows."""

    def __init__(self, by_budget: dict[int, CostCurve]) -> None:
        self.by_budget = by_budget

    def __call__(self, rows: int, budget: int) -> float:
        return self.by_budget[budget](rows)

    def as_dict(self) -> dict[int, dict[int, float]]:
        return {budget: curve.as_dict() for budget, curve in sorted(self.by_budget.items())}


@torch.inference_mode()
def measure_step_cost(runner: StepRunner, budgets: list[int], repeats: int = 3) -> StepCost:
    """Median seconds of a dead step per budget at every row bucket the runner uses (or powers of two and
    the largest count, when it does not pad), after one warm-up step each (which captures its graphs)."""
    rows_measured = (
        runner.row_buckets() if runner.pad_rows else sorted({*powers_of_two(runner.rows), runner.rows})
    )
    synchronize = torch.cuda.synchronize if runner.device.type == "cuda" else lambda device: None
    by_budget = {}
    for budget in budgets:
        points = {}
        for rows in rows_measured:
            runner.dead_step(rows, budget)
            times = []
            for _ in range(repeats):
                synchronize(runner.device)
                started = time.perf_counter()
                runner.dead_step(rows, budget)
                synchronize(runner.device)
                times.append(time.perf_counter() - started)
            points[rows] = sorted(times)[len(times) // 2]
        by_budget[budget] = CostCurve(points)
    return StepCost(by_budget)


class BudgetPolicy:
    def __init__(self, budgets: list[int], cost: StepCost | None = None, explore_every: int = 20) -> None:
        """`cost`: the start-up step cost; None until the batch engine measures it on its runner."""
        self.budgets = sorted(budgets)
        self.cost = cost
        self.explore_every = explore_every
        self.accept = dict.fromkeys(self.budgets, 0.0)
        self.samples = dict.fromkeys(self.budgets, 0)
        self.choices = 0
        self.last_choice: dict[int, int] = {}  # running requests -> the budget chosen last time
        self.cost_ratios = {b: deque(maxlen=COST_WINDOW) for b in self.budgets}  # measured / predicted

    def estimate(self, budget: int) -> float:
        """Expected tokens per request per step at `budget` (optimistic while it is little tried)."""
        if self.samples[budget] >= MIN_SAMPLES:
            return self.accept[budget]
        tried = [b for b in self.budgets if self.samples[b] >= MIN_SAMPLES]
        larger = [self.accept[b] for b in tried if b > budget]
        smaller = [self.accept[b] for b in tried if b < budget]
        if larger:
            return min(larger)  # a smaller tree is a subset of a larger one: it accepts no more
        return 2 * max(smaller) if smaller else float(budget + 1)

    def predicted(self, running: int, budget: int) -> float:
        """Seconds of one step by the start-up cost."""
        return self.cost(running, budget)

    def cost_ratio(self, budget: int) -> float:
        """Measured over predicted step time at `budget` (the other budgets' while it is little measured)."""
        if len(self.cost_ratios[budget]) >= MIN_SAMPLES:
            return statistics.median(self.cost_ratios[budget])
        measured = [statistics.median(r) for r in self.cost_ratios.values() if len(r) >= MIN_SAMPLES]
        return statistics.median(measured) if measured else 1.0

    def throughput(self, running: int, budget: int) -> float:
        seconds = self.predicted(running, budget) * self.cost_ratio(budget)
        return running * self.estimate(budget) / max(seconds, 1e-9)

    def choose(self, running: int) -> int:
        ranked = sorted(self.budgets, key=lambda b: -self.throughput(running, b))
        self.choices += 1
        explore = len(ranked) > 1 and self.choices % self.explore_every == 0
        choice = ranked[1] if explore else ranked[0]
        self.last_choice[running] = choice
        return choice

    def observe(self, budget: int, accept_lengths: list[int], seconds: float | None = None) -> None:
        """Fold in one step at `budget`: the tokens each running request committed, and the step's measured
        time (`seconds`, when known)."""
        if seconds is not None:
            predicted = self.predicted(len(accept_lengths), budget)
            if predicted > 0:
                self.cost_ratios[budget].append(seconds / predicted)
        mean = sum(accept_lengths) / len(accept_lengths)
        count = self.samples[budget]
        self.accept[budget] = mean if count == 0 else (1 - EWMA) * self.accept[budget] + EWMA * mean
        self.samples[budget] = count + 1

    def describe(self) -> dict:
        """What /server_info shows: both curves and the latest choice per running count."""
        return {
            "budgets": self.budgets,
            "step_ms_by_budget_and_rows": {
                b: {r: round(1e3 * s, 3) for r, s in curve.items()}
                for b, curve in self.cost.as_dict().items()
            },
            "accept_length_by_budget": {b: round(self.accept[b], 3) for b in self.budgets if self.samples[b]},
            "steps_by_budget": {b: self.samples[b] for b in self.budgets},
            "measured_over_predicted_by_budget": {
                b: round(statistics.median(r), 4) for b, r in self.cost_ratios.items() if r
            },
            "chosen_by_running": dict(sorted(self.last_choice.items())),
        }
