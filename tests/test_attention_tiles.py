"""The masked-attention kernel's default tiles against the tile sweep recorded on a GPU (no GPU needed here)."""

from __future__ import annotations

import json
from pathlib import Path

from specdeploy.engine.triton_kernels import default_attention_tiles

SWEEP = (
    Path(__file__).resolve().parents[1]
    / "benchmarks/results/h100-2026-12-06-attention-tiles/call-1/attention_sweep_5bc890e.json"
)
# benchmarks/attention_tile_sweep.py's head shapes: query heads per key head, key width
HEADS = {"mla-16": (16, 576), "mla-64": (64, 576), "gqa-256": (6, 256), "gqa-128": (4, 128)}


def test_default_attention_tiles_are_within_a_quarter_of_the_fastest_the_sweep_measured() -> None:
    """For every head shape and query count of the recorded sweep (one H100: DFlash blocks and DDTree trees over
    768 slots), the default tiles took at most 1.25x the fastest tile's time, and the fastest from 4096 rows."""
    sweep = json.loads(SWEEP.read_text())
    checked = 0
    for name, by_tokens in sweep["heads"].items():
        group, width = HEADS[name]
        for tokens, entry in by_tokens.items():
            rows = group * int(tokens)
            times = {tuple(row["tiles"]): row["ms"] for row in entry["grid"] if "ms" in row}
            chosen = tuple(default_attention_tiles(rows, width))
            assert chosen in times, (name, tokens, chosen)
            fastest = min(times.values())
            assert times[chosen] <= 1.25 * fastest, (name, tokens, chosen, times[chosen], fastest)
            if rows >= 4096:
                assert times[chosen] == fastest, (name, tokens, chosen)
            checked += 1
    assert checked == 12
