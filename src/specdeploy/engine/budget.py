"""The adaptive DDTree budget: each step's tree size chosen from how many requests share the step.

A bigger tree commits more tokens per step but costs more to verify, and the verify cost grows with the
tokens of every running request together: at batch 1 a 64-node tree is almost free, at 32 requests it
competes for the same FLOPs. Budget 0 is "no drafting": an AR step (the target alone, one token per request;
the drafter only takes in the step's features, so it is current when drafting resumes). The policy keeps:

- cost: seconds of one whole step (draft, tree, verify, accept, commit) per budget and running count,
  measured at start-up on the engine's own step runner, with dead rows (`StepRunner.dead_step`: the same
  kernels, or CUDA graphs, as a real step, committing nothing); row counts in between are interpolated;
- acceptance, for every budget at once: each drafting step's own tree predicts, for every prefix budget, the
  tokens a request would commit (1 + the summed path probabilities of its nodes,
  `tree.expected_accept_lengths`); the policy keeps a running mean of that prediction per budget, and
  calibrates it by one factor, the ratio of realised to predicted accepted draft tokens over the drafting
  steps run (at whatever budget each ran), so no budget needs to be tried to be estimated;

and picks, for r running requests, the budget b that maximises r * accept(b) / cost(r, b), where cost(r, b) is
the start-up cost times the median ratio of measured to predicted time over the budget's recent steps (real
steps read longer contexts than the start-up ones; a budget not yet measured takes the median ratio of those
that were). Every `explore_every`-th choice takes the best budget whose cost is not yet measured, or else the
runner-up, so every budget's cost gets measured (and a run of AR steps, which predicts nothing, is broken by a
drafting step now and then).
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections import deque
from typing import TYPE_CHECKING

import torch

from specdeploy.errors import SpecdeployError

if TYPE_CHECKING:
    from specdeploy.engine.step import StepRunner

MIN_SAMPLES = 3  # steps before the calibration, or a budget's measured cost, is trusted
EWMA = 0.05  # weight of a new step in the running means of acceptance (a plain mean over the first 1/EWMA)
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


def running_mean(mean: float, value: float, count: int) -> float:
    """Fold the `count`-th value in: a plain mean over the first 1/EWMA values, exponential after."""
    weight = max(EWMA, 1 / count)
    return (1 - weight) * mean + weight * value


class BudgetPolicy:
    def __init__(self, budgets: list[int], cost: StepCost | None = None, explore_every: int = 20) -> None:
        """`budgets`: the choices, 0 (an AR step) among them or not; `cost`: the start-up step cost, None until
        the batch engine measures it on its runner."""
        if not budgets or min(budgets) < 0:
            raise SpecdeployError(f"budgets must be at least 0 (0: an AR step), got {budgets}")
        self.budgets = sorted(set(budgets))
        self.drafting = [b for b in self.budgets if b > 0]
        self.cost = cost
        self.explore_every = explore_every
        self.predicted = dict.fromkeys(self.drafting, 0.0)  # running mean of the trees' predictions
        self.predictions = 0  # drafting steps whose trees predicted every budget
        self.realised = dict.fromkeys(self.budgets, 0.0)  # running mean of tokens committed, at each budget
        self.predicted_at = dict.fromkeys(self.budgets, 0.0)  # the same steps' prediction for that budget
        self.samples = dict.fromkeys(self.budgets, 0)
        # running means over drafting steps of the accepted draft tokens realised and predicted (at the budget run)
        self.realised_drafts, self.predicted_drafts, self.calibration_steps = 0.0, 0.0, 0
        self.choices = 0
        self.last_choice: dict[int, int] = {}  # running requests -> the budget chosen last time
        self.cost_ratios = {b: deque(maxlen=COST_WINDOW) for b in self.budgets}  # measured / predicted

    def calibration(self) -> float:
        """Realised over predicted accepted draft tokens on the drafting steps run (1 until a few are)."""
        if self.calibration_steps < MIN_SAMPLES or self.predicted_drafts <= 0:
            return 1.0
        return self.realised_drafts / self.predicted_drafts

    def estimate(self, budget: int) -> float:
        """Expected tokens per request per step at `budget`: 1 for an AR step; else the trees' calibrated
        prediction (before any drafting step, budget + 1: every budget is as good as it could be, which makes
        the first steps draft and so predict)."""
        if budget == 0:
            return 1.0
        if not self.predictions:
            return float(budget + 1)
        return 1 + self.calibration() * (self.predicted[budget] - 1)

    def calibrated(self, budget: int, predicted: float) -> float:
        """A tree's own prediction at `budget` for one request, calibrated as the policy's estimate is."""
        return 1.0 if budget == 0 else 1 + self.calibration() * (predicted - 1)

    def step_seconds(self, running: int, budget: int) -> float:
        """Seconds of one step by the start-up cost."""
        return self.cost(running, budget)

    def cost_ratio(self, budget: int) -> float:
        """Measured over predicted step time at `budget` (the other budgets' while it is little measured)."""
        if len(self.cost_ratios[budget]) >= MIN_SAMPLES:
            return statistics.median(self.cost_ratios[budget])
        measured = [statistics.median(r) for r in self.cost_ratios.values() if len(r) >= MIN_SAMPLES]
        return statistics.median(measured) if measured else 1.0

    def throughput(self, running: int, budget: int) -> float:
        seconds = self.step_seconds(running, budget) * self.cost_ratio(budget)
        return running * self.estimate(budget) / max(seconds, 1e-9)

    def choose(self, running: int) -> int:
        ranked = sorted(self.budgets, key=lambda b: -self.throughput(running, b))
        self.choices += 1
        explore = len(ranked) > 1 and self.choices % self.explore_every == 0
        unmeasured = [b for b in ranked[1:] if len(self.cost_ratios[b]) < MIN_SAMPLES]
        choice = (unmeasured or ranked[1:])[0] if explore else ranked[0]
        self.last_choice[running] = choice
        return choice

    def observe(
        self,
        budget: int,
        accept_lengths: list[int],
        seconds: float | None = None,
        expected: list[list[float]] | None = None,
    ) -> None:
        """Fold in one step at `budget`: the tokens each running request committed, the step's measured time
        (`seconds`, when known) and, for a drafting step, each request's tree prediction at every drafting
        budget (`expected`, rows in the order of `drafting`)."""
        if seconds is not None:
            step_seconds = self.step_seconds(len(accept_lengths), budget)
            if step_seconds > 0:
                self.cost_ratios[budget].append(seconds / step_seconds)
        self.samples[budget] += 1
        realised = sum(accept_lengths) / len(accept_lengths)
        self.realised[budget] = running_mean(self.realised[budget], realised, self.samples[budget])
        if expected is None:
            return
        self.predictions += 1
        means = [sum(column) / len(column) for column in zip(*expected, strict=True)]
        for b, mean in zip(self.drafting, means, strict=True):
            self.predicted[b] = running_mean(self.predicted[b], mean, self.predictions)
        if budget > 0:
            predicted = means[self.drafting.index(budget)]
            self.predicted_at[budget] = running_mean(
                self.predicted_at[budget], predicted, self.samples[budget]
            )
            self.calibration_steps += 1
            count = self.calibration_steps
            self.realised_drafts = running_mean(self.realised_drafts, realised - 1, count)
            self.predicted_drafts = running_mean(self.predicted_drafts, predicted - 1, count)

    def describe(self) -> dict:
        """What /server_info shows: the cost and acceptance curves, and the latest choice per running count."""
        return {
            "budgets": self.budgets,
            "step_ms_by_budget_and_rows": {
                b: {r: round(1e3 * s, 3) for r, s in curve.items()}
                for b, curve in self.cost.as_dict().items()
            },
            "predicted_accept_length_by_budget": {b: round(self.estimate(b), 3) for b in self.budgets},
            "tree_predicted_accept_length_by_budget": {
                b: round(self.predicted[b], 3) for b in self.drafting if self.predictions
            },
            "realised_accept_length_by_budget": {
                b: round(self.realised[b], 3) for b in self.budgets if self.samples[b]
            },
            "tree_predicted_accept_length_on_steps_run_by_budget": {
                b: round(self.predicted_at[b], 3) for b in self.drafting if self.samples[b]
            },
            "calibration": round(self.calibration(), 4),
            "steps_by_budget": {b: self.samples[b] for b in self.budgets},
            "measured_over_predicted_by_budget": {
                b: round(statistics.median(r), 4) for b, r in self.cost_ratios.items() if r
            },
            "chosen_by_running": dict(sorted(self.last_choice.items())),
        }
