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
            chosen = tuple(default_attention_tiles(rows, width, 2))  # the sweep ran in bfloat16
            assert chosen in times, (name, tokens, chosen)
            fastest = min(times.values())
            assert times[chosen] <= 1.25 * fastest, (name, tokens, chosen, times[chosen], fastest)
            if rows >= 4096:
                assert times[chosen] == fastest, (name, tokens, chosen)
            checked += 1
            # float32 keeps the tiles before the sweep: MLA's 64-row tiles need more shared memory than a GPU has
            assert default_attention_tiles(rows, width, 4) == before(rows, width), (name, tokens)
    assert checked == 12


def before(rows: int, width: int) -> tuple[int, int, int, int]:
    """The default tiles before the sweep (5bc890e)."""
    wide, broad = width > 256, width == 256
    block_m = 16 if rows <= 16 or wide else 32 if broad else 64
    return block_m, 32 if wide or broad else 64, 4, 2 if wide or broad else 3
