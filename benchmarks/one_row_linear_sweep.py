"""One row's dense projections: the matrix-vector kernel's tiles (`triton_gemv.linear_one_row`) against cuBLAS.

For each shape's projections (mla-moe-16b: q|kv_a 2048 -> 3648 and o_proj 2048 -> 2048; Kimi: q_a|kv_a
7168 -> 2112, q_b 1536 -> 12288 and o_proj 8192 -> 7168), a chain of every layer's projections in turn (each layer
its own weights, so that none is found in L2) is captured in a CUDA graph and replayed: us per projection for
F.linear and for every tile of the grid below, each output checked against F.linear's. Kernels follow each other
as in a step, so a kernel's weight loads before its wait overlap the kernel before it (programmatic dependent
launch, on from sm_90). Prints each shape's fastest tiles and cuBLAS; writes JSON as it goes.

    python benchmarks/one_row_linear_sweep.py --shapes mla-moe-16b,kimi --out linear.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cuda_timing import graph_replay_ms, layer_weights, sweep_header  # noqa: E402

from specdeploy.engine.triton_gemv import ONE_ROW_LINEAR, GemvTiles, linear_one_row  # noqa: E402

# (out_features, in_features) of each layer's one-row projections, and the layers chained (mla-moe-16b's 27;
# Kimi's fewer, its weights being larger)
SHAPES = {
    "mla-moe-16b": ([(3648, 2048), (2048, 2048)], 27),
    "kimi": ([(2112, 7168), (12288, 1536), (7168, 8192)], 8),
}
GRID = [
    GemvTiles(n, k, w, s)
    for n, k, w, s in itertools.product((2, 4, 8, 16), (512, 1024, 2048), (4, 8), (1, 2))
    if n * k <= 2048 * w  # 64 float32 sums a thread at most: larger tiles spill registers
]


def chain(weights: list[torch.Tensor], x: torch.Tensor, tiles: GemvTiles | None):
    """Every projection of the chain once, through the kernel at `tiles` or F.linear (None)."""

    def run() -> list[torch.Tensor]:
        if tiles is None:
            return [F.linear(x[..., : w.shape[1]], w) for w in weights]
        return [linear_one_row(x[..., : w.shape[1]].contiguous(), w, None, tiles) for w in weights]

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shapes", default="mla-moe-16b,kimi", help=f"comma-separated, of {', '.join(SHAPES)}"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    result = sweep_header(ONE_ROW_LINEAR)
    bandwidth = result["copy_tb_per_s"] * 1e12
    for name in args.shapes.split(","):
        projections, layers = SHAPES[name]
        weights = layer_weights(projections, layers)
        x = torch.randn(1, 1, max(k for _, k in projections), device="cuda", dtype=torch.bfloat16)
        per_call = 1e3 / len(weights)  # ms per chain -> us per projection
        nbytes = sum(w.numel() * w.element_size() for w in weights) / len(weights)
        want = chain(weights, x, None)()
        rows = []
        cublas_us = graph_replay_ms(chain(weights, x, None)) * per_call
        for tiles in GRID:
            started = time.perf_counter()
            got = chain(weights, x, tiles)()
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a.float(), b.float(), atol=1e-2, rtol=2**-7)
            us = graph_replay_ms(chain(weights, x, tiles)) * per_call
            rows.append({"tiles": list(tiles), "us": us, "seconds": time.perf_counter() - started})
            result["shapes"][name] = {
                "projections": projections,
                "layers": layers,
                "roofline_us": nbytes / bandwidth * 1e6,
                "cublas_us": cublas_us,
                "tiles": rows,
            }
            args.out.write_text(json.dumps(result, indent=1))
        best = min(rows, key=lambda r: r["us"])
        default = next((r for r in rows if r["tiles"] == list(ONE_ROW_LINEAR or ())), None)
        print(
            f"{name}: roofline {nbytes / bandwidth * 1e6:.2f} us a projection, cuBLAS {cublas_us:.2f}, "
            f"default {default['us'] if default else float('nan'):.2f}, fastest {best['us']:.2f} at {best['tiles']}"
        )
        for row in sorted(rows, key=lambda r: r["us"])[:5]:
            print(f"    {row['tiles']}  {row['us']:.2f} us")
        del weights
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
