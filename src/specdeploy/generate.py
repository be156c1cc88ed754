"""`specdeploy generate`: one prompt through the reference engine, as text or one JSON object."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from specdeploy.errors import SpecdeployError
from specdeploy.modes import ENGINE_MODE_HELP


def generate(
    target: Annotated[str, typer.Option(help="Target checkpoint directory or zoo:NAME.")],
    mode: Annotated[str, typer.Option(help=ENGINE_MODE_HELP)] = "ar",
    draft: Annotated[
        str | None, typer.Option(help="DFlash drafter directory or zoo:NAME (dflash, ddtree).")
    ] = None,
    budget: Annotated[int | None, typer.Option(help="DDTree draft nodes per step.")] = None,
    prompt: Annotated[str | None, typer.Option(help="Prompt text.")] = None,
    prompt_file: Annotated[Path | None, typer.Option(help="Read the prompt from this file.")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="New tokens at most (EOS stops earlier).")] = 64,
    temperature: Annotated[float, typer.Option(help="Sampling temperature; 0 = greedy.")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass; 1 = off.")] = 1.0,
    top_k: Annotated[int, typer.Option(help="Sample only from the k likeliest tokens; 0 = off.")] = 0,
    seed: Annotated[
        int | None, typer.Option(help="Seed of the sampling draws (default: a fresh one each run).")
    ] = None,
    ignore_eos: Annotated[bool, typer.Option(help="Keep going past EOS.")] = False,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    dtype: Annotated[str, typer.Option(help="auto (fp32 on CPU, bf16 on CUDA), float32, bfloat16.")] = "auto",
    threads: Annotated[int | None, typer.Option(help="CPU threads for torch (default 1).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Generate from one prompt with the reference engine and print the text and decoding statistics."""
    from specdeploy.engine.runtime import load_engine
    from specdeploy.engine.sampling import SamplingParams
    from specdeploy.zoo.registry import resolve_models

    if (prompt is None) == (prompt_file is None):
        raise SpecdeployError("give exactly one of --prompt TEXT or --prompt-file F")
    if prompt_file is not None:
        if not prompt_file.is_file():
            raise SpecdeployError(f"prompt file {prompt_file} does not exist")
        prompt = prompt_file.read_text()
    params = SamplingParams(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        max_new_tokens=max_new_tokens,
        seed=seed,
        ignore_eos=ignore_eos,
    )
    target_path, draft_path = resolve_models(target, draft, mode, budget)
    engine = load_engine(target_path, draft_path, mode, budget, device=device, dtype=dtype, threads=threads)
    prompt_ids = engine.tokenizer.encode(prompt, add_special_tokens=False)
    result = engine.decoder().generate(prompt_ids, params)
    text = engine.tokenizer.decode(result.token_ids, skip_special_tokens=True)
    report = {
        "mode": mode,
        "budget": budget,
        "block_size": engine.block_size,
        "prompt_tokens": len(prompt_ids),
        "token_ids": result.token_ids,
        "text": text,
        "finish_reason": result.finish_reason,
        "num_steps": result.num_steps,
        "accept_lengths": result.accept_lengths,
        "verified_lengths": result.verified_lengths,
        "tau": round(result.tau, 4),
        "prefill_s": round(result.prefill_s, 6),
        "decode_s": round(result.decode_s, 6),
        "output_tokens_per_s": round(result.output_tokens_per_s, 2),
    }
    if as_json:
        typer.echo(json.dumps(report))
        return
    typer.echo(text)
    typer.echo(
        f"\n[{mode}{'' if budget is None else f' budget={budget}'}] {len(result.token_ids)} tokens, "
        f"{result.num_steps} steps, tau {result.tau:.2f}, prefill {result.prefill_s * 1e3:.1f} ms, "
        f"decode {result.decode_s * 1e3:.1f} ms, {result.output_tokens_per_s:.1f} tok/s",
        err=True,
    )
