"""Metrics of a cell from its request records, and the paired comparison with a baseline.

Definitions (all per request, from the client's own clock):
- TTFT: send -> first chunk that carries a token. E2E: send -> stream closed.
- Chunk gap: time between consecutive chunks. A chunk of k tokens arrives at once, so ITL per token
  spreads its gap evenly, k values of gap/k (SGLang's fix for multi-token chunks). Counting one gap
  and k-1 zeros would make the median ITL 0 under speculative decoding; counting the chunk gap as
  one token's ITL would overstate it k-fold. Chunk gaps are reported separately. Tokens of the
  first chunk belong to TTFT and have no ITL.
- TPOT: (last chunk - first chunk) / (tokens after the first chunk), i.e. the mean of the request's
  per-token ITL; the first chunk may already hold several tokens.
- Output tok/s per user: a request's tokens over its E2E. Output tok/s and requests/s of a cell:
  successful tokens and requests over the span from its first send to its last stream end.
- tau: completion_tokens / spec_verify_ct (tokens per target forward, bonus token included).
- Speedup: baseline time per output token over target time per output token, summed over the
  pairs (same prompt, same turn, same repeat) that succeeded on both sides. Its confidence interval
  is a two-level bootstrap: repeats resampled, then requests within each repeat.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specdeploy.bench.client import error_kind
from specdeploy.bench.results import CellMetrics, Comparison, Distribution, Interval, RequestRecord

if TYPE_CHECKING:
    import numpy as np

NS_PER_MS = 1e6
TAU_BIN = 0.5


@dataclass(frozen=True)
class RequestTiming:
    tokens: int
    ttft_ms: float
    e2e_ms: float
    tpot_ms: float | None
    itl_ms: list[float]
    chunk_gaps_ms: list[float]
    tokens_per_chunk: list[int]
    tau: float | None


def request_timing(record: RequestRecord) -> RequestTiming | None:
    """Timing of a successful request that produced at least one token; None otherwise."""
    chunks = record.chunks
    if not record.ok or not chunks or record.end_ns is None:
        return None
    itl: list[float] = []
    gaps: list[float] = []
    per_chunk = [chunks[0].tokens]
    for before, after in zip(chunks, chunks[1:], strict=False):
        gap = (after.t_ns - before.t_ns) / NS_PER_MS
        new = after.tokens - before.tokens
        gaps.append(gap)
        per_chunk.append(new)
        itl.extend([gap / new] * new)
    tokens = record.completion_tokens or chunks[-1].tokens
    later = chunks[-1].tokens - chunks[0].tokens
    tpot = (chunks[-1].t_ns - chunks[0].t_ns) / NS_PER_MS / later if later > 0 else None
    tau = tokens / record.spec_verify_ct if record.spec_verify_ct else None
    return RequestTiming(
        tokens=tokens,
        ttft_ms=chunks[0].t_ns / NS_PER_MS,
        e2e_ms=record.end_ns / NS_PER_MS,
        tpot_ms=tpot,
        itl_ms=itl,
        chunk_gaps_ms=gaps,
        tokens_per_chunk=per_chunk,
        tau=tau,
    )


def distribution(values: Iterable[float]) -> Distribution:
    import numpy as np  # here, not at module level: numpy slows `specdeploy --help`

    array = np.asarray(list(values), dtype=float)
    if array.size == 0:
        return Distribution()
    p50, p90, p99 = np.percentile(array, [50, 90, 99])
    return Distribution(
        n=int(array.size), mean=float(array.mean()), p50=float(p50), p90=float(p90), p99=float(p99)
    )


def tau_histogram(taus: Sequence[float]) -> dict[str, int]:
    """Counts of per-request tau in bins of 0.5, keyed by the bin's lower edge ("2.5" = [2.5, 3.0))."""
    counts = Counter(math.floor(t / TAU_BIN) * TAU_BIN for t in taus)
    return {f"{edge:.1f}": counts[edge] for edge in sorted(counts)}


