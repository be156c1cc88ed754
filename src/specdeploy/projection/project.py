"""A campaign's cells -> step fits and acceptance per mode -> predicted rows for unmeasured points."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from specdeploy.bench.runs import Series
from specdeploy.errors import SpecdeployError
from specdeploy.projection.model import (
    AR_MODES,
    Cell,
    Experts,
    StepFit,
    TauCurve,
    fit_steps,
    token_load,
    verified_per_row,
)
from specdeploy.projection.scaling import HardwareScale
from specdeploy.recipes.loader import load_recipe
from specdeploy.recipes.schema import Recipe

PROJECTION_SCHEMA = "specdeploy.projection/1"


def experts_of(recipe: Recipe) -> Experts | None:
    """The target's routed experts, for an MoE recipe."""
    t = recipe.target
    return None if t.routed_experts is None else Experts(t.routed_experts, t.experts_per_token or 1)


def series_cells(series: Series) -> tuple[dict[str, list[Cell]], list[str]]:
    """Measured cells by dataset, and why any were left out."""
    by_dataset: dict[str, list[Cell]] = defaultdict(list)
    skipped: dict[str, int] = defaultdict(int)
    for run in series.runs:
        for summary in run.summary.cells.values():
            key, metrics = summary.key, summary.metrics
            if key.request_rate is not None or key.concurrency is None:
                skipped["Poisson-rate cells (the model is per concurrency)"] += 1
                continue
            if not isinstance(key.budget, int) and key.budget is not None:
                skipped[f"budget {key.budget} cells (no fixed tree size)"] += 1
                continue
            if metrics.output_tok_s <= 0:
                skipped["cells with no output"] += 1
                continue
            mode = "ar" if key.role == "baseline" or key.mode in AR_MODES else key.mode
            tau = 1.0 if mode == "ar" else metrics.tau.mean
            if tau is None:
                skipped[f"{mode} cells without acceptance counters"] += 1
                continue
            by_dataset[key.dataset].append(
                Cell(mode, key.budget, key.concurrency, metrics.output_tok_s, tau, metrics.tpot_ms.p50)
            )
    return dict(by_dataset), [f"left out {n} {why}" for why, n in skipped.items()]


@dataclass(frozen=True)
class Predicted:
    mode: str
    budget: int | None
    concurrency: int
    output_tok_s: float
    low: float
    high: float
    sized: bool  # False: the step fit was exact (no residual), so the interval holds tau's spread only
    tpot_ms: float | None
    tau: float
    tau_measured: bool
    step_ms: float
    measured_output_tok_s: float | None  # the cells' mean where this point was measured

    def per_user(self) -> float:
        return self.output_tok_s / self.concurrency


@dataclass
class ModeModel:
    effective: StepFit  # from throughput: prefill, first tokens and the cell's tail included
    decode: StepFit | None  # from TPOT: the decode step alone
    tau: TauCurve


