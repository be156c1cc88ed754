"""What every route shares: the engine, its job queue (a thread or a process), the counters, and running one generation."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from specdeploy import __version__
from specdeploy.engine.budget import BudgetPolicy
from specdeploy.server.api_errors import ApiError
from specdeploy.server.engine_process import EngineProcess, EngineRecipe
from specdeploy.server.generation import Generation, SpecSettings
from specdeploy.server.params import ModelLimits, RequestParams, check_prompt
from specdeploy.server.stats import ServerStats
from specdeploy.server.worker import EngineClient, EngineWorker, Job, JobFailed

ENGINE_NAME = "specdeploy-reference"
DISCONNECT_POLL_S = 0.25  # how often a non-streaming request checks that its client is still there
NO_STEP_YET = object()  # what waiting on a job yields when a poll period passes without a step
# SGLang's --speculative-algorithm for each mode
SPECULATIVE_ALGORITHMS = {"ar": None, "dflash": "DFLASH", "ddtree": "DDTREE"}


class ClientGone(Exception):
    """The client closed the connection before its generation finished."""


class EngineFailed(Exception):
    """The engine raised: the route answers 500 with the message."""


@dataclass
class ServerConfig:
    max_queued_requests: int = 256
    max_running_requests: int = 8  # requests decoded together in one batch (SGLang's flag name)
    served_model_name: str | None = None  # defaults to the engine's model name
    budget_policy: BudgetPolicy | None = None  # DDTree budget chosen per step (--budget auto), engine thread
    # the engine in a process of its own, built from this (its recipe carries --budget auto's budgets);
    # None: in a thread of the server's process, over the engine given
    engine_recipe: EngineRecipe | None = None

    @property
    def adaptive(self) -> bool:
        """--budget auto: each step's DDTree budget chosen by a policy."""
        recipe = self.engine_recipe
        return self.budget_policy is not None or (recipe is not None and recipe.policy_budgets is not None)


