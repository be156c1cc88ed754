"""`specdeploy project RUN_DIR` and `specdeploy recommend RUN_DIR`: predictions from a campaign's files only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from specdeploy.bench.runs import Series, load_series
from specdeploy.errors import SpecdeployError
from specdeploy.projection.project import PROJECTION_SCHEMA, Predicted, Projection, experts_of, series_cells
from specdeploy.projection.scaling import AllReduce, HardwareScale
from specdeploy.recipes.loader import load_hardware, load_recipe
from specdeploy.recipes.schema import HardwareProfile, Recipe
from specdeploy.terminal_tables import add_columns, narrow_table, num

RunDir = Annotated[Path, typer.Argument(help="A campaign directory or a bench run directory.")]
RecipeOption = Annotated[
    str | None, typer.Option(help="The model pair the runs served (default: the one the campaign recorded).")
]
PriceOption = Annotated[
    float | None,
    typer.Option(
        help="USD per GPU-hour, for $ per million tokens (default: the hardware profile's, if any)."
    ),
]


def _ints(text: str | None, what: str) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SpecdeployError(f"{what} takes comma-separated whole numbers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise SpecdeployError(f"{what} takes numbers >= 1, got {text!r}")
    return values


def _recorded(series: Series, name: str, given: str | None, option: str) -> str:
    value = given or series.fact(name)
    if value == "-" or "," in value:
        raise SpecdeployError(f"the runs of {series.label} record no single {name} ({value}): pass {option}")
    return value


def _scale(series: Series, recipe: Recipe, target: str | None, source: str | None) -> HardwareScale | None:
    if target is None:
        return None
    source_profile = load_hardware(_recorded(series, "hardware", source, "--source-hardware"))
    tp_text = series.fact("tp")
    tp = int(tp_text) if tp_text.isdigit() else max(source_profile.gpu_count, 1)
    return HardwareScale(
        source_profile,
        load_hardware(target),
        AllReduce(tp, recipe.target.layers, recipe.target.hidden),
        moe=recipe.target.routed_experts is not None,
    )


def _usd_per_million(tok_s: float, price: float | None, gpus: int) -> float | None:
    if price is None or tok_s <= 0 or gpus < 1:
        return None
    return price * gpus / 3600 / tok_s * 1e6


def _row(series: str, dataset: str, p: Predicted, usd: float | None) -> dict[str, Any]:
    """A row in `report --json`'s names, marked predicted, with its interval."""
    return {
        "series": series,
        "dataset": dataset,
        "mode": p.mode,
        "budget": p.budget,
        "concurrency": p.concurrency,
        "request_rate": None,
        "output_tok_s": p.output_tok_s,
        "tok_s_per_user": p.per_user(),
        "tpot_p50_ms": p.tpot_ms,
        "tau_mean": p.tau,
        "tau_measured": p.tau_measured,
        "usd_per_million_tokens": usd,
        "predicted": True,
        "interval": {"low": p.low, "high": p.high} if p.sized else None,
        "measured_output_tok_s": p.measured_output_tok_s,
    }


def _measured_on(series: Series) -> HardwareProfile | None:
    """The profile the runs recorded, if it is one this specdeploy knows."""
    try:
        return load_hardware(series.fact("hardware"))
    except SpecdeployError:
        return None


def projections(
    run_dir: Path,
    recipe_name: str | None,
    fit_budgets: list[int] | None,
    hardware: str | None,
    source_hardware: str | None,
) -> list[tuple[Series, str, Projection, HardwareProfile | None]]:
    """One projection per series and dataset in `run_dir`."""
    found = []
    for series in load_series([run_dir]):
        recipe = load_recipe(_recorded(series, "recipe", recipe_name, "--recipe"))
        scale = _scale(series, recipe, hardware, source_hardware)
        by_dataset, skipped = series_cells(series)
        for dataset, cells in by_dataset.items():
            projection = Projection(cells, recipe.dflash.block_size, experts_of(recipe), fit_budgets, scale)
            projection.notes += skipped
            found.append((series, dataset, projection, scale.target if scale else _measured_on(series)))
    return found


def _points(
    projection: Projection, budgets: list[int] | None, concurrency: list[int] | None
) -> list[tuple[str, int | None, int]]:
    measured = projection.measured
    levels = concurrency or sorted({c for _, _, c in measured})
    points = []
    for mode in projection.models:
        if mode == "ddtree":
            chosen = budgets or sorted({b for m, b, _ in measured if m == "ddtree" and b is not None})
        else:
            chosen = [None]
        points += [(mode, b, c) for b in chosen for c in levels]
    return points


