"""Smoke test: a few greedy prompts through the native `/generate` API, with acceptance length when speculative."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from pydantic import BaseModel

from specdeploy.api_key import auth_headers
from specdeploy.errors import SpecdeployError

if TYPE_CHECKING:
    import httpx

SMOKE_PROMPTS = (
    "Question: Natalia sold 48 clips in April and half as many in May. How many clips did she sell in total?\n"
    "Answer: Let's think step by step.",
    "def fibonacci(n: int) -> int:\n    ",
    "The three most important ideas in the history of computing are",
)
# Below this many tokens per verify step a drafter is barely helping: usually it was trained for another
# target (or target version), or it is quantized; correct pairs reach 3-7 on these prompts.
MIN_PLAUSIBLE_TAU = 1.3
# Lossless speculation reproduces greedy AR; on GPUs, bf16 near-ties may still split two runs late in a
# long output, so only the start of each answer must agree.
GREEDY_PREFIX_TOKENS = 16
GREEDY_PREFIX_CHARS = 48  # for servers that return text only


class SmokeResult(BaseModel):
    prompt: str
    completion: str
    completion_tokens: int
    latency_s: float
    verify_steps: int | None  # SGLang `meta_info.spec_verify_ct`; None without speculation
    tau: float | None  # tokens committed per verify step, bonus token included
    output_ids: list[int] | None = None  # when the server returns them


class GreedyCheck(BaseModel):
    """The speculative server's greedy answers against the AR server's, prompt by prompt."""

    reference: str  # where the AR answers come from
    unit: str  # "tokens" or "characters"
    required: list[int]  # per prompt: leading units that must agree
    agreed: list[int]  # per prompt: leading units that do agree

    @property
    def passed(self) -> bool:
        return all(a >= r for a, r in zip(self.agreed, self.required, strict=True))


class SmokeReport(BaseModel):
    results: list[SmokeResult]
    tau: float | None  # over all prompts: total completion tokens / total verify steps
    warnings: list[str]
    greedy: GreedyCheck | None = None


def generate(client: httpx.Client, base_url: str, prompt: str, max_new_tokens: int) -> SmokeResult:
    # Imported here: httpx and huggingface_hub cost `specdeploy --help` a good part of a second.
    import httpx

    payload = {"text": prompt, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}
    start = time.perf_counter()
    try:
        response = client.post(f"{base_url}/generate", json=payload)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise SpecdeployError(
            f"smoke test: /generate failed ({exc}); the server is up but cannot generate: see `specdeploy logs`"
        ) from exc
    latency = time.perf_counter() - start
    body = response.json()
    meta = body.get("meta_info", {})
    verify_steps = meta.get("spec_verify_ct")
    completion_tokens = int(meta.get("completion_tokens", 0))
    tau = meta.get("spec_accept_length")
    if tau is None and verify_steps:
        tau = completion_tokens / verify_steps
    return SmokeResult(
        prompt=prompt,
        completion=body.get("text", ""),
        completion_tokens=completion_tokens,
        latency_s=latency,
        verify_steps=verify_steps or None,
        tau=tau,
        output_ids=body.get("output_ids"),
    )


def _agreement(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def compare_greedy(candidate: SmokeReport, reference: SmokeReport, source: str) -> GreedyCheck:
    """How far each greedy answer agrees with the AR server's for the same prompt."""
    pairs = list(zip(candidate.results, reference.results, strict=True))
    by_ids = all(c.output_ids is not None and r.output_ids is not None for c, r in pairs)
    required, agreed = [], []
    for cand, ref in pairs:
        a, b = (cand.output_ids, ref.output_ids) if by_ids else (cand.completion, ref.completion)
        limit = GREEDY_PREFIX_TOKENS if by_ids else GREEDY_PREFIX_CHARS
        required.append(min(limit, len(a), len(b)))
        agreed.append(_agreement(a, b))
    return GreedyCheck(
        reference=source, unit="tokens" if by_ids else "characters", required=required, agreed=agreed
    )


def run_smoke_test(
    base_url: str,
    speculative: bool,
    prompts: tuple[str, ...] = SMOKE_PROMPTS,
    max_new_tokens: int = 64,
    timeout_s: float = 300.0,
) -> SmokeReport:
    import httpx

    with httpx.Client(timeout=timeout_s, headers=auth_headers()) as client:
        results = [generate(client, base_url, prompt, max_new_tokens) for prompt in prompts]
    warnings = [f"prompt {i} produced no tokens" for i, r in enumerate(results) if r.completion_tokens == 0]
    steps = sum(r.verify_steps or 0 for r in results)
    tau = sum(r.completion_tokens for r in results) / steps if steps else None
    if speculative and tau is None:
        warnings.append("the server reported no speculative verify steps: is speculative decoding enabled?")
    if speculative and tau is not None and tau < MIN_PLAUSIBLE_TAU:
        warnings.append(
            f"acceptance length tau = {tau:.2f} tokens/step is implausibly low (< {MIN_PLAUSIBLE_TAU}): the "
            "drafter probably does not match the target (wrong pair or version) or is quantized"
        )
    return SmokeReport(results=results, tau=tau, warnings=warnings)
