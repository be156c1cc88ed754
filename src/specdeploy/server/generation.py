"""One request's generation as the server reports it: cumulative ids and text, stop strings, SGLang's meta_info.

`Generation.advance(step)` folds one engine step into the cumulative state. While the request runs, its text
grows by decoding only the ids since the last settled text (`IncrementalText`); once it finishes, the text is
decoded from all ids. The unstable tail (an incomplete UTF-8 sequence, or a possible start of a stop string) is
held back until the next step settles it, so streamed pieces always concatenate to the final text.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerFast

from specdeploy import sglang_protocol
from specdeploy.engine.decode import Step
from specdeploy.server.params import RequestParams

REPLACEMENT_CHAR = "\ufffd"  # what decoding yields for an incomplete UTF-8 sequence


def new_request_id() -> str:
    return uuid.uuid4().hex


@functools.cache
def decoder(tokenizer: Any) -> Callable[[list[int], bool], str]:
    """`tokenizer.decode(ids, skip_special_tokens=skip)` as `decoder(ids, skip)`: through the Rust tokenizer
    itself where transformers' decode would only wrap it (a fast tokenizer whose decode is the base class's and
    that cleans up no spaces), else through `decode`. The wrapper converts and checks every id list: it doubled
    the time of a streamed step's text on the event loop (8.8 against 4.3 us a step of 3 ids with tiny-code's
    tokenizer, `benchmarks/server_decode_cost.py`)."""
    kind = type(tokenizer)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    plain = (
        isinstance(tokenizer, PreTrainedTokenizerFast)
        and kind.decode is PreTrainedTokenizerFast.decode
        and kind._decode is PreTrainedTokenizerFast._decode
        and not tokenizer.clean_up_tokenization_spaces
    )
    if backend is not None and plain:
        return lambda ids, skip: backend.decode(ids, skip_special_tokens=skip)
    return lambda ids, skip: tokenizer.decode(ids, skip_special_tokens=skip)


class IncrementalText:
    """`decode(ids)` as `ids` grow, decoding a few ids per call rather than all of them (SGLang's detokenizer
    does the same; decoding everything on every event made a stream quadratic in its length). The text of
    `ids[:read]` is settled; a call decodes `ids[surround:]` and keeps what follows the text of
    `ids[surround:read]`: the ids before `read` give the new ones their context (a tokenizer may drop a slice's
    leading space). A tail ending in an incomplete UTF-8 sequence is returned but not settled."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.settled = ""
        self.surround = self.read = 0
        self.surround_text = ""  # decode(ids[surround:read])

    def text(self, ids: list[int]) -> str:
        new = self.decode(ids[self.surround :])
        if not new.startswith(self.surround_text):  # the context changed what came before: start afresh
            self.settled, self.surround, self.read, self.surround_text = "", 0, 0, ""
            new = self.decode(ids)
        tail = new[len(self.surround_text) :]
        if tail and not tail.endswith(REPLACEMENT_CHAR):
            self.settled += tail
            self.surround, self.read = self.read, len(ids)
            self.surround_text = self.decode(ids[self.surround : self.read])
            return self.settled
        return self.settled + tail


@dataclass
class SpecSettings:
    """How the engine speculates: None draft tokens for plain autoregressive decoding."""

    num_draft_tokens: int | None  # tokens verified per step besides the root (block_size - 1, or the budget)


