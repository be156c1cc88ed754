"""One request at a time: the batch engine (`engine.batch`) with one running request.

A request prefills the target (and the drafter's context), yields the first token, then yields each
step's committed tokens until a stop token or the length limit. Admission, prefill, the stop rules and the
release of the request's row are the batch engine's; this loop only grows its context to each request's
needs and times the request.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from specdeploy.engine.batch import BatchEngine, Event
from specdeploy.engine.request import Step
from specdeploy.engine.sampling import SamplingParams
from specdeploy.engine.step import StepRunner

__all__ = ["Decoder", "GenerationResult", "SamplingParams", "Step"]


@dataclass
class GenerationResult:
    token_ids: list[int]
    finish_reason: str
    num_steps: int  # verify steps (the prefill is not one)
    accept_lengths: list[int]  # tokens committed per verify step, bonus token included
    verified_lengths: list[int]  # tokens the target verified per step (1 + tree size)
    prefill_s: float  # from the call to the first token on the host
    decode_s: float  # from the first token to the last step's tokens on the host
    step_tokens: list[int] = field(default_factory=list)  # tokens of each step, prefill first

    @property
    def tau(self) -> float:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        total = self.prefill_s + self.decode_s
        return len(self.token_ids) / total if total > 0 else 0.0


def reserved_context(needed: int, runner: StepRunner, max_positions: int) -> int:
    """The context a decoder reserves for a request needing `needed` positions: what fills caches of the next
    power-of-two capacity (within the model's positions, never below the need), so that requests of growing
    lengths reallocate the caches (and re-capture their graphs) once per doubling, not at every new longest
    request."""
    margin = runner.reserve_margin
    return max(needed, min((1 << (needed + margin - 1).bit_length()) - margin, max_positions))


class Decoder:
    def __init__(
        self,
        target: torch.nn.Module,
        drafter: torch.nn.Module | None = None,
        mode: str = "ar",
        budget: int | None = None,
        cuda_graphs: bool = True,
        fixed_shapes: bool | None = None,
    ) -> None:
        """`fixed_shapes`: prompts' first chunks padded to buckets of tokens (StepRunner; default with CUDA
        graphs)."""
        # The caches start small and grow to each request's prompt + new tokens, rounded up (`reserved_context`).
        self.engine = BatchEngine(target, drafter, mode, budget, max_running=1, max_context=1,
                                  cuda_graphs=cuda_graphs, fixed_shapes=fixed_shapes)  # fmt: skip

    @property
    def runner(self) -> StepRunner:
        """The engine's runner (its stage timer and CUDA graphs)."""
        return self.engine.runner

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationResult:
        start = time.perf_counter()
        events = list(self._events(prompt_ids, params))
        steps = [event.step for event in events]
        verify_steps = steps[1:]
        return GenerationResult(
            token_ids=[t for s in steps for t in s.token_ids],
            finish_reason=steps[-1].finish_reason or "length",
            num_steps=len(verify_steps),
            accept_lengths=[len(s.token_ids) for s in verify_steps],
            verified_lengths=[s.verified_tokens for s in verify_steps],
            prefill_s=events[0].at - start,
            decode_s=events[-1].at - events[0].at,
            step_tokens=[len(s.token_ids) for s in steps],
        )

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[Step]:
        for event in self._events(prompt_ids, params):
            yield event.step

    def _events(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[Event]:
        engine = self.engine
        needed = len(prompt_ids) + params.max_new_tokens
        engine.reserve(reserved_context(needed, engine.runner, engine.target.config.max_position_embeddings))
        request = engine.submit(prompt_ids, params)
        try:
            while not request.finished:
                for event in engine.iterate():
                    if event.failure is not None:
                        raise event.failure
                    yield event
        finally:
            if not request.finished:  # the consumer stopped early: the request leaves, its row is freed
                engine.cancel(request)
                engine.iterate()