def cell_metrics(records: Sequence[RequestRecord]) -> CellMetrics:
    """Aggregate metrics of one cell; errors are counted, never averaged into the latencies."""
    timings = [t for t in map(request_timing, records) if t is not None]
    errors = Counter(error_kind(r.error) for r in records if r.error is not None)
    if records:
        first = min(r.start_ns for r in records)
        last = max(r.start_ns + (r.end_ns or 0) for r in records)
        duration_s = max(last - first, 1) / 1e9
    else:
        duration_s = 0.0
    output_tokens = sum(t.tokens for t in timings)
    rate = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: 0.0)
    taus = [t.tau for t in timings if t.tau is not None]
    return CellMetrics(
        n_requests=len(records),
        n_errors=sum(errors.values()),
        errors=dict(errors),
        duration_s=duration_s,
        requests_per_s=rate(len(timings)),
        output_tokens=output_tokens,
        output_tok_s=rate(output_tokens),
        output_tok_s_per_user=distribution(t.tokens / (t.e2e_ms / 1e3) for t in timings if t.e2e_ms > 0),
        ttft_ms=distribution(t.ttft_ms for t in timings),
        tpot_ms=distribution(t.tpot_ms for t in timings if t.tpot_ms is not None),
        itl_ms=distribution(v for t in timings for v in t.itl_ms),
        chunk_gap_ms=distribution(v for t in timings for v in t.chunk_gaps_ms),
        tokens_per_chunk=distribution(v for t in timings for v in t.tokens_per_chunk),
        e2e_ms=distribution(t.e2e_ms for t in timings),
        tau=distribution(taus),
        tau_histogram=tau_histogram(taus),
    )


@dataclass(frozen=True)
class Pair:
    """One prompt's result on both sides: output tokens and end-to-end seconds."""

    repeat: int
    baseline_tokens: int
    baseline_s: float
    target_tokens: int
    target_s: float
    same_output: bool | None


def pair_records(
    target: Mapping[int, Sequence[RequestRecord]], baseline: Mapping[int, Sequence[RequestRecord]]
) -> list[Pair]:
    """Pairs (prompt, turn) within each repeat present on both sides, both successful."""
    pairs = []
    for repeat, target_records in target.items():
        by_prompt = {(r.prompt_id, r.turn): r for r in baseline.get(repeat, ())}
        for t in target_records:
            b = by_prompt.get((t.prompt_id, t.turn))
            if b is None:
                continue
            bt, tt = request_timing(b), request_timing(t)
            if bt is None or tt is None:
                continue
            pairs.append(
                Pair(repeat, bt.tokens, bt.e2e_ms / 1e3, tt.tokens, tt.e2e_ms / 1e3, _same_output(b, t))
            )
    return pairs


def _same_output(a: RequestRecord, b: RequestRecord) -> bool | None:
    if a.output_ids is not None and b.output_ids is not None:
        return a.output_ids == b.output_ids
    if a.output_text or b.output_text:
        return a.output_text == b.output_text
    return None


def speedup_interval(
    pairs: Sequence[Pair], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> Interval | None:
    """Speedup with a percentile bootstrap CI over repeats, then requests within each repeat."""
    import numpy as np

    if not pairs:
        return None
    repeats = sorted({p.repeat for p in pairs})
    columns = [
        np.array(
            [[p.baseline_s, p.baseline_tokens, p.target_s, p.target_tokens] for p in pairs if p.repeat == r],
            dtype=float,
        )
        for r in repeats
    ]
    rng = np.random.default_rng(seed)
    repeat_counts = rng.multinomial(len(repeats), np.full(len(repeats), 1 / len(repeats)), size=resamples)
    totals = np.zeros((resamples, 4))
    for i, rows in enumerate(columns):
        weights = rng.multinomial(len(rows), np.full(len(rows), 1 / len(rows)), size=resamples)
        totals += repeat_counts[:, i, None] * (weights @ rows)
    point = sum(rows.sum(axis=0) for rows in columns)
    low, high = np.percentile(_speedup(totals), [50 * (1 - confidence), 50 * (1 + confidence)])
    return Interval(
        estimate=float(_speedup(point[None, :])[0]),
        low=float(low),
        high=float(high),
        confidence=confidence,
        n_pairs=len(pairs),
    )


def _speedup(totals: np.ndarray) -> np.ndarray:
    """(baseline seconds per token) / (target seconds per token) for rows of summed columns."""
    import numpy as np

    with np.errstate(divide="ignore", invalid="ignore"):
        return (totals[:, 0] / totals[:, 1]) / (totals[:, 2] / totals[:, 3])


def compare(
    target: Mapping[int, Sequence[RequestRecord]],
    baseline: Mapping[int, Sequence[RequestRecord]],
    baseline_cell: str,
    greedy: bool,
    seed: int = 0,
) -> Comparison:
    """Target records against baseline records (both keyed by repeat); output match only when greedy."""
    pairs = pair_records(target, baseline)
    matches = [p.same_output for p in pairs if p.same_output is not None]
    return Comparison(
        baseline_cell=baseline_cell,
        speedup=speedup_interval(pairs, seed=seed),
        output_match_rate=(sum(matches) / len(matches)) if greedy and matches else None,
        n_compared=len(pairs),
    )
