"""Continuous batching with speculation: requests join and leave between steps; one step serves them all.

Design. Each iteration does two things, as SGLang's chunked prefill does:
1. Prefill: waiting requests are admitted in arrival order while a row is free, and their prompts run
   through the target in chunks of at most `prefill_tokens` tokens per iteration (a long prompt spans
   several iterations), so a long prompt never stalls the running requests for long.
2. Decode: one batched step for every running request (one drafter pass over all their blocks, one tree
   per request, one target forward over all their trees); each request then commits its own path.
Requests that finish (stop token, length, cancellation) leave between iterations. A request that fails on
its own (its admission or prefill raises) leaves with an error event and the others go on; only a failure
of the batched step itself, which no single request can be blamed for, ends the iteration with an exception.
With an adaptive budget (`BudgetPolicy`), every iteration picks the DDTree budget for the batch from the
number of running requests (0: an AR step), and each drafting step's trees predict the acceptance of every
budget the policy may pick.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specdeploy.engine.budget import BudgetPolicy, measure_step_cost
from specdeploy.engine.request import Step, StopRules, check_mode
from specdeploy.engine.sampling import SamplingParams, UniformStream
from specdeploy.engine.step import DEFAULT_PREFILL_TOKENS, StepRunner
from specdeploy.engine.tree import realised_accept_lengths
from specdeploy.errors import SpecdeployError


@dataclass
class LoopTimes:
    """Where the iterations spent their time since the engine started or the times were last reset: prefill,
    the runner's steps (from launch to the host's copy of their tokens), the budget policy's choices, and the
    rest of `iterate` (stop rules, events, rows leaving). `policy_overlapped`, apart: the policy's
    observations and rankings, done while a step runs (part of its time; on a GPU hidden by its kernels).
    `step_rows`: the running requests summed over the steps (their mean shows how full the batch was)."""

    iterations: int = 0
    steps: int = 0
    step_rows: int = 0
    prefill_tokens: int = 0
    # when these times began (the engine's start, or a reset)
    started: float = field(default_factory=time.perf_counter)
    seconds: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(
            ("iterate", "prefill", "step", "policy", "policy_windows", "policy_overlapped"), 0.0
        )
    )

    def describe(self) -> dict:
        per = {name: 1e3 * s / max(self.iterations, 1) for name, s in self.seconds.items()}
        parts = {name: round(per[name], 4) for name in ("prefill", "step", "policy")}
        other = per["iterate"] - sum(per[name] for name in parts)
        return {
            "iterations": self.iterations,
            "steps": self.steps,
            "mean_running_requests": round(self.step_rows / max(self.steps, 1), 2),
            "prefill_tokens": self.prefill_tokens,
            "ms_per_iteration": {
                **parts,
                "rest_of_iteration": round(max(0.0, other), 4),
                # of `policy`, the attention windows each budget's step would read (`StepRunner.step_windows`)
                "policy_windows": round(per["policy_windows"], 4),
                "policy_overlapped": round(per["policy_overlapped"], 4),
            },
        }


@dataclass(eq=False)  # identity: requests key dictionaries
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    id: int = 0
    rules: StopRules | None = None
    budgets: list[int] = field(default_factory=list)  # DDTree budget of each verify step
    predicted: list[float] = field(default_factory=list)  # tokens predicted per step (adaptive budget)
    finished: bool = False
    cancelled: bool = False


@dataclass
class Event:
    """A request's step: its first token (after its prefill) or one verify step's committed tokens; or, with
    `failure` set and no step, why the request failed and left."""

    request: Request
    step: Step | None
    failure: Exception | None = None
    at: float = field(default_factory=time.perf_counter)  # made once the step's tokens reached the host

    @property
    def error(self) -> str | None:
        return None if self.failure is None else f"{type(self.failure).__name__}: {self.failure}"


class BatchEngine:
    def __init__(
        self,
        target: torch.nn.Module,
        drafter: torch.nn.Module | None,
        mode: str,
        budget: int | None,
        max_running: int,
        max_context: int,
        cuda_graphs: bool = True,
        prefill_tokens: int = DEFAULT_PREFILL_TOKENS,
        policy: BudgetPolicy | None = None,
        fixed_shapes: bool | None = None,
    ) -> None:
        """`max_context`: positions (prompt + new tokens) a request may reach; `policy` picks each step's
        DDTree budget (default: always `budget`, which then is the largest the policy may pick); `fixed_shapes`:
        steps run on buckets of rows, prompts' first chunks on buckets of tokens (StepRunner; default with
        CUDA graphs)."""
        check_mode(mode, drafter is not None, budget)
        if max_running < 1:
            raise SpecdeployError(f"max running requests must be at least 1, got {max_running}")
        self.target, self.mode, self.budget = target, mode, budget
        self.drafter = drafter if mode != "ar" else None
        self.max_running = max_running
        self.prefill_tokens = prefill_tokens
        self.policy = policy
        self.loop = LoopTimes()
        # when the last step's tokens reached the host (None: no request has run since)
        self._last_step_end: float | None = None
        # the policy's observations not yet folded in: those of a step are folded in while the next one runs
        # (on a GPU its kernels hide that host work), or when the engine goes idle
        self._unobserved: list[Callable[[], None]] = []
        self.device = target.embed_tokens.weight.device
        self._ids = itertools.count(1)
        self.waiting: deque[Request] = deque()
        self.prefilling: Request | None = None
        self.running: list[Request] = []  # the request in each row of the runner
        self.runner = StepRunner(target, self.drafter, mode, budget, rows=max_running, cuda_graphs=cuda_graphs,
                                 fixed_shapes=fixed_shapes, prefill_tokens=prefill_tokens)  # fmt: skip
        if policy is not None and policy.drafting:
            self.runner.predict_acceptance(policy.drafting)
        self._budgets = policy.budgets if policy is not None else [budget]  # every budget a step may use
        started = time.perf_counter()
        self.graphs_captured = 0
        self.max_context = 0
        self.reserve(max_context)
        if policy is not None and policy.load_adds is None:
            # on a GPU, what slows a step is host work (another thread holding the interpreter, a server's
            # delivery): time added to every step whatever its size, not a factor on it
            policy.load_adds = self.device.type == "cuda"
        if policy is not None and policy.cost is None:
            policy.cost = measure_step_cost(self.runner, policy.budgets)
        self.startup_s = time.perf_counter() - started

    def reserve(self, max_context: int) -> None:
        """Let requests reach `max_context` positions (prompt + new tokens). Growing the caches needs no request
        running; every graph a greedy step can need is captured then, not inside requests' steps."""
        context = max(self.max_context, max_context)
        caches = self.runner.cache
        self.runner.reserve(context)
        if self.runner.cache is not caches:
            self.graphs_captured += self.runner.capture(self._budgets)
        self.max_context = context

    @property
    def num_running(self) -> int:
        return len(self.running) + (self.prefilling is not None)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def idle(self) -> bool:
        return not (self.waiting or self.prefilling or self.running)

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> Request:
        if not prompt_ids:
            raise SpecdeployError("the prompt is empty: give at least one token")
        if len(prompt_ids) + params.max_new_tokens > self.max_context:
            raise SpecdeployError(
                f"{len(prompt_ids)} prompt + {params.max_new_tokens} new tokens exceed the engine's context "
                f"of {self.max_context} positions"
            )
        request = Request(list(prompt_ids), params, id=next(self._ids))
        request.rules = StopRules(params, self.target.config.eos_token_ids)
        self.waiting.append(request)
        return request

    def cancel(self, request: Request) -> None:
        """Stop a request; it leaves at the next iteration (its row is freed then)."""
        request.cancelled = True

    def iterate(self) -> list[Event]:
        """Admit and prefill within this iteration's token budget, then one step of every running request."""
        self._drop_cancelled()
        started = time.perf_counter()
        events = self._prefill()
        prefill_seconds = time.perf_counter() - started
        if self.running:
            budget, windows = None, None
            if self.policy is not None:
                chosen_at = time.perf_counter()
                windows = self.runner.step_windows(self.policy.budgets)  # what each budget's cost is read at
                windows_at = time.perf_counter()
                budget = self.policy.choose(len(self.running), windows)
                self.loop.seconds["policy_windows"] += windows_at - chosen_at
                self.loop.seconds["policy"] += time.perf_counter() - chosen_at
            events += self._step(budget, windows, prefill_seconds)
        self._drop_finished()
        if not self.running:
            self._last_step_end = None  # the wait for requests is no step's overhead
            self._fold_observations()
        self.loop.iterations += 1
        self.loop.seconds["prefill"] += prefill_seconds
        self.loop.seconds["iterate"] += time.perf_counter() - started
        return events

    # --------------------------------------------------------------------------------------- prefill

    def _prefill(self) -> list[Event]:
        events = []
        spent = 0
        while spent < self.prefill_tokens:
            if self.prefilling is None:
                if not self.waiting or len(self.running) >= self.max_running:
                    break
                request = self.waiting.popleft()
                try:
                    self._begin(request)
                except Exception as exc:  # this request's own settings or prompt: it alone fails
                    events.append(self._fail(request, exc))
                    continue
            request = self.prefilling
            runner = self.runner
            chunk = min(self.prefill_tokens - spent, runner.prefill_remaining)
            try:
                first = runner.prefill(chunk)
            except Exception as exc:  # the prefill runs in the spare row: the running rows are untouched
                events.append(self._fail(request, exc))
                continue
            spent += chunk
            self.loop.prefill_tokens += chunk
            if first is None:
                break
            self.prefilling = None
            self.running.append(request)
            events.append(self._event(request, [first], 0))
        return events

    def _fail(self, request: Request, exc: Exception) -> Event:
        """End a request that failed before it ran: its prefill (if begun) is dropped, its row stays free."""
        if self.prefilling is request:
            self.runner.abandon()
            self.prefilling = None
        request.finished = True
        return Event(request, None, exc)

    def _begin(self, request: Request) -> None:
        params = request.params
        uniforms = None
        if not params.greedy:
            uniforms = UniformStream(params.max_new_tokens + self.runner.block + 2, params.seed, self.device)
        self.runner.begin(request.prompt_ids, params, uniforms)
        self.prefilling = request

    # ---------------------------------------------------------------------------------------- decode

    def _step(
        self, budget: int | None, windows: tuple[int, ...] | None, prefill_seconds: float
    ) -> list[Event]:
        """`prefill_seconds`: this iteration's prefill time; the time since the last step less it is the
        iteration's overhead."""
        events = []
        policy = self.policy
        started = time.perf_counter()  # each step ends in a host synchronisation: this is its real time
        if policy is not None and self._last_step_end is not None:
            gap = started - self._last_step_end - prefill_seconds
            self._unobserved.append(lambda: policy.observe_overhead(gap))
        predict = False
        if policy is not None:  # an acceptance-exploring step predicts, whatever the runner's cadence
            predict, policy.predict_next = policy.predict_next, False
        results = self.runner.step(budget, self._fold_observations if policy is not None else None, predict)
        expected, walked = self.runner.expected, self.runner.walked
        seconds = time.perf_counter() - started
        self._last_step_end = started + seconds  # what follows (events, a server's delivery) is overhead
        self.loop.steps += 1
        self.loop.step_rows += len(results)
        self.loop.seconds["step"] += seconds
        predicted = self._predicted(budget, expected, len(results)) if policy is not None else None
        for row, (request, (tokens, verified)) in enumerate(zip(self.running, results, strict=True)):
            if budget is not None:
                request.budgets.append(budget)
            if predicted is not None:  # this request's tree prediction, before the step is folded in
                request.predicted.append(predicted[row])
            events.append(self._event(request, tokens, verified))
        if policy is not None:
            accepted = [len(tokens) for tokens, _ in results]

            # folded in while the next step runs, with what each smaller budget would have committed
            def observe() -> None:
                realised = (
                    None if walked is None else realised_accept_lengths(*walked, policy.drafting).tolist()
                )
                policy.observe(budget, accepted, seconds, expected, windows, realised)

            self._unobserved.append(observe)
        return events

    def _fold_observations(self) -> None:
        """Fold the policy's pending observations in, and rank the budgets for the running requests as they
        stand, one fewer and one more, so that the next choice reads a ranking already made: under load a
        request leaves or joins at most iterations, and a ranking made then would delay the next step."""
        if not self._unobserved:
            return
        started = time.perf_counter()
        for observe in self._unobserved:
            observe()
        self._unobserved.clear()
        if self.running:
            windows, running = self.runner.step_windows(self.policy.budgets), len(self.running)
            for count in (running, running - 1, running + 1):
                if 1 <= count <= self.max_running:
                    self.policy.ranking(count, windows)
        self.loop.seconds["policy_overlapped"] += time.perf_counter() - started

    def _predicted(self, budget: int, expected: list[list[float]] | None, rows: int) -> list[float]:
        """The tokens each row's step at `budget` was expected to commit: its own tree's calibrated
        prediction, or, on a drafting step that predicted nothing (`StepRunner.predict_every`), the running
        mean of the trees' predictions, calibrated alike (the first drafting step predicts, so there is one)."""
        if budget == 0:
            return [1.0] * rows
        policy = self.policy
        scale = policy.calibration(budget)
        if expected is None:
            return [1 + scale * (policy.predicted[budget] - 1)] * rows
        column = policy.drafting.index(budget)
        return [1 + scale * (line[column] - 1) for line in expected]

    def _event(self, request: Request, tokens: list[int], verified: int) -> Event:
        step = request.rules.commit(tokens, verified)
        request.finished = step.finish_reason is not None
        return Event(request, step)

    # --------------------------------------------------------------------------------------- leaving

    def _drop_cancelled(self) -> None:
        if any(r.cancelled for r in self.waiting):  # rebuilt only then: this runs before every step
            self.waiting = deque(r for r in self.waiting if not r.cancelled)
        if self.prefilling is not None and self.prefilling.cancelled:
            self.runner.abandon()
            self.prefilling = None
        cancelled = False
        for request in self.running:
            if request.cancelled:
                request.finished = cancelled = True
        if cancelled:
            self._drop_finished()

    def _drop_finished(self) -> None:
        """Free the finished rows with as few row moves as there are finished rows below the last one running: the
        finished rows at the end leave first, with no move, so that each other one takes in a running row."""
        row = 0
        while row < len(self.running):
            while self.running and self.running[-1].finished:
                self.runner.release(len(self.running) - 1)  # the last row: nothing moves
                self.running.pop()
            if row < len(self.running) and self.running[row].finished:
                self.runner.release(row)  # the last row, running, moves into the freed one
                self.running[row] = self.running.pop()
            row += 1
