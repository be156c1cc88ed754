"""A request's rules, whichever loop runs it: what a mode needs, and where the committed tokens stop."""

from __future__ import annotations

from dataclasses import dataclass

from specdeploy.engine.sampling import SamplingParams
from specdeploy.errors import SpecdeployError
from specdeploy.modes import ENGINE_MODES
from specdeploy.modes import check_mode as check_budget


@dataclass
class Step:
    """One engine step: the prefill (which yields the first token) or one draft + verify step."""

    token_ids: list[int]  # tokens committed by this step (several under speculation)
    verified_tokens: int  # tokens the target verified in this step (0 for the prefill step)
    finish_reason: str | None  # None until the last step: "stop" (EOS or stop token, included) or "length"


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
