"""The step cost model: what one decode step costs against concurrency and tokens verified, fitted on cells.

Every measured cell (one repeat of one load point) gives the time its requests waited per step, as the
client saw it: an effective step time `c * tau / output_tok_s` (c requests, tau tokens each per step), and a
decode step time `tpot_p50 * tau`. Each mode's step times are fitted by least squares to

    step(b, c) = fixed + per_row * c + per_token * g(c * v)

with v the tokens verified per row (DDTree: budget + 1; DFlash: the block; AR: 1) and g(n) = n for a dense
target, or for an MoE target the distinct routed experts n tokens touch, in token units,
E/k * (1 - (1 - k/E)^n): reading an expert costs the same however many tokens route to it. Acceptance
(tau) per DDTree budget is the cells' mean, interpolated between measured budgets linearly in log(b + 1)
from tau(0) = 1 (a step with no draft commits the bonus token alone).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from specdeploy.errors import SpecdeployError

AR_MODES = ("ar", "baseline")  # a `bench --baseline-url` run's baseline cells are AR cells
COLUMNS = ("fixed", "per_row", "per_token")


@dataclass(frozen=True)
class Cell:
    """One measured cell, reduced to what the model reads."""

    mode: str  # ar, dflash, ddtree, eagle3
    budget: int | None
    concurrency: int
    output_tok_s: float
    tau: float  # 1 for AR
    tpot_ms: float | None


@dataclass(frozen=True)
class Experts:
    """Routed experts of an MoE target: E per layer, k per token."""

    routed: int
    per_token: int

    def touched(self, tokens: float) -> float:
        """Expected distinct experts `tokens` tokens route to, if routing were independent."""
        return self.routed * (1 - (1 - self.per_token / self.routed) ** tokens)


def token_load(tokens: float, experts: Experts | None) -> float:
    """g(n): n for a dense target; for an MoE, distinct experts touched in units of one token's k."""
    return tokens if experts is None else experts.touched(tokens) / experts.per_token


def verified_per_row(mode: str, budget: int | None, block_size: int) -> int:
    if mode in AR_MODES:
        return 1
    if mode == "ddtree":
        if budget is None:
            raise SpecdeployError("a ddtree cell without a numeric budget cannot be placed in the model")
        return budget + 1
    return block_size  # dflash verifies the whole block; eagle3's draft tokens stand in the same place


@dataclass(frozen=True)
class StepFit:
    """Least-squares fit of one mode's step times (ms); coefficients of COLUMNS, absent ones 0."""

    mode: str
    coefficients: dict[str, float]
    residual_ms: float | None  # residual standard error; None for an exact fit (no degrees of freedom)
    cells: int
    notes: tuple[str, ...]

    def terms(self, concurrency: float, load: float) -> dict[str, float]:
        """The step's time split into the model's terms, ms."""
        return {
            "fixed": self.coefficients["fixed"],
            "per_row": self.coefficients["per_row"] * concurrency,
            "per_token": self.coefficients["per_token"] * load,
        }

    def step_ms(self, concurrency: float, load: float) -> float:
        return sum(self.terms(concurrency, load).values())


def fit_steps(mode: str, points: list[tuple[int, int, float, float]]) -> StepFit:
    """Fit (concurrency, tokens verified per row, token load, step ms) points; the columns the points cannot
    separate are dropped."""
    concurrencies = {c for c, _, _, _ in points}
    verified = {v for _, v, _, _ in points}
    loads = {round(g, 9) for _, _, g, _ in points}
    columns = ["fixed"]
    notes = []
    if len(verified) > 1 and len(concurrencies) > 1:
        columns += ["per_row", "per_token"]
    elif len(loads) > 1:
        columns += ["per_token"]
        if len(concurrencies) > 1:  # one budget: c and c*v move together
            notes.append(
                f"{mode}: the cells verify one number of tokens per request, so the cost per running request "
                "cannot be told from the cost per verified token: all of it is counted per verified token"
            )
    if len(points) < len(columns) or len(points) < 2:
        raise SpecdeployError(
            f"{mode}: {len(points)} measured cell(s) cannot fit a step cost: measure at least two "
            "concurrencies or budgets"
        )
    design = np.array(
        [[{"fixed": 1.0, "per_row": c, "per_token": g}[name] for name in columns] for c, _, g, _ in points]
    )
    target = np.array([ms for _, _, _, ms in points])
    solution, *_ = np.linalg.lstsq(design, target, rcond=None)
    freedom = len(points) - len(columns)
    residual = None
    if freedom > 0:
        residual = float(math.sqrt(float(np.sum((design @ solution - target) ** 2)) / freedom))
    coefficients = dict.fromkeys(COLUMNS, 0.0) | {n: float(v) for n, v in zip(columns, solution, strict=True)}
    negative = [n for n in columns if coefficients[n] < 0]
    if negative:
        notes.append(
            f"{mode}: the fit gives a negative {', '.join(negative)} cost (noise larger than the term): "
            "predictions far from the measured cells are unreliable"
        )
    return StepFit(mode, coefficients, residual, len(points), tuple(notes))


@dataclass(frozen=True)
class Tau:
    estimate: float
    low: float
    high: float
    measured: bool


@dataclass
class TauCurve:
    """Mean acceptance per budget of one mode, from the cells (pooled over concurrencies)."""

    by_budget: dict[int | None, list[float]] = field(default_factory=lambda: defaultdict(list))

    def add(self, budget: int | None, tau: float) -> None:
        self.by_budget[budget].append(tau)

    def at(self, budget: int | None) -> Tau:
        measured = self.by_budget.get(budget)
        if measured:
            return Tau(sum(measured) / len(measured), min(measured), max(measured), True)
        numeric = sorted(b for b in self.by_budget if isinstance(b, int))
        if budget is None or not numeric:
            raise SpecdeployError(f"no measured acceptance to place budget {budget} by")
        known = [(0, 1.0)] + [(b, self.at(b).estimate) for b in numeric]
        if budget > numeric[-1]:
            # Acceptance saturates with budget: hold the largest budget's tau; the log-linear trend bounds it.
            (b0, t0), (b1, t1) = known[-2], known[-1]
            trend = t1 + (t1 - t0) * (math.log2(budget + 1) - math.log2(b1 + 1)) / (
                math.log2(b1 + 1) - math.log2(b0 + 1)
            )
            return Tau(t1, t1, max(t1, trend), False)
        for (b0, t0), (b1, t1) in zip(known, known[1:], strict=False):
            if b0 <= budget <= b1:
                share_log = (math.log2(budget + 1) - math.log2(b0 + 1)) / (
                    math.log2(b1 + 1) - math.log2(b0 + 1)
                )
                share_linear = (budget - b0) / (b1 - b0)
                by_log = t0 + (t1 - t0) * share_log
                by_linear = t0 + (t1 - t0) * share_linear
                # The two interpolations bound the curve's plausible shapes between the measured budgets.
                return Tau(by_log, min(by_log, by_linear), max(by_log, by_linear), False)
        raise AssertionError("unreachable: budget lies between 0 and the largest measured budget")
