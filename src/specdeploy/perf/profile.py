"""Speed of one decoding configuration: tokens/s, time per step, and where a step's time goes.

A warm-up request first compiles kernels and captures the step's CUDA graphs; then a clean request gives
tokens/s and ms per step, and an instrumented one (device events around each stage, read after the step's
own synchronisation, so the host still runs ahead) gives the per-stage breakdown. The step's roofline is
the bytes it must read (`roofline.step_bytes`, routed experts at the union its verify touches, measured on
the prompt) over the copy bandwidth measured in the same run.
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass

import torch

from specdeploy.engine.decode import Decoder, SamplingParams
from specdeploy.engine.step import StageTimes
from specdeploy.perf.roofline import copy_bandwidth, expert_union, step_bytes, verify_tokens


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
    verify_tokens: int  # tokens the target runs per step
    expert_union: float | None  # measured fraction of routed experts those tokens touch (None: dense)
    bytes_per_step: dict[str, int]  # what a step must read, by kind (roofline.step_bytes), and the total
    copy_bandwidth_bytes_per_s: float  # device copy, bytes read + written per second, measured in this run
    roofline_ms: float  # bytes_per_step["total"] at that bandwidth
    fraction_of_roofline: float  # roofline_ms / ms_per_step

    def as_dict(self) -> dict:
        return asdict(self)


def random_prompt(vocab_size: int, length: int, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (length,), generator=generator).tolist()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def stage_breakdown(decoder: Decoder, prompt_ids: list[int], params: SamplingParams) -> dict[str, float]:
    """Milliseconds per step of each stage (draft, tree, verify, commit, host) over one instrumented request;
    run it after a warm-up, since its device events would otherwise time compilation and capture."""
    decoder.runner.timer = StageTimes()
    try:
        decoder.generate(prompt_ids, params)
        return decoder.runner.timer.per_step_ms()
    finally:
        decoder.runner.timer = None


def profile_decoding(
    target: torch.nn.Module,
    drafter: torch.nn.Module | None,
    mode: str,
    budget: int | None,
    prompt_ids: list[int],
    new_tokens: int,
    bandwidth: float | None = None,
) -> ProfileResult:
    """Profile one mode; `bandwidth` (bytes/s) is measured here unless the caller measured it already."""
    decoder = Decoder(target, drafter, mode, budget)
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    decoder.generate(prompt_ids, params)  # warm-up: kernels compile, graphs are captured
    result = decoder.generate(prompt_ids, params)
    breakdown = stage_breakdown(decoder, prompt_ids, params)
    weight = target.embed_tokens.weight
    if bandwidth is None:
        bandwidth = copy_bandwidth(weight.device)
    tokens = verify_tokens(mode, budget, getattr(drafter, "block_size", None))
    union = expert_union(target, prompt_ids, [tokens]).get(tokens)
    # the mean committed context over the request's decoding steps
    needed = step_bytes(target, drafter, tokens, len(prompt_ids) + len(result.token_ids) // 2, union)
    ms_per_step = 1e3 * result.decode_s / max(result.num_steps, 1)
    roofline_ms = 1e3 * needed["total"] / bandwidth
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
        ms_per_step=ms_per_step,
        breakdown_ms=breakdown,
        eager_stages={str(k): v for k, v in decoder.runner.graphs.eager_reasons.items()},
        verify_tokens=tokens,
        expert_union=union,
        bytes_per_step=needed,
        copy_bandwidth_bytes_per_s=bandwidth,
        roofline_ms=roofline_ms,
        fraction_of_roofline=roofline_ms / ms_per_step if ms_per_step > 0 else 0.0,
    )