def project(
    run_dir: RunDir,
    budgets: Annotated[
        str | None, typer.Option(help="DDTree budgets to predict, e.g. 8,16,32 (default: the measured ones).")
    ] = None,
    concurrency: Annotated[
        str | None, typer.Option(help="Concurrency levels to predict (default: the measured ones).")
    ] = None,
    fit_budgets: Annotated[
        str | None,
        typer.Option(
            help="Fit DDTree on these measured budgets only, e.g. 16,64 (to check a prediction against a measured budget left out)."
        ),
    ] = None,
    hardware: Annotated[
        str | None, typer.Option(help="Predict for this hardware profile (name or .toml path).")
    ] = None,
    source_hardware: Annotated[
        str | None,
        typer.Option(help="The profile the runs were measured on (default: the one the campaign recorded)."),
    ] = None,
    recipe: RecipeOption = None,
    price_per_gpu_hour: PriceOption = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the predicted rows and the assumptions as JSON.")
    ] = False,
) -> None:
    """Predict output tok/s, tok/s per user and TPOT at unmeasured DDTree budgets, concurrencies or hardware."""
    wanted_budgets = _ints(budgets, "--budgets")
    wanted_levels = _ints(concurrency, "--concurrency")
    found = projections(run_dir, recipe, _ints(fit_budgets, "--fit-budgets"), hardware, source_hardware)
    document: dict[str, Any] = {"schema": PROJECTION_SCHEMA, "rows": [], "assumptions": {}}
    console = Console()
    for series, dataset, projection, target in found:
        gpus = target.gpu_count if target else 0  # $ per million tokens needs the GPUs it pays for
        price = (
            price_per_gpu_hour
            if price_per_gpu_hour is not None
            else (target.price_per_gpu_hour if target else None)
        )
        rows = [projection.predict(*point) for point in _points(projection, wanted_budgets, wanted_levels)]
        scaled = projection.scale is not None
        label = f"{series.label} -> {target.name}" if scaled and target else series.label
        document["rows"] += [
            _row(label, dataset, p, _usd_per_million(p.output_tok_s, price, gpus)) for p in rows
        ]
        assumptions = projection.assumptions()
        if price is not None:
            assumptions.append(
                f"$ per million tokens: ${price:g} per GPU-hour x {gpus} GPUs, busy all the time"
            )
        document["assumptions"][f"{label} / {dataset}"] = assumptions
        if json_output:
            continue
        table = narrow_table(f"{label}: {dataset} (predicted)")
        add_columns(
            table,
            ("mode", "load", "tok/s", "interval", "measured", "TPOT ms", "tau", "$/M tok"),
            ("mode", "load"),
        )
        for p in rows:
            table.add_row(
                p.mode + ("" if p.budget is None else f" b{p.budget}"),
                f"c={p.concurrency}",
                f"{p.output_tok_s:.1f}",
                f"{p.low:.1f}-{p.high:.1f}" if p.sized else "-",
                "-" if p.measured_output_tok_s is None else f"{p.measured_output_tok_s:.1f}",
                "-" if p.tpot_ms is None else f"{p.tpot_ms:.2f}",
                f"{p.tau:.2f}" + ("" if p.tau_measured else "*"),
                num(_usd_per_million(p.output_tok_s, price, gpus), 2),
            )
        console.print(table)
        console.print("* tau interpolated. Assumptions:")
        for line in assumptions:
            console.print(f"  - {line}", highlight=False)
    if json_output:
        typer.echo(json.dumps(document, indent=2))


def recommend(
    run_dir: RunDir,
    budgets: Annotated[
        str | None,
        typer.Option(
            help="Candidate DDTree budgets (default: 2 to 128 by powers of 2, and the measured ones)."
        ),
    ] = None,
    concurrency: Annotated[
        str | None, typer.Option(help="Concurrency levels (default: the measured ones).")
    ] = None,
    recipe: RecipeOption = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the choices as JSON.")] = False,
) -> None:
    """The fixed DDTree budget with the most output tok/s per concurrency (SGLang fixes it at launch)."""
    candidates = _ints(budgets, "--budgets")
    levels = _ints(concurrency, "--concurrency")
    choices = []
    for series, dataset, projection, _ in projections(run_dir, recipe, None, None, None):
        if "ddtree" not in projection.models:
            raise SpecdeployError(
                f"{series.label} / {dataset} has no DDTree cells to recommend a budget from"
            )
        measured = sorted({b for m, b, _ in projection.measured if m == "ddtree" and b is not None})
        pool = candidates or sorted(set(measured) | {2**i for i in range(1, 8)})
        for level in levels or sorted({c for _, _, c in projection.measured}):
            best = max((projection.predict("ddtree", b, level) for b in pool), key=lambda p: p.output_tok_s)
            choices.append({"series": series.label, "dataset": dataset, "concurrency": level, "budget": best.budget,
                            "output_tok_s": best.output_tok_s, "interval": {"low": best.low, "high": best.high} if best.sized else None,
                            "measured": best.measured_output_tok_s is not None})  # fmt: skip
    if json_output:
        typer.echo(json.dumps({"schema": PROJECTION_SCHEMA, "recommendations": choices}, indent=2))
        return
    table = narrow_table("Best fixed DDTree budget per concurrency (by predicted output tok/s)")
    add_columns(
        table,
        ("series", "dataset", "load", "budget", "tok/s", "interval"),
        ("series", "dataset", "load"),
        ("series",),
    )
    for c in choices:
        table.add_row(c["series"], c["dataset"], f"c={c['concurrency']}", str(c["budget"]) + ("" if c["measured"] else "*"),
                      f"{c['output_tok_s']:.1f}", f"{c['interval']['low']:.1f}-{c['interval']['high']:.1f}" if c["interval"] else "-")  # fmt: skip
    Console().print(table)
    Console().print("* not measured: predicted by `specdeploy project` (its assumptions: run it)")


def register(app: typer.Typer) -> None:
    app.command("project")(project)
    app.command("recommend")(recommend)
