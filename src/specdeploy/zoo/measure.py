"""Running one target/drafter pair in several decoding modes on the same prompts, and comparing them.

Used by `specdeploy zoo eval` (the numbers on each card) and `specdeploy demo`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specdeploy.engine.decode import Decoder, GenerationResult, SamplingParams
from specdeploy.engine.loading import load_drafter, load_target
from specdeploy.errors import SpecdeployError


@dataclass(frozen=True)
class ModeSpec:
    mode: str  # ar, dflash or ddtree
    budget: int | None = None

    @property
    def label(self) -> str:
        return f"{self.mode} (budget {self.budget})" if self.budget is not None else self.mode


DEFAULT_MODES = (ModeSpec("ar"), ModeSpec("dflash"), ModeSpec("ddtree", 32))


@dataclass
class ModeResult:
    spec: ModeSpec
    results: list[GenerationResult]  # one per prompt, in prompt order
    seconds: float  # wall time over all prompts

    @property
    def output_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.results)

    @property
    def tau(self) -> float:
        """Tokens committed per verify step over all prompts (bonus included); 1.0 for ar by definition."""
        lengths = [n for r in self.results for n in r.accept_lengths]
        return sum(lengths) / len(lengths) if lengths else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds > 0 else 0.0

    def matches(self, reference: ModeResult) -> int:
        """How many prompts produced exactly the reference's tokens."""
        return sum(a.token_ids == b.token_ids for a, b in zip(self.results, reference.results, strict=True))


def run_modes(
    target_dir: Path,
    draft_dir: Path | None,
    prompts: list[list[int]],
    modes: tuple[ModeSpec, ...] = DEFAULT_MODES,
    max_new_tokens: int = 128,
    warmup: bool = True,
    say: Callable[[str], None] | None = None,
) -> list[ModeResult]:
    """Greedy generation of every prompt in every mode, with one shared target and drafter (CPU, float32)."""
    if not prompts:
        raise SpecdeployError("no prompts to measure on")
    if any(m.mode != "ar" for m in modes) and draft_dir is None:
        raise SpecdeployError("speculative modes need a drafter directory")
    target = load_target(target_dir)
    drafter = load_drafter(draft_dir) if draft_dir is not None else None
    if drafter is not None:
        drafter.check_compatible(target.config)
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    decoders = [Decoder(target, drafter if m.mode != "ar" else None, m.mode, m.budget) for m in modes]
    if warmup:
        for decoder in decoders:
            decoder.generate(prompts[0], SamplingParams(max_new_tokens=8))  # first calls pay one-off costs
    results: list[list[GenerationResult]] = [[] for _ in modes]
    seconds = [0.0 for _ in modes]
    # Modes take turns prompt by prompt, so a load change on a shared machine hits them all alike.
    for prompt in prompts:
        for i, decoder in enumerate(decoders):
            started = time.perf_counter()
            results[i].append(decoder.generate(prompt, params))
            seconds[i] += time.perf_counter() - started
    out = [ModeResult(spec, r, s) for spec, r, s in zip(modes, results, seconds, strict=True)]
    if say is not None:
        for result in out:
            say(f"{result.spec.label}: tau {result.tau:.2f}, {result.tokens_per_s:.0f} tokens/s")
    return out