class EngineService:
    def __init__(self, engine: Any, config: ServerConfig) -> None:
        self.engine = engine
        self.config = config
        self.model_name = config.served_model_name or engine.model_name
        # clients of SGLang name the model by its --model-path (SGLang's default served name) or "default"
        self.model_aliases = {self.model_name, str(engine.target_path), "default"}
        self.tokenizer = engine.tokenizer
        target_config = engine.target.config
        self.limits = ModelLimits(vocab_size=target_config.vocab_size, max_context=engine.max_context)
        self.spec = SpecSettings(num_draft_tokens=_draft_tokens(engine))
        self.worker: EngineClient
        if config.engine_recipe is not None:
            self.worker = EngineProcess(config.engine_recipe, config.max_queued_requests)
        else:
            self.worker = EngineWorker(
                lambda: engine.batch_engine(config.max_running_requests, config.budget_policy),
                config.max_queued_requests,
            )
        self.stats = ServerStats(lambda: self.worker.num_waiting, lambda: self.worker.num_running)
        self.started_at = time.time()

    def new_generation(
        self, prompt_ids: list[int], params: RequestParams, param: str = "input_ids"
    ) -> Generation:
        check_prompt(prompt_ids, params, self.limits, param)
        return Generation(self.tokenizer, prompt_ids, params, self.spec)

    def submit(self, gen: Generation) -> Job:
        """Queue `gen` now, so that a full queue is refused (503) before any response has started."""
        return self.worker.submit(gen.prompt_ids, gen.params.sampling)

    def submit_all(self, gens: list[Generation]) -> list[Job]:
        """Queue a batch whole or not at all."""
        if len(gens) > self.worker.max_queued:
            raise ApiError(
                f"A batch of {len(gens)} prompts can never fit the request queue "
                f"({self.worker.max_queued}); split it or raise --max-queued-requests.",
                413,
            )
        jobs: list[Job] = []
        try:
            for gen in gens:
                jobs.append(self.submit(gen))
        except ApiError:
            for job in jobs:
                job.cancel()
            raise
        return jobs

    async def follow(
        self, gen: Generation, job: Job, request: Request | None = None
    ) -> AsyncIterator[list[int]]:
        """Yield the ids the steps of `job` add to `gen` (all steps queued since the last yield at once), until
        it finishes.

        With `request`, the wait polls for a client disconnect (non-streaming routes); streaming routes pass
        None because Starlette cancels their body iterator when the client goes, which lands in `finally`.
        """
        checked_at = time.monotonic()
        try:
            while not gen.finished:
                item = await (job.steps.get() if request is None else self._next(job))
                # checked by the clock, not only when idle: steps can arrive faster than the poll period
                if request is not None and time.monotonic() - checked_at >= DISCONNECT_POLL_S:
                    checked_at = time.monotonic()
                    if await request.is_disconnected():
                        raise ClientGone()
                if item is NO_STEP_YET:
                    continue
                added: list[int] = []
                # every step already queued goes into one event, as SGLang streams the latest output of a
                # request when it falls behind: under load, events cost the server more than steps do
                while True:
                    if item is None:
                        gen.abort("The server stopped this request while shutting down.", 503)
                        break  # streams still send a last event, carrying the abort reason
                    if isinstance(item, JobFailed):
                        gen.abort(str(item), 500)
                        raise EngineFailed(str(item))
                    added += gen.advance(item)
                    if gen.finished or job.steps.empty():
                        break
                    item = job.steps.get_nowait()
                if gen.finished:
                    # the steps' budgets, for the meta_info of the last event
                    gen.budgets, gen.predicted = job.budgets[: gen.verify_ct], job.predicted[: gen.verify_ct]
                    job.cancel()  # a stop string may end the request before the engine does
                yield added
        finally:
            job.cancel()
            if not gen.finished:  # the consumer left early: the client disconnected
                gen.abort("The client disconnected before the generation finished.", 499)
            gen.budgets, gen.predicted = job.budgets[: gen.verify_ct], job.predicted[: gen.verify_ct]
            self.stats.record(gen, job.first_step_at)

    async def complete(self, gen: Generation, job: Job, request: Request | None = None) -> Generation:
        """Run `job` to its end (non-streaming); an abort becomes an error answer with its status, as in SGLang."""
        async for _ in self.follow(gen, job, request):
            pass
        if gen.finish_reason is not None and gen.finish_reason["type"] == "abort":
            raise ApiError(gen.finish_reason["message"], gen.finish_reason["status_code"])
        return gen

    async def complete_all(self, gens: list[Generation], jobs: list[Job], request: Request) -> bool:
        """Run a request's jobs to their end in order; False when the client left meanwhile."""
        try:
            for gen, job in zip(gens, jobs, strict=True):
                await self.complete(gen, job, request)
        except ClientGone:
            return False
        finally:
            for job in jobs:
                job.cancel()
        return True

    async def _next(self, job: Job) -> Any:
        """The job's next item, or NO_STEP_YET after a poll period without one."""
        try:
            return await asyncio.wait_for(job.steps.get(), DISCONNECT_POLL_S)
        except asyncio.TimeoutError:  # not yet the builtin TimeoutError on Python 3.10
            return NO_STEP_YET

    def engine_info(self) -> dict[str, Any]:
        """The engine's own identity: the one thing that tells this server apart from SGLang."""
        return {
            "name": ENGINE_NAME,
            "version": __version__,
            "mode": self.engine.mode,
            "budget": "auto" if self.config.adaptive else self.engine.budget,
            "max_running_requests": self.config.max_running_requests,
            "block_size": self.engine.block_size,
            "device": str(self.engine.device),
        }


def _draft_tokens(engine: Any) -> int | None:
    if engine.mode == "ddtree":
        return engine.budget
    if engine.mode == "dflash":
        return engine.block_size - 1
    return None
