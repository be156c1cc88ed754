"""Run a benchmark script with one token's MoE kernels changed on CUDA (an A/B of the whole model).

    python benchmarks/with_moe_one_token.py grouped,route1:0 benchmarks/ddtree_side_by_side.py ...
    python benchmarks/with_moe_one_token.py 16x256x4x3/8x256x4x3,route4 benchmarks/ddtree_side_by_side.py ...

Comma-separated settings, as `benchmarks/moe_tile_sweep.py --one-token` prints them: `NxKxWxS/NxKxWxS` runs one
token's experts as the matrix-vector kernels with those gate|up and down tiles (`triton_moe.ONE_TOKEN`: columns
per program, reduction tile, warps, stages), `grouped` as the grouped-GEMM kernels; `routeE` routes in one kernel
with E experts a program (`triton_moe.ROUTE_BLOCK_E`), `routeE:T` up to T tokens (`triton_moe.ROUTE_TOKENS`; 0:
the matrix product and `sigmoid_top_k` always); `linearNxKxWxS` runs one row's dense projections (`ops.linear`)
through the matrix-vector kernel with those tiles (`triton_gemv.ONE_ROW_LINEAR`), `cublas` through F.linear;
`rows:RxBxNxKxWxS` runs projections of up to R rows (more than one) of weights up to B bytes through the few-row
kernel with those tiles (`triton_gemv.ROWS_LINEAR`), `rows:cublas` every projection of more rows through F.linear;
`mid:MxNxKxWxS/NxKxWxS` runs steps of more than 16 and up to 32 (token, expert) pairs per expert through the grouped
kernels with M rows per block and those gate|up and down tiles (in place of `triton_moe.default_tiling`'s 64 rows).
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from specdeploy.engine import triton_gemv, triton_moe  # noqa: E402

# above the 16-row blocks' range, up to mla-moe-16b's 257-token tree verify (28 pairs per expert)
MID_PAIRS_PER_EXPERT = (16, 32)


def with_mid_tiling(tiling: triton_moe.MoeTiling) -> Callable[[int, int, int], triton_moe.MoeTiling]:
    """`triton_moe.default_tiling`, but `tiling` for steps of 16 (excluded) to 32 pairs per expert on average."""
    default = triton_moe.default_tiling

    def chosen(pairs: int, total_experts: int, hidden: int) -> triton_moe.MoeTiling:
        low, high = MID_PAIRS_PER_EXPERT
        if low * total_experts < pairs <= high * total_experts:
            return tiling
        return default(pairs, total_experts, hidden)

    return chosen


def apply(settings: str) -> None:
    for part in settings.split(","):
        if part == "grouped":
            triton_moe.ONE_TOKEN = None
        elif part == "cublas":
            triton_gemv.ONE_ROW_LINEAR = None
        elif part == "rows:cublas":
            triton_gemv.ROWS_LINEAR = None
        elif part.startswith("rows:"):
            triton_gemv.ROWS_LINEAR = triton_gemv.RowsLinear(
                *(int(n) for n in part.removeprefix("rows:").split("x"))
            )
        elif part.startswith("linear"):
            triton_gemv.ONE_ROW_LINEAR = triton_gemv.GemvTiles(
                *(int(n) for n in part.removeprefix("linear").split("x"))
            )
        elif part.startswith("mid:"):
            rows, tiles = part.removeprefix("mid:").split("x", 1)
            gate_up, down = (triton_moe.Tiles(*(int(n) for n in t.split("x"))) for t in tiles.split("/"))
            triton_moe.default_tiling = with_mid_tiling(triton_moe.MoeTiling(int(rows), gate_up, down))
        elif part.startswith("route"):
            block_e, _, tokens = part.removeprefix("route").partition(":")
            triton_moe.ROUTE_BLOCK_E = int(block_e)
            triton_moe.ROUTE_TOKENS = int(tokens or triton_moe.ROUTE_TOKENS)
        else:
            gate_up, down = (triton_gemv.GemvTiles(*(int(n) for n in t.split("x"))) for t in part.split("/"))
            triton_moe.ONE_TOKEN = (gate_up, down)


if __name__ == "__main__":
    apply(sys.argv[1])
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
