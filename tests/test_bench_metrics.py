"""Metric definitions on hand-made records, and the paired bootstrap speedup."""

from __future__ import annotations

import numpy as np
import pytest

from specdeploy.bench.metrics import (
    Pair,
    cell_metrics,
    compare,
    request_timing,
    speedup_interval,
    tau_histogram,
)
from specdeploy.bench.results import Chunk, RequestRecord

MS = 1_000_000


def record(
    chunks: list[tuple[float, int]], end_ms: float, start_ms: float = 0.0, **fields: object
) -> RequestRecord:
    return RequestRecord(
        cell="c",
        index=fields.pop("index", 0),
        prompt_id=fields.pop("prompt_id", "p"),
        route="generate",
        sent_unix=0.0,
        start_ns=int(start_ms * MS),
        chunks=[Chunk(t_ns=int(t * MS), tokens=n) for t, n in chunks],
        end_ns=int(end_ms * MS),
        completion_tokens=chunks[-1][1] if chunks else 0,
        **fields,
    )


def test_multi_token_chunks_spread_their_gap() -> None:
    # First chunk of 3 tokens at 100 ms, then 4 tokens at 140 ms and 2 tokens at 150 ms.
    timing = request_timing(record([(100, 3), (140, 7), (150, 9)], end_ms=151, spec_verify_ct=3))
    assert timing is not None
    assert timing.ttft_ms == pytest.approx(100)
    assert timing.itl_ms == pytest.approx([10, 10, 10, 10, 5, 5])
    assert timing.chunk_gaps_ms == pytest.approx([40, 10])
    assert timing.tokens_per_chunk == [3, 4, 2]
    assert timing.tpot_ms == pytest.approx(50 / 6)
    assert timing.tau == pytest.approx(3.0)
    assert timing.e2e_ms == pytest.approx(151)


def test_failed_or_empty_requests_have_no_timing() -> None:
    assert request_timing(record([(10, 1)], end_ms=11, error="connection: refused")) is None
    assert request_timing(record([], end_ms=11)) is None


def test_cell_metrics_rates_and_errors() -> None:
    records = [
        record([(100, 4), (200, 8)], end_ms=200, start_ms=0, index=0),
        record([(100, 4), (200, 8)], end_ms=200, start_ms=200, index=1, spec_verify_ct=4),
        record([], end_ms=50, start_ms=300, index=2, error="http: 400 bad"),
    ]
    m = cell_metrics(records)
    assert m.duration_s == pytest.approx(0.4)
    assert m.output_tokens == 16 and m.output_tok_s == pytest.approx(40)
    assert m.requests_per_s == pytest.approx(5)
    assert m.n_errors == 1 and m.errors == {"http": 1}
    assert m.ttft_ms.mean == pytest.approx(100) and m.ttft_ms.n == 2
    assert m.itl_ms.p50 == pytest.approx(25) and m.chunk_gap_ms.mean == pytest.approx(100)
    assert m.output_tok_s_per_user.mean == pytest.approx(40)
    assert m.tau.mean == pytest.approx(2.0) and m.tau_histogram == {"2.0": 1}


def test_tau_histogram_bins() -> None:
    assert tau_histogram([1.0, 1.4, 1.5, 3.99]) == {"1.0": 2, "1.5": 1, "3.5": 1}


def noisy_pairs(factor: float, repeats: int = 3, n: int = 40, seed: int = 1) -> list[Pair]:
    rng = np.random.default_rng(seed)
    pairs = []
    for r in range(repeats):
        for _ in range(n):
            tokens = int(rng.integers(50, 300))
            base = tokens * 0.02 * rng.lognormal(0, 0.1)
            pairs.append(Pair(r, tokens, base, tokens, base / factor * rng.lognormal(0, 0.1), True))
    return pairs


def test_identical_runs_give_speedup_around_one() -> None:
    pairs = [
        Pair(p.repeat, p.baseline_tokens, p.baseline_s, p.baseline_tokens, p.baseline_s, True)
        for p in noisy_pairs(1)
    ]
    interval = speedup_interval(pairs)
    assert interval.estimate == pytest.approx(1.0) and interval.low == pytest.approx(1.0)
    noisy = speedup_interval(noisy_pairs(1.0))
    assert noisy.low < 1.0 < noisy.high and noisy.high - noisy.low < 0.1


def test_twice_as_fast_gives_about_two() -> None:
    interval = speedup_interval(noisy_pairs(2.0), seed=3)
    assert interval.low < 2.0 < interval.high
    assert 1.9 < interval.estimate < 2.1 and interval.n_pairs == 120
    assert speedup_interval(noisy_pairs(2.0), seed=3) == interval  # seeded


def test_compare_pairs_by_prompt_and_reports_match_rate() -> None:
    def rec(pid: str, e2e: float, ids: list[int]) -> RequestRecord:
        return record([(e2e / 2, len(ids)), (e2e, 2 * len(ids))], end_ms=e2e, prompt_id=pid, output_ids=ids)

    baseline = [rec("a", 200, [1, 2]), rec("b", 200, [3, 4]), rec("only-baseline", 100, [1])]
    target = [rec("a", 100, [1, 2]), rec("b", 100, [3, 5])]
    comparison = compare({0: target}, {0: baseline}, "baseline/x", greedy=True)
    assert comparison.n_compared == 2
    assert comparison.speedup.estimate == pytest.approx(2.0)
    assert comparison.output_match_rate == pytest.approx(0.5)
    assert compare({0: target}, {0: baseline}, "b", greedy=False).output_match_rate is None
