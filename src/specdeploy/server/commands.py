"""`specdeploy serve` and `specdeploy load`: thin wrappers over the server and the load generator."""

from __future__ import annotations

from typing import Annotated

import typer

from specdeploy.api_key import API_KEY_ENV
from specdeploy.modes import AUTO_BUDGET, ENGINE_MODE_HELP, parse_budget
from specdeploy.server.guard import DEFAULT_MAX_BODY_BYTES


def serve(
    target: Annotated[str, typer.Option(help="Target checkpoint directory or zoo:NAME.")],
    draft: Annotated[
        str | None, typer.Option(help="DFlash drafter directory or zoo:NAME (dflash, ddtree).")
    ] = None,
    mode: Annotated[str, typer.Option(help=ENGINE_MODE_HELP)] = "ar",
    budget: Annotated[
        str | None,
        typer.Option(
            "--budget",
            "--ddtree-budget",
            help="DDTree draft nodes per step, or `auto`: chosen every step (0, an AR step, or a power of two "
            "up to --max-budget) from the running requests, the step cost measured at start-up and corrected "
            "by measured steps, and the acceptance each step's tree predicts for every budget, calibrated "
            "against the acceptance realised.",
        ),
    ] = None,
    max_budget: Annotated[int, typer.Option(help="Largest budget `--budget auto` may choose.")] = 64,
    context_length: Annotated[
        int | None,
        typer.Option(
            help="Longest request (prompt + new tokens); the static caches hold this many positions per "
            "running request (default: the model's max_position_embeddings)."
        ),
    ] = None,
    max_running_requests: Annotated[
        int, typer.Option(help="Requests decoded together in one batch; the rest wait in the queue.")
    ] = 8,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP port to listen on.")] = 30000,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    dtype: Annotated[str, typer.Option(help="auto (fp32 on CPU, bf16 on CUDA), float32, bfloat16.")] = "auto",
    max_queued_requests: Annotated[
        int, typer.Option(help="Requests waiting or running at once; more are refused with 503.")
    ] = 256,
    served_model_name: Annotated[
        str | None,
        typer.Option(help="Model id in the API (default: --target as given, a path or zoo:NAME, as SGLang)."),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    threads: Annotated[int | None, typer.Option(help="CPU threads for torch (default 1).")] = None,
    engine_process: Annotated[
        bool,
        typer.Option(
            "--engine-process/--engine-thread",
            help="Run the engine in a process of its own (as SGLang runs its scheduler), so that it does not "
            "share an interpreter with the HTTP server; --engine-thread: in a thread of the server's process.",
        ),
    ] = True,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar=API_KEY_ENV,
            show_envvar=True,
            help="Require `Authorization: Bearer KEY` on every route but /health, /ready and /metrics "
            "(prefer the environment variable: argv is visible to every user of the machine).",
        ),
    ] = None,
    max_request_bytes: Annotated[
        int, typer.Option(help="Largest request body accepted; larger ones get 413 before they are read.")
    ] = DEFAULT_MAX_BODY_BYTES,
) -> None:
    """Serve the reference engine with SGLang's HTTP API (native /generate and OpenAI routes)."""
    from specdeploy.engine.runtime import load_engine
    from specdeploy.errors import SpecdeployError
    from specdeploy.server.engine_process import EngineRecipe
    from specdeploy.server.guard import HttpGuard
    from specdeploy.server.launch import check_port_free, is_loopback, serve_engine
    from specdeploy.server.service import ServerConfig
    from specdeploy.zoo.registry import resolve_models

    if max_queued_requests < 1:
        raise SpecdeployError(f"--max-queued-requests must be at least 1, got {max_queued_requests}")
    if max_running_requests < 1:
        raise SpecdeployError(f"--max-running-requests must be at least 1, got {max_running_requests}")
    parsed = parse_budget(budget)
    adaptive = parsed == AUTO_BUDGET
    if adaptive and mode != "ddtree":
        raise SpecdeployError("--budget auto picks DDTree budgets: use it with --mode ddtree")
    if adaptive and max_budget < 1:
        raise SpecdeployError(f"--max-budget must be at least 1, got {max_budget}")
    tree_budget = max_budget if adaptive else parsed
    if max_request_bytes < 1:
        raise SpecdeployError(f"--max-request-bytes must be at least 1, got {max_request_bytes}")
    if not api_key and not is_loopback(host):
        typer.echo(
            f"warning: serving on {host} without an API key: anyone who reaches this address can use the "
            f"server; set {API_KEY_ENV} (or --api-key)",
            err=True,
        )
    check_port_free(host, port)
    target_path, draft_path = resolve_models(target, draft, mode, tree_budget)
    # with the engine in its own process this one loads everything but the weights (tokenizer, configs)
    engine = load_engine(
        target_path,
        draft_path,
        mode,
        tree_budget,
        device=device,
        dtype=dtype,
        threads=threads,
        context_length=context_length,
        weights=not engine_process,
    )
    budgets = None
    if adaptive:
        from specdeploy.engine.budget import powers_of_two

        typer.echo("--budget auto: the step cost of every budget is measured at start-up ...", err=True)
        budgets = (0, *powers_of_two(max_budget))
    recipe = policy = None
    if engine_process:
        recipe = EngineRecipe(target_path, draft_path, mode, tree_budget, device, dtype, threads, context_length,
                              max_running_requests, budgets)  # fmt: skip
    elif budgets is not None:
        from specdeploy.engine.budget import BudgetPolicy

        policy = BudgetPolicy(list(budgets))  # the batch engine measures its cost
    config = ServerConfig(
        max_queued_requests=max_queued_requests,
        max_running_requests=max_running_requests,
        # SGLang names a model by its --model-path; a zoo pair's directory alone would read "target".
        served_model_name=served_model_name or target,
        budget_policy=policy,
        engine_recipe=recipe,
    )
    guard = HttpGuard(api_key=api_key or None, max_body_bytes=max_request_bytes)
    serve_engine(engine, config, host, port, log_level, guard)