class Projection:
    """Fits one dataset's cells; `fit_budgets` keeps only those DDTree budgets in the fit."""

    def __init__(
        self,
        cells: list[Cell],
        block_size: int,
        experts: Experts | None,
        fit_budgets: list[int] | None = None,
        scale: HardwareScale | None = None,
    ) -> None:
        self.block_size = block_size
        self.experts = experts
        self.scale = scale
        self.notes: list[str] = []
        measured_budgets = {c.budget for c in cells if c.mode == "ddtree"}
        unmeasured = sorted(set(fit_budgets or []) - measured_budgets)
        if unmeasured:
            raise SpecdeployError(
                f"--fit-budgets names budget(s) {unmeasured} that these runs never measured; measured: "
                f"{sorted(b for b in measured_budgets if b is not None) or 'none'}"
            )
        grouped: dict[str, list[Cell]] = defaultdict(list)
        for cell in cells:
            if fit_budgets is not None and cell.mode == "ddtree" and cell.budget not in fit_budgets:
                continue
            grouped[cell.mode].append(cell)
        self.models: dict[str, ModeModel] = {}
        for mode, members in grouped.items():
            try:
                self.models[mode] = self._fit(mode, members)
            except SpecdeployError as exc:
                self.notes.append(f"not predicted: {exc}")
        self.measured: dict[tuple[str, int | None, int], list[float]] = defaultdict(list)
        for cell in cells:
            self.measured[(cell.mode, cell.budget, cell.concurrency)].append(cell.output_tok_s)

    def _point(self, mode: str, cell: Cell, ms: float) -> tuple[int, int, float, float]:
        verified = verified_per_row(mode, cell.budget, self.block_size)
        return cell.concurrency, verified, self._load(mode, cell.budget, cell.concurrency), ms

    def _load(self, mode: str, budget: int | None, concurrency: float) -> float:
        return token_load(concurrency * verified_per_row(mode, budget, self.block_size), self.experts)

    def _fit(self, mode: str, cells: list[Cell]) -> ModeModel:
        effective = fit_steps(
            mode,
            [self._point(mode, c, 1e3 * c.concurrency * c.tau / c.output_tok_s) for c in cells],
        )
        timed = [c for c in cells if c.tpot_ms is not None]
        decode = None
        try:
            decode = fit_steps(
                mode,
                [self._point(mode, c, c.tpot_ms * c.tau) for c in timed],  # type: ignore[operator]
            )
        except SpecdeployError:
            self.notes.append(
                f"{mode}: too few cells with a TPOT to fit the decode step; TPOT is not predicted"
            )
        self.notes += effective.notes
        tau = TauCurve()
        for c in cells:
            tau.add(c.budget, c.tau)
        return ModeModel(effective, decode, tau)

    def _step(
        self, fit: StepFit, what: str, mode: str, budget: int | None, concurrency: int
    ) -> tuple[float, float]:
        """(step ms here or on the target machine, the interval's half-width scaled alike)."""
        load = self._load(mode, budget, concurrency)
        step = fit.step_ms(concurrency, load)
        spread = 2 * fit.residual_ms if fit.residual_ms is not None else 0.0  # about 95% for normal residuals
        if self.scale is None:
            return step, spread
        tokens = concurrency * verified_per_row(mode, budget, self.block_size)
        scaled, clamped = self.scale.step_ms(fit.terms(concurrency, load), tokens)
        self.notes += [f"{mode}, {what} step: {line} (at some predicted points)" for line in clamped]
        return scaled, spread * scaled / step if step > 0 else 0.0

    def predict(self, mode: str, budget: int | None, concurrency: int) -> Predicted:
        model = self.models.get(mode)
        if model is None:
            raise SpecdeployError(f"no measured {mode} cells to predict {mode} from")
        tau = model.tau.at(budget if mode == "ddtree" else None)
        step, spread = self._step(model.effective, "effective", mode, budget, concurrency)
        if step <= 0:
            raise SpecdeployError(
                f"{mode} b{budget} c={concurrency} lies too far from the measured cells: the fitted step time "
                "there is not positive"
            )
        tpot = None
        if model.decode is not None:
            decode_step, _ = self._step(model.decode, "decode (TPOT)", mode, budget, concurrency)
            tpot = decode_step / tau.estimate if decode_step > 0 else None
        rate = 1e3 * concurrency / step
        measured = self.measured.get((mode, budget, concurrency))
        return Predicted(
            mode=mode,
            budget=budget,
            concurrency=concurrency,
            output_tok_s=rate * tau.estimate,
            low=1e3 * concurrency * tau.low / (step + spread),
            # A residual above half the step would make the interval unbounded: cap the fast side at 2x.
            high=1e3 * concurrency * tau.high / max(step - spread, step * 0.5),
            sized=model.effective.residual_ms is not None,
            tpot_ms=tpot,
            tau=tau.estimate,
            tau_measured=tau.measured,
            step_ms=step,
            measured_output_tok_s=sum(measured) / len(measured) if measured and self.scale is None else None,
        )

    def assumptions(self) -> list[str]:
        lines = []
        for mode, model in self.models.items():
            fit = model.effective
            terms = ", ".join(f"{name} {value:.4g} ms" for name, value in fit.coefficients.items())
            error = "exact (no residual)" if fit.residual_ms is None else f"residual {fit.residual_ms:.3g} ms"
            lines.append(f"{mode}: effective step = {terms} (per running request, per verified-token unit); "
                         f"{fit.cells} cells, {error}")  # fmt: skip
            if mode == "ddtree":
                taus = ", ".join(f"b{b}: {model.tau.at(b).estimate:.3g}" for b in sorted(model.tau.by_budget))  # type: ignore[type-var]
                lines.append(f"ddtree tau measured at {taus}; other budgets interpolated linearly in log2(b+1) "
                             "from tau(0) = 1, bounded by linear-in-b interpolation; above the largest "
                             "measured budget held at its tau")  # fmt: skip
        lines += [
            "tau depends on the budget and the dataset only: not on concurrency, nor on the machine",
            "effective step = concurrency x tau / output tok/s: prefill, first tokens and the cell's tail, as "
            "measured, are spread over the steps the same way at unmeasured points",
            "tok/s per user = output tok/s / concurrency (every request running for the whole cell)",
            "intervals: +/- 2 residual standard errors of the step fit, and tau between its two interpolations; "
            "none where the fit is exact (as many cells as terms: no residual to size it)",
        ]
        if self.experts is not None:
            e = self.experts
            lines.append(f"MoE: n verified tokens cost as the experts they touch, {e.routed} x (1 - (1 - "
                         f"{e.per_token}/{e.routed})^n), independent routing (real routing is correlated)")  # fmt: skip
        if self.scale is not None:
            lines += self.scale.assumptions()
        return lines + list(dict.fromkeys(self.notes))


def fitted_output_tok_s(series: Series) -> dict[tuple[str, str, int | None, int], float]:
    """The model's output tok/s at every measured point of `series`, fitted on all of its cells, keyed by
    (dataset, mode, budget, concurrency); empty where no recipe is recorded or no model can be fitted."""
    recipe_name = series.fact("recipe")
    try:
        recipe = load_recipe(recipe_name)
    except SpecdeployError:
        return {}  # a plain bench run names no recipe: nothing to fit the model's token counts to
    fitted = {}
    by_dataset, _ = series_cells(series)
    for dataset, cells in by_dataset.items():
        projection = Projection(cells, recipe.dflash.block_size, experts_of(recipe))
        for mode, budget, concurrency in projection.measured:
            if mode not in projection.models:
                continue  # too few cells of this mode to fit
            try:
                fitted[(dataset, mode, budget, concurrency)] = projection.predict(
                    mode, budget, concurrency
                ).output_tok_s
            except SpecdeployError:
                continue  # a point where the fitted step is not positive has no model figure
    return fitted
