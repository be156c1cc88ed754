"""`specdeploy profile`: the speed of one decoding configuration, with the per-step breakdown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from specdeploy.errors import SpecdeployError
from specdeploy.modes import ENGINE_MODE_HELP
from specdeploy.perf.shapes import SHAPES

SHAPE_NAMES = ", ".join(SHAPES)


def profile(
    target: Annotated[
        str | None, typer.Option(help="Target checkpoint directory or zoo:NAME (or use --random-shape).")
    ] = None,
    draft: Annotated[
        str | None, typer.Option(help="DFlash drafter directory or zoo:NAME (dflash, ddtree).")
    ] = None,
    mode: Annotated[str, typer.Option(help=ENGINE_MODE_HELP)] = "ar",
    budget: Annotated[int | None, typer.Option(help="DDTree draft nodes per step (ddtree only).")] = None,
    random_shape: Annotated[
        str | None,
        typer.Option(help=f"Random weights of a named real shape instead of a checkpoint: {SHAPE_NAMES}."),
    ] = None,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    dtype: Annotated[str, typer.Option(help="auto (fp32 on CPU, bf16 on CUDA), float32, bfloat16.")] = "auto",
    prompt_tokens: Annotated[int, typer.Option(help="Length of the random prompt.")] = 512,
    new_tokens: Annotated[int, typer.Option(help="Tokens to generate (EOS ignored).")] = 128,
    threads: Annotated[int | None, typer.Option(help="CPU threads for torch (default 1).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Decode a random prompt in one mode and print tokens/s, ms per step and the step's breakdown
    (draft, tree, verify, commit on the device; host: the rest of the step's wall time), the bytes a step
    must read (weights, the routed experts its tokens touch, caches, recurrent state) and that roofline at the copy
    bandwidth measured in the same run."""
    from specdeploy.engine.runtime import load_engine, resolve_device, resolve_dtype, set_cpu_threads
    from specdeploy.perf.profile import profile_decoding, random_prompt

    if prompt_tokens < 1 or new_tokens < 2:
        raise SpecdeployError("--prompt-tokens must be at least 1 and --new-tokens at least 2")
    if random_shape is not None:
        from specdeploy.engine.request import check_mode
        from specdeploy.perf.random_models import random_pair
        from specdeploy.perf.shapes import get_shape

        if target is not None or draft is not None:
            raise SpecdeployError("give either --random-shape or --target/--draft, not both")
        check_mode(mode, True, budget)
        torch_device = resolve_device(device)
        if torch_device.type == "cpu":
            set_cpu_threads(threads)
        model, drafter = random_pair(
            get_shape(random_shape), torch_device, resolve_dtype(dtype, torch_device)
        )
        drafter = drafter if mode != "ar" else None
    elif target is None:
        raise SpecdeployError("give --target PATH (or zoo:NAME) or --random-shape NAME")
    else:
        from specdeploy.zoo.registry import resolve_models

        target_path, draft_path = resolve_models(target, draft, mode, budget)
        engine = load_engine(
            target_path, draft_path, mode, budget, device=device, dtype=dtype, threads=threads
        )
        model, drafter = engine.target, engine.drafter
    prompt = random_prompt(model.config.vocab_size, prompt_tokens)
    result = profile_decoding(model, drafter, mode, budget, prompt, new_tokens)
    if as_json:
        typer.echo(json.dumps(result.as_dict()))
        return
    label = mode if budget is None else f"{mode} (budget {budget})"
    typer.echo(
        f"{label} on {result.device} ({result.dtype}): {result.tokens_per_s:.1f} tokens/s, "
        f"{result.ms_per_step:.2f} ms/step, tau {result.tau:.2f} over {result.steps} steps"
    )
    typer.echo("per step: " + ", ".join(f"{k} {v:.3f} ms" for k, v in result.breakdown_ms.items()))
    read = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in result.bytes_per_step.items())
    union = ""
    if result.expert_union is not None:
        union = f"; its {result.verify_tokens} tokens touch {100 * result.expert_union:.1f}% of the routed experts"
    typer.echo(f"bytes read per step: {read}{union}")
    typer.echo(
        f"roofline {result.roofline_ms:.2f} ms at {result.copy_bandwidth_bytes_per_s / 1e9:.0f} GB/s "
        f"(copy, measured now): the step runs at {100 * result.fraction_of_roofline:.0f}% of it"
    )
    for stage, reason in result.eager_stages.items():
        typer.echo(f"stage {stage} ran eagerly: {reason}")


def random_weights(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write target/ and draft/ into.")],
    shape: Annotated[str, typer.Option(help=f"Named real shape: {SHAPE_NAMES}.")] = "qwen3-8b",
    device: Annotated[str, typer.Option(help="Where the weights are drawn: cpu or cuda (faster).")] = "cpu",
    seed: Annotated[int, typer.Option(help="Same seed, same weights.")] = 0,
) -> None:
    """Write random bf16 weights of a named real shape as a target + DFlash drafter checkpoint pair, so that
    serve, bench and campaigns measure that shape's speed without downloads (acceptance is meaningless)."""
    import torch

    from specdeploy.engine.runtime import resolve_device
    from specdeploy.perf.random_models import write_random_checkpoints
    from specdeploy.perf.shapes import get_shape

    chosen = get_shape(shape)
    target_dir, draft_dir = write_random_checkpoints(
        out_dir, chosen, resolve_device(device), torch.bfloat16, seed
    )
    typer.echo(f"target: {target_dir}\ndraft:  {draft_dir}")
