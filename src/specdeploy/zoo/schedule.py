"""Training length by steps or wall-clock time, whichever ends first, with a warmup + cosine learning rate."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field


@dataclass
class TrainBudget:
    max_steps: int
    max_seconds: float
    warmup_steps: int = 100
    peak_lr: float = 2e-3
    final_lr_fraction: float = 0.1
    started: float = field(default_factory=time.monotonic)

    def progress(self, step: int) -> float:
        """Fraction of the run done: the larger of steps done and time spent."""
        elapsed = time.monotonic() - self.started
        return min(1.0, max(step / self.max_steps, elapsed / self.max_seconds))

    def done(self, step: int) -> bool:
        return self.progress(step) >= 1.0

    def learning_rate(self, step: int) -> float:
        warmup = min(self.warmup_steps, self.max_steps // 10)  # short runs warm up for a tenth of their steps
        if step < warmup:
            return self.peak_lr * (step + 1) / warmup
        cosine = 0.5 * (1 + math.cos(math.pi * self.progress(step)))
        return self.peak_lr * (self.final_lr_fraction + (1 - self.final_lr_fraction) * cosine)