@dataclass
class Generation:
    tokenizer: Any
    prompt_ids: list[int]
    params: RequestParams
    spec: SpecSettings
    rid: str = field(default_factory=new_request_id)
    arrived_at: float = field(default_factory=time.perf_counter)
    output_ids: list[int] = field(default_factory=list)
    text: str = ""  # the stable text: safe to have sent
    finish_reason: dict[str, Any] | None = None
    verify_ct: int = 0
    accept_lengths: list[int] = field(default_factory=list)  # tokens committed per verify step
    first_token_at: float | None = None
    finished_at: float | None = None
    budgets: list[int] = field(default_factory=list)  # DDTree budget of each verify step, when adaptive
    predicted: list[float] = field(default_factory=list)  # tokens the policy predicted for each verify step
    incremental: IncrementalText = field(init=False)  # the running text, while unfinished

    def __post_init__(self) -> None:
        self.incremental = IncrementalText(self._decode)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def advance(self, step: Step) -> list[int]:
        """Fold one step in and return the token ids it added (fewer than the step's when a stop string hits)."""
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        if step.verified_tokens > 0:
            self.verify_ct += 1
            self.accept_lengths.append(len(step.token_ids))
        added = self._append_until_stop_string(step.token_ids)
        if self.finish_reason is None and step.finish_reason == "stop":
            self.finish_reason = {"type": "stop", "matched": step.token_ids[-1]}
        elif self.finish_reason is None and step.finish_reason == "length":
            self.finish_reason = {"type": "length", "length": self.params.sampling.max_new_tokens}
        self._settle_text()
        if self.finished:
            self.finished_at = time.perf_counter()
        return added

    def abort(self, message: str, status_code: int) -> None:
        """End without a natural finish (client gone, shutdown, engine error): SGLang's abort reason."""
        self.finish_reason = {
            "type": "abort",
            "message": message,
            "status_code": status_code,
            "err_type": None,
        }
        self.finished_at = time.perf_counter()
        self._settle_text()

    def _append_until_stop_string(self, tokens: list[int]) -> list[int]:
        if not self.params.stop_strs:
            self.output_ids.extend(tokens)
            return list(tokens)
        added = []
        # token by token, like SGLang, so output_ids end exactly at the token that completes a stop string
        for token in tokens:
            self.output_ids.append(token)
            added.append(token)
            text = self.incremental.text(self.output_ids)
            hit = _first_stop_match(text, self.params.stop_strs)
            if hit is not None:
                self.finish_reason = {"type": "stop", "matched": hit}
                break
        return added

    def _decode(self, ids: list[int]) -> str:
        return decoder(self.tokenizer)(ids, self.params.skip_special_tokens)

    def _settle_text(self) -> None:
        if not self.finished:
            text = self.incremental.text(self.output_ids)
            text = text[: len(text) - _unstable_tail(text, self.params.stop_strs)]
        else:  # decoded whole, once: the final text is exactly the tokenizer's
            ids = self.output_ids
            matched = self.finish_reason.get("matched")
            if isinstance(matched, int) and not self.params.no_stop_trim:
                ids = ids[:-1]  # SGLang leaves the matched stop token out of the text (not out of output_ids)
            text = self._decode(ids)
            if isinstance(matched, str) and (cut := text.find(matched)) >= 0:
                text = text[: cut + len(matched)] if self.params.no_stop_trim else text[:cut]
        if text.startswith(self.text):  # never take back what may already have been streamed
            self.text = text

    def meta_info(self, spec_metrics: bool = True) -> dict[str, Any]:
        """SGLang's meta_info; latency and speculative figures only once finished, as SGLang reports them."""
        latency = self.finished_at - self.arrived_at if self.finished else None
        # SGLang reports them once finished: counting them on every event made a stream quadratic in its steps
        spec = self.spec_metrics() if spec_metrics and self.finished else None
        return sglang_protocol.meta_info(
            self.rid, self.finish_reason, len(self.prompt_ids), len(self.output_ids), latency, spec
        )

    def spec_metrics(self) -> dict[str, Any]:
        """spec_accept_length = completion_tokens / verify steps (bonus included); absent without speculation."""
        draft = self.spec.num_draft_tokens
        if draft is None or self.verify_ct == 0:
            return {}
        correct = sum(self.accept_lengths) - self.verify_ct  # accepted draft tokens: bonus tokens excluded
        proposed = sum(self.budgets) if self.budgets else self.verify_ct * draft
        # the drafted tokens each drafting step accepted (an adaptive budget's AR steps drafted nothing)
        per_step = [n - 1 for i, n in enumerate(self.accept_lengths) if not self.budgets or self.budgets[i]]
        metrics = sglang_protocol.spec_metrics(
            len(self.output_ids), self.verify_ct, correct, proposed, per_step
        )
        if self.budgets:  # an adaptive budget: the tree size of each verify step (0: an AR step)
            metrics["ddtree_budgets"] = self.budgets
            if self.predicted:  # predicted against realised tokens per step (bonus included)
                predicted = sum(self.predicted) / len(self.predicted)
                metrics["ddtree_predicted_accept_length"] = round(predicted, 4)
                metrics["ddtree_accept_length"] = round(sum(self.accept_lengths) / self.verify_ct, 4)
        return metrics

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrived_at


def _first_stop_match(text: str, stops: tuple[str, ...]) -> str | None:
    hits = [(text.find(s), s) for s in stops if s in text]
    return min(hits)[1] if hits else None


def _unstable_tail(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters the next step may still change or cut."""
    tail = len(text) - len(text.rstrip(REPLACEMENT_CHAR))
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:n]):
                tail = max(tail, n)
                break
    return tail
