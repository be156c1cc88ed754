"""A few rows' dense projections: the few-row kernel's tiles (`triton_gemv.linear_rows`) against cuBLAS, by rows and
weight size, to set `triton_gemv.ROWS_LINEAR` (which projections take the kernel) from measurements.

For each shape's projections, a chain of every layer's projections in turn (each layer its own weights) is
captured in a CUDA graph and replayed, as in a verify: us per projection for F.linear and for every tile of the
grid below at each row count, each output checked against F.linear's. The zoo's 256-wide pairs are bound by
launches; mla-moe-16b's and Qwen3-8B's weights by bytes: the rule's weight limit lies between. Prints, per shape and
row count, cuBLAS, the default tiles and the fastest; writes JSON as it goes.

    python benchmarks/rows_linear_sweep.py --shapes zoo,mid,mla-moe-16b --rows 16,17,65,128 --out rows.json
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

from specdeploy.engine.triton_gemv import ROWS_LINEAR, RowsLinear, linear_rows  # noqa: E402

# (out_features, in_features) of each layer's projections, and the layers chained
SHAPES = {
    # tiny-code's target: q|k|v, o_proj, gate|up, down, and the LM head (once a step, here once a layer)
    "zoo": ([(384, 256), (256, 256), (1536, 256), (256, 768), (2048, 256)], 8),
    "mid": ([(1024, 1024), (2048, 1024), (2048, 2048)], 16),  # 2, 4 and 8 MB
    "mla-moe-16b": ([(3648, 2048), (2048, 2048)], 27),
}
GRID = [
    RowsLinear(128, 1 << 40, n, k, w, s)
    for n, k, w, s in itertools.product((32, 64, 128), (64, 128), (4,), (2, 3))
    if not (n == 128 and k == 128 and s == 3)  # beyond the shared memory of 128-row tiles
]


def chain(weights: list[torch.Tensor], x: torch.Tensor, tiles: RowsLinear | None):
    """Every projection of the chain once, through the kernel at `tiles` or F.linear (None)."""

    def run() -> list[torch.Tensor]:
        if tiles is None:
            return [F.linear(x[..., : w.shape[1]], w) for w in weights]
        return [linear_rows(x[..., : w.shape[1]], w, None, tiles) for w in weights]

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shapes", default="zoo,mid,mla-moe-16b", help=f"comma-separated, of {', '.join(SHAPES)}"
    )
    parser.add_argument("--rows", default="16,17,65,128", help="comma-separated row counts")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    result = sweep_header(ROWS_LINEAR)
    bandwidth = result["copy_tb_per_s"] * 1e12
    for name in args.shapes.split(","):
        projections, layers = SHAPES[name]
        weights = layer_weights(projections, layers)
        per_call = 1e3 / len(weights)  # ms per chain -> us per projection
        nbytes = sum(w.numel() * w.element_size() for w in weights) / len(weights)
        result["shapes"][name] = {
            "projections": projections,
            "layers": layers,
            "weight_bytes": nbytes,
            "rows": {},
        }
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(1, rows, max(k for _, k in projections), device="cuda", dtype=torch.bfloat16)
            want = chain(weights, x, None)()
            cublas_us = graph_replay_ms(chain(weights, x, None)) * per_call
            timed = []
            for tiles in GRID:
                started = time.perf_counter()
                for a, b in zip(chain(weights, x, tiles)(), want, strict=True):
                    torch.testing.assert_close(a.float(), b.float(), atol=1e-2, rtol=2**-7)
                us = graph_replay_ms(chain(weights, x, tiles)) * per_call
                timed.append({"tiles": list(tiles[2:]), "us": us, "seconds": time.perf_counter() - started})
            result["shapes"][name]["rows"][rows] = {
                "cublas_us": cublas_us,
                "roofline_us": nbytes / bandwidth * 1e6,
                "tiles": timed,
            }
            args.out.write_text(json.dumps(result, indent=1))
            best = min(timed, key=lambda r: r["us"])
            default = next((r for r in timed if ROWS_LINEAR and r["tiles"] == list(ROWS_LINEAR[2:])), None)
            print(
                f"{name} ({nbytes / 1e6:.2f} MB a weight), {rows} rows: cuBLAS {cublas_us:.2f} us, default "
                f"{default['us'] if default else float('nan'):.2f}, fastest {best['us']:.2f} at {best['tiles']}",
                flush=True,
            )
        del weights
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
