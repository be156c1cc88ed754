"""Where MLA's value up-projection is cheapest: in the attention splits' combine or in a batched matmul after it.

For mla-moe-16b's 16 heads and Kimi's 64 (latent 512 + 64, values 128), each window and each count of query
rows, times `masked_attention(..., value_up=)` replayed from a CUDA graph with the rows through the combine at
every `triton_mla.CombineUpTiles` of the grid below, and through the combine and the matmul
(`COMBINE_UP_HEAD_ROWS = 0`), each output checked against the latter. Enough layers' caches and up-projections are
cycled that no call finds the last one's in L2. Prints, per case, the fastest setting against the combine and
matmul (the rows up to which the combine wins are read off them); writes JSON as it goes.

    python benchmarks/mla_combine_sweep.py --heads 16,64 --rows 1,2,4,8 --windows 640,4096 --out combine.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cuda_timing import graph_replay_ms  # noqa: E402

from specdeploy.engine import triton_mla  # noqa: E402
from specdeploy.engine.triton_kernels import masked_attention  # noqa: E402
from specdeploy.engine.triton_mla import CombineUpTiles  # noqa: E402

LATENT, ROPE, VALUE = 512, 64, 128
GRID = [CombineUpTiles(s, w, first) for s, w, first in itertools.product((8, 16, 32), (4, 8), (False, True))]
LAYER_BYTES = 96 << 20  # caches and up-projections cycled per call, at least this many bytes (L2 is 50 MB)


class Workload:
    """Query rows and per-layer caches and value up-projections of one head count; every row sees the whole
    window (the kernels' work is the same whatever the mask)."""

    def __init__(self, heads: int, rows: int, window: int, device: str = "cuda") -> None:
        bf16 = {"dtype": torch.bfloat16, "device": device}
        self.q = torch.randn(1, 1, heads, rows, LATENT + ROPE, **bf16)
        self.visible = torch.ones(1, rows, window, dtype=torch.bool, device=device)
        per_layer = window * (LATENT + ROPE) * 2 + heads * VALUE * LATENT * 2
        self.layers = [
            (torch.randn(1, window, 1, LATENT + ROPE, **bf16), torch.randn(heads, VALUE, LATENT, **bf16) / 23)
            for _ in range(max(2, LAYER_BYTES // per_layer))
        ]

    def run(self) -> torch.Tensor:
        for keys, value_up in self.layers:
            out = masked_attention(self.q, keys, keys[..., :LATENT], self.visible, 0.04, value_up=value_up)
        return out

    def ms(self) -> float:
        return graph_replay_ms(self.run) / len(self.layers)


def measure(workload: Workload, rows: int, tiles: CombineUpTiles | None) -> tuple[float, torch.Tensor]:
    """ms a layer and the last layer's output, with the rows through the combine at `tiles` (None: the matmul)."""
    kept = triton_mla.COMBINE_UP_HEAD_ROWS, triton_mla.COMBINE_UP
    triton_mla.COMBINE_UP_HEAD_ROWS = workload.q.shape[2] * rows if tiles else 0  # every (head, row) pair
    triton_mla.COMBINE_UP = tiles or kept[1]
    try:
        return workload.ms(), workload.run()
    finally:
        triton_mla.COMBINE_UP_HEAD_ROWS, triton_mla.COMBINE_UP = kept


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--heads", default="16,64")
    parser.add_argument("--rows", default="1,2,4,8")
    parser.add_argument("--windows", default="640,4096")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
    for heads, window, rows in itertools.product(
        *(map(int, values.split(",")) for values in (args.heads, args.windows, args.rows))
    ):
        workload = Workload(heads, rows, window)
        matmul_ms, want = measure(workload, rows, None)
        case = {"heads": heads, "window": window, "rows": rows, "matmul_ms": matmul_ms, "combine": []}
        for tiles in GRID:
            started = time.perf_counter()
            try:
                ms, got = measure(workload, rows, tiles)
                error = (got.float() - want.float()).abs().max().item()
                case["combine"].append({"tiles": list(tiles), "ms": ms, "max_abs_diff": error})
            except Exception as exc:  # a launch shape that does not fit is recorded, and the sweep goes on
                case["combine"].append({"tiles": list(tiles), "error": str(exc).splitlines()[0][:120]})
            case["combine"][-1]["seconds"] = time.perf_counter() - started
        timed = [c for c in case["combine"] if "ms" in c]
        best = min(timed, key=lambda c: c["ms"]) if timed else None
        case["best"] = best
        result["cases"].append(case)
        args.out.write_text(json.dumps(result, indent=1))
        del workload
        torch.cuda.empty_cache()
        print(
            f"heads {heads} window {window} rows {rows}: combine + matmul {matmul_ms * 1e3:.1f} us, "
            + (
                f"combine with the up-projection {best['ms'] * 1e3:.1f} us at {best['tiles']} "
                f"({matmul_ms / best['ms']:.2f}x; max |diff| {best['max_abs_diff']:.2g})"
                if best
                else "combine with the up-projection: no tile launched"
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
