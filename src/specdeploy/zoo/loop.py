"""The resumable optimisation loop shared by the target and the drafter.

Everything a run needs to continue exactly where it stopped lives in one state file: the fp32 weights, the
optimizer's moments, the data generator's state, the step and training seconds so far (the learning rate
follows them) and the log history. It is rewritten every few minutes and whenever the loop stops.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from specdeploy.errors import SpecdeployError
from specdeploy.zoo.chunk import ChunkLimit
from specdeploy.zoo.schedule import TrainBudget


@dataclass
class TrainLog:
    steps: int = 0
    seconds: float = 0.0  # training-loop time summed over chunks
    tokens_seen: int = 0
    final_train_loss: float = float("nan")
    held_out_loss: float = float("nan")
    history: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        """The log without its history, rounded; a loss never measured is left out (JSON has no NaN)."""
        fields = {k: v for k, v in asdict(self).items() if k != "history" and v == v}
        return {**fields, "seconds": round(self.seconds, 1)}


@dataclass
class StepOutcome:
    loss: torch.Tensor  # the step's loss, still on the device (read only when logging)
    tokens: int | torch.Tensor  # tokens (or labelled slots) the step learned from; may stay on the device
    details: Callable[[], dict] = dict  # extra history fields, computed only when logging


@dataclass
class Resumable:
    """A model and its optimizer and data generator, saved to / restored from `path` with a TrainLog.

    `extra` holds stage-specific resume data (the drafter's position in its rollouts).
    """

    path: Path
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    log: TrainLog = field(default_factory=TrainLog)
    extra: dict = field(default_factory=dict)

    def restore(self) -> bool:
        """Load the saved state if there is one; True if the run resumes."""
        if not self.path.is_file():
            return False
        # Loaded to the CPU: the generator state must stay there; weights and moments are copied to the device.
        state = torch.load(self.path, map_location="cpu", weights_only=False)
        tensors = self.tensors()
        if tensors.keys() != state["model"].keys():
            raise SpecdeployError(
                f"{self.path} holds another model's state: remove it to start this stage again"
            )
        with torch.no_grad():
            for name, tensor in tensors.items():
                tensor.copy_(state["model"][name])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.log = TrainLog(**state["log"])
        self.extra = state["extra"]
        return True

    def tensors(self) -> dict[str, torch.Tensor]:
        """Parameters and buffers by their module names: no state_dict hooks (the engine's drafter shows
        merged projections split in its state_dict), and the optimizer keeps pointing at the same tensors."""
        return {**dict(self.model.named_parameters()), **dict(self.model.named_buffers())}

    def save(self) -> None:
        state = {
            "model": self.tensors(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "log": asdict(self.log),
            "extra": self.extra,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, self.path)  # a cut-off leaves the previous state whole


def train_loop(
    run: Resumable,
    budget: TrainBudget,
    step: Callable[[], StepOutcome],
    limit: ChunkLimit,
    checkpoint: Callable[[], None],
    checkpoint_seconds: float,
    log_every: int,
    label: str,
    say: Callable[[str], None],
) -> bool:
    """Run `step` until the budget is spent (True) or the chunk's limit is reached (False); calls
    `checkpoint` (which saves `run`, and whatever else the caller records) every `checkpoint_seconds` and
    on return."""
    log = run.log
    parameters = [p for p in run.model.parameters() if p.requires_grad]
    last_save = time.monotonic()
    pending_tokens: int | torch.Tensor = 0  # summed on the device between reads, to avoid a sync per step
    while not budget.done(log.steps, log.seconds) and not limit.reached():
        started = time.monotonic()
        lr = budget.learning_rate(log.steps, log.seconds)
        for group in run.optimizer.param_groups:
            group["lr"] = lr
        outcome = step()
        outcome.loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        log.steps += 1
        pending_tokens = pending_tokens + outcome.tokens
        # Reading the loss waits for the device, so the time of the steps queued before it is counted too.
        loss = outcome.loss.item() if log.steps % log_every == 0 else None
        log.seconds += time.monotonic() - started
        if loss is None and budget.done(log.steps, log.seconds):
            loss = outcome.loss.item()
        if loss is not None:
            log.tokens_seen += int(pending_tokens)
            pending_tokens = 0
            log.final_train_loss = round(loss, 4)
            entry = {"step": log.steps, "loss": log.final_train_loss, "s": round(log.seconds, 1)}
            log.history.append({**entry, **outcome.details()})
            say(f"{label} step {log.steps} loss {loss:.4f} lr {lr:.2e} ({log.seconds:.0f} s)")
        if time.monotonic() - last_save >= checkpoint_seconds:
            log.tokens_seen += int(pending_tokens)
            pending_tokens = 0
            checkpoint()
            last_save = time.monotonic()
    log.tokens_seen += int(pending_tokens)
    checkpoint()
    return budget.done(log.steps, log.seconds)
