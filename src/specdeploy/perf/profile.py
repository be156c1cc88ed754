"""Speed of one decoding configuration: tokens/s, time per step, and where a step's time goes.

A warm-up request first compiles kernels and captures the step's CUDA graphs; then a clean request gives
tokens/s and ms per step, and an instrumented one (device events around each stage, read after the step's
own synchronisation, so the host still runs ahead) gives the per-stage breakdown.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass

import torch

from specdeploy.engine.decode import Decoder, SamplingParams
from specdeploy.engine.step import StageTimes


@dataclass
class ProfileResult:
    mode: str
    budget: int | None
    device: str
    dtype: str
    prompt_tokens: int
    new_tokens: int
    steps: int
    tau: float
    tokens_per_s: float  # decode only: new tokens after the first over decode time
    ms_per_step: float
    breakdown_ms: dict[str, float]  # per step: draft, tree, verify, commit, host
    eager_stages: dict[str, str]  # stages that could not be captured as CUDA graphs, and why

    def as_dict(self) -> dict:
        return asdict(self)


def random_prompt(vocab_size: int, length: int, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (length,), generator=generator).tolist()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def profile_decoding(
    target: torch.nn.Module,
    drafter: torch.nn.Module | None,
    mode: str,
    budget: int | None,
    prompt_ids: list[int],
    new_tokens: int,
) -> ProfileResult:
    decoder = Decoder(target, drafter, mode, budget)
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    decoder.generate(prompt_ids, params)  # warm-up: kernels compile, graphs are captured
    result = decoder.generate(prompt_ids, params)
    decoder.runner.timer = StageTimes()
    try:
        decoder.generate(prompt_ids, params)
        breakdown = decoder.runner.timer.per_step_ms()
    finally:
        decoder.runner.timer = None
    weight = target.embed_tokens.weight
    return ProfileResult(
        mode=mode,
        budget=budget,
        device=device_name(weight.device),
        dtype=str(weight.dtype).removeprefix("torch."),
        prompt_tokens=len(prompt_ids),
        new_tokens=len(result.token_ids),
        steps=result.num_steps,
        tau=result.tau,
        tokens_per_s=(len(result.token_ids) - 1) / result.decode_s if result.decode_s > 0 else 0.0,
        ms_per_step=1e3 * result.decode_s / max(result.num_steps, 1),
        breakdown_ms=breakdown,
        eager_stages={str(k): v for k, v in decoder.runner.graphs.eager_reasons.items()},
    )
