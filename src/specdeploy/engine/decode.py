"""The decoding loop: autoregressive, DFlash chains and DDTree trees through one step (`step.StepRunner`).

A request prefills the target (and the drafter's context), yields the first token, then yields each
step's committed tokens until a stop token or the length limit. One request at a time; `engine.batch`
runs many.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from specdeploy.engine.sampling import SamplingParams, UniformStream
from specdeploy.engine.step import StepRunner
from specdeploy.errors import SpecdeployError
from specdeploy.modes import ENGINE_MODES
from specdeploy.modes import check_mode as check_budget

__all__ = ["Decoder", "GenerationResult", "SamplingParams", "Step"]


@dataclass
class Step:
    """One engine step: the prefill (which yields the first token) or one draft + verify step."""

    token_ids: list[int]  # tokens committed by this step (several under speculation)
    verified_tokens: int  # tokens the target verified in this step (0 for the prefill step)
    finish_reason: str | None  # None until the last step: "stop" (EOS or stop token, included) or "length"


@dataclass
class GenerationResult:
    token_ids: list[int]
    finish_reason: str
    num_steps: int  # verify steps (the prefill is not one)
    accept_lengths: list[int]  # tokens committed per verify step, bonus token included
    verified_lengths: list[int]  # tokens the target verified per step (1 + tree size)
    prefill_s: float
    decode_s: float
    step_tokens: list[int] = field(default_factory=list)  # tokens of each step, prefill first

    @property
    def tau(self) -> float:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        total = self.prefill_s + self.decode_s
        return len(self.token_ids) / total if total > 0 else 0.0


class StopRules:
    """Cuts a request's committed tokens at its first stop token (EOS unless ignored) or its length limit."""

    def __init__(self, params: SamplingParams, eos_token_ids: list[int]) -> None:
        self.stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            self.stop_ids |= set(eos_token_ids)
        self.remaining = params.max_new_tokens

    def commit(self, tokens: list[int], verified: int) -> Step:
        for i, token in enumerate(tokens):
            if token in self.stop_ids:
                self.remaining = 0
                return Step(tokens[: i + 1], verified, "stop")
        tokens = tokens[: self.remaining]
        self.remaining -= len(tokens)
        return Step(tokens, verified, "length" if self.remaining == 0 else None)


def check_mode(mode: str, has_drafter: bool, budget: int | None) -> None:
    """What the reference engine needs of a (mode, drafter, budget) combination, for every entry point."""
    check_budget(mode, budget, ENGINE_MODES)
    if mode != "ar" and not has_drafter:
        raise SpecdeployError(f"mode {mode!r} needs a DFlash drafter (--draft PATH)")
    if mode == "ddtree" and budget is None:
        raise SpecdeployError("ddtree needs a budget of at least 1 draft node (--budget N, e.g. 32)")


class Decoder:
    def __init__(
        self,
        target: torch.nn.Module,
        drafter: torch.nn.Module | None = None,
        mode: str = "ar",
        budget: int | None = None,
        cuda_graphs: bool = True,
    ) -> None:
        check_mode(mode, drafter is not None, budget)
        self.target, self.mode, self.budget = target, mode, budget
        self.drafter = drafter if mode != "ar" else None
        self.device = next(target.parameters()).device
        self.runner = StepRunner(target, self.drafter, mode, budget, cuda_graphs=cuda_graphs)

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationResult:
        steps: list[Step] = []
        start = time.perf_counter()
        prefill_end = start
        for step in self.stream(prompt_ids, params):
            if not steps:
                prefill_end = time.perf_counter()
            steps.append(step)
        end = time.perf_counter()
        verify_steps = steps[1:]
        return GenerationResult(
            token_ids=[t for s in steps for t in s.token_ids],
            finish_reason=steps[-1].finish_reason or "length",
            num_steps=len(verify_steps),
            accept_lengths=[len(s.token_ids) for s in verify_steps],
            verified_lengths=[s.verified_tokens for s in verify_steps],
            prefill_s=prefill_end - start,
            decode_s=end - prefill_end,
            step_tokens=[len(s.token_ids) for s in steps],
        )

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[Step]:
        if not prompt_ids:
            raise SpecdeployError("the prompt is empty: give at least one token")
        rules = StopRules(params, self.target.config.eos_token_ids)
        runner = self.runner
        runner.reserve(len(prompt_ids) + params.max_new_tokens)
        uniforms = (
            None
            if params.greedy
            else UniformStream(params.max_new_tokens + runner.block + 2, params.seed, self.device)
        )
        step = rules.commit([runner.admit(prompt_ids, params, uniforms)], 0)
        try:
            yield step
            while step.finish_reason is None:
                ((tokens, verified),) = runner.step()
                step = rules.commit(tokens, verified)
                yield step
        finally:
            runner.release(0)  # also when the consumer stops early
