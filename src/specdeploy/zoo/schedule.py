"""Training length by steps or accumulated training time, whichever ends first, with a warmup + cosine
learning rate. Time counts only the training loop's own seconds, summed over the chunks of a resumed run,
so an interrupted run follows the same schedule as an uninterrupted one."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class TrainBudget:
    max_steps: int
    max_seconds: float
    warmup_steps: int = 100
    peak_lr: float = 2e-3
    final_lr_fraction: float = 0.1

    def progress(self, step: int, seconds: float) -> float:
        """Fraction of the run done: the larger of steps done and training time spent."""
        return min(1.0, max(step / self.max_steps, seconds / self.max_seconds))

    def done(self, step: int, seconds: float) -> bool:
        return self.progress(step, seconds) >= 1.0

    def learning_rate(self, step: int, seconds: float) -> float:
        warmup = min(self.warmup_steps, self.max_steps // 10)  # short runs warm up for a tenth of their steps
        if step < warmup:
            return self.peak_lr * (step + 1) / warmup
        cosine = 0.5 * (1 + math.cos(math.pi * self.progress(step, seconds)))
        return self.peak_lr * (self.final_lr_fraction + (1 - self.final_lr_fraction) * cosine)
