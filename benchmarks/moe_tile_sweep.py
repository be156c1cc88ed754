"""Which tiles make the fused-MoE kernels fastest, per shape and tokens per step, on one CUDA GPU.

For each shape's expert widths (random bf16 weights, several layers' copies so that no call finds the last
one's experts in L2) and each token count, times `fused_moe` replayed from a CUDA graph with the default
tiling, then sweeps the gate|up kernel's tiles (down at the default), then the down kernel's (gate|up at its
best), then the plan's rows per block with those tiles, and prints each against the bytes the call had to read (the experts its tokens routed to, shared
experts, activations) at the copy bandwidth measured in the same run. Writes JSON as it goes.

    python benchmarks/moe_tile_sweep.py --shapes mla-moe-16b,kimi-like --tokens 1,17,65,257 --out sweep.json

`--block-rows 16,32` also sweeps both kernels' tiles at those rows per block (a tiling tuned at the default's rows
may not suit others) and prints each one's settings for `benchmarks/with_moe_one_token.py` (`mid:`).

`--one-token` sweeps one token's step instead: the matrix-vector kernels (`triton_moe.ONE_TOKEN`) at each tile
shape of gate|up (unless `--gate-up` fixes it) then of down, against the grouped-GEMM kernels (with their plan);
and the router as one kernel (`triton_moe.route`) at each experts-per-program against the float32 matrix product
and `sigmoid_top_k`, each checked against that path's result. It prints the settings to pass to
`benchmarks/with_moe_one_token.py`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cuda_timing import graph_replay_ms  # noqa: E402

from specdeploy.engine import triton_moe  # noqa: E402
from specdeploy.engine.triton_gemv import GemvTiles  # noqa: E402
from specdeploy.engine.triton_moe import (  # noqa: E402
    MoeTiling,
    Tiles,
    default_tiling,
    fused_moe,
    route,
    sigmoid_top_k,
)
from specdeploy.perf.roofline import copy_bandwidth  # noqa: E402
from specdeploy.perf.shapes import get_shape  # noqa: E402

# (block_n, block_k) at 4 warps and 3 stages
TILE_SHAPES = list(itertools.product((16, 32, 64, 128), (64, 128, 256)))
PIPELINES = ((2, 4), (4, 5), (8, 3), (8, 5))  # (warps, stages) then tried on the best tile shape
BLOCK_ROWS = (16, 32, 64)  # rows per block of the plan, tried last with the tuned tiles
WEIGHT_BYTES_PER_SET = 8 << 30  # copies of a layer's experts, up to this many bytes in all
# (block_n, block_k), 4 warps, 3 stages; a tile of at most 8192 values, whose float32 sums fit in registers
GEMV_SHAPES = [
    (n, k) for n, k in itertools.product((1, 2, 4, 8, 16, 32), (256, 512, 1024, 2048)) if n * k <= 8192
]
GEMV_PIPELINES = (
    (2, 3),
    (8, 3),
    (4, 1),
    (8, 1),
    (4, 2),
    (4, 4),
)  # (warps, stages) then tried on the best shape
ROUTE_BLOCKS = (1, 2, 4, 8, 16)  # experts per program of the one-kernel router
ROUTER_COPIES = 16  # router weights per timed call, so that L2 does not hold the one read


class Workload:
    """Layer copies of one shape's experts and per-call routings of `tokens` tokens."""

    def __init__(
        self, target: dict, tokens: int, copies: int, generator: torch.Generator, device: str = "cuda"
    ) -> None:
        hidden, inter = target["hidden_size"], target["moe_intermediate_size"]
        experts, self.top_k = target["n_routed_experts"], target["num_experts_per_tok"]
        shared_inter = inter * target.get("n_shared_experts", 1)
        bf16 = {"dtype": torch.bfloat16, "device": device}
        self.layers = [
            (
                torch.randn(experts, 2 * inter, hidden, **bf16).mul_(0.02),
                torch.randn(experts, hidden, inter, **bf16).mul_(0.02),
                torch.randn(2 * shared_inter, hidden, **bf16).mul_(0.02),
                torch.randn(hidden, shared_inter, **bf16).mul_(0.02),
            )
            for _ in range(copies)
        ]
        self.x = torch.randn(tokens, hidden, **bf16)
        logits = torch.rand(copies, tokens, experts, generator=generator)
        self.indices = logits.topk(self.top_k, dim=-1).indices.to(device)
        self.weights = torch.rand(copies, tokens, self.top_k, device=device)
        expert_bytes = 3 * hidden * inter * 2
        unions = [row.unique().numel() for row in self.indices]
        self.bytes = (
            sum(unions) / copies * expert_bytes + 3 * hidden * shared_inter * 2 + 2 * tokens * hidden * 2
        )
        self.union = sum(unions) / copies / experts

    def layer(self, i: int, tiling: MoeTiling | None = None) -> torch.Tensor:
        w13, w2, s13, s2 = self.layers[i]
        return fused_moe(self.x, w13, w2, self.weights[i], self.indices[i], s13, s2, tiling)

    def call(self, tiling: MoeTiling | None) -> None:
        for i in range(len(self.layers)):
            self.layer(i, tiling)


def graph_ms(workload: Workload, tiling: MoeTiling | None) -> float:
    """Milliseconds per fused_moe call, replayed from a CUDA graph of one call per layer copy."""
    return graph_replay_ms(lambda: workload.call(tiling)) / len(workload.layers)


def sweep(workload: Workload, which: str, fixed: MoeTiling) -> list[dict]:
    """Times of `which` kernel's tile shapes at 4 warps and 3 stages, then of the best one's pipelines."""
    rows: list[dict] = []

    def measure(tiles: Tiles) -> None:
        try:
            rows.append({"tiles": list(tiles), "ms": graph_ms(workload, fixed._replace(**{which: tiles}))})
        except Exception as error:  # a tile too large for shared memory does not compile: skip it
            rows.append({"tiles": list(tiles), "error": str(error).splitlines()[0][:120]})

    for n, k in TILE_SHAPES:
        measure(Tiles(n, k, 4, 3))
    shape = best(rows)
    for warps, stages in PIPELINES:
        measure(shape._replace(warps=warps, stages=stages))
    return rows


def best(rows: list[dict]) -> Tiles:
    return Tiles(*min((r for r in rows if "ms" in r), key=lambda r: r["ms"])["tiles"])


@contextmanager
def one_token(tiles: tuple[GemvTiles, GemvTiles] | None) -> Iterator[None]:
    """`triton_moe.ONE_TOKEN` set to `tiles` (None: one token takes the grouped kernels) for the block."""
    kept = triton_moe.ONE_TOKEN
    triton_moe.ONE_TOKEN = tiles
    try:
        yield
    finally:
        triton_moe.ONE_TOKEN = kept


def one_token_ms(workload: Workload, tiles: tuple[GemvTiles, GemvTiles] | None) -> float:
    with one_token(tiles):
        return graph_ms(workload, None)


def sweep_one_token(workload: Workload, gate_up: GemvTiles | None = None) -> dict:
    """One token's experts: the grouped-GEMM kernels (with their plan), the default matrix-vector tiles, then
    each gate|up tile (down at a middle shape) unless `gate_up` fixes it, then down's (gate|up at its best); each
    result checked against the grouped kernels'."""
    with one_token(None):
        want = workload.layer(0)
    default = triton_moe.ONE_TOKEN
    entry: dict = {
        "grouped_ms": one_token_ms(workload, None),
        "default": [list(t) for t in default] if default else None,
        "default_ms": one_token_ms(workload, default) if default else None,
        "gate_up": [],
        "down": [],
    }
    middle = GemvTiles(16, 256, 4, 3)

    def measure(which: str, tiles: tuple[GemvTiles, GemvTiles]) -> None:
        row: dict = {"tiles": [list(t) for t in tiles]}
        try:
            with one_token(tiles):
                got = workload.layer(0)
            row["max_abs_diff"] = (got.float() - want.float()).abs().max().item()
            row["ms"] = one_token_ms(workload, tiles)
        except Exception as error:  # a launch shape that does not compile or fit: recorded, the sweep goes on
            row["error"] = str(error).splitlines()[0][:120]
        entry[which].append(row)

    def best_of(which: str) -> GemvTiles:
        rows = [r for r in entry[which] if "ms" in r]
        return GemvTiles(*min(rows, key=lambda r: r["ms"])["tiles"][0 if which == "gate_up" else 1])

    if gate_up is None:
        for n, k in GEMV_SHAPES:
            measure("gate_up", (GemvTiles(n, k, 4, 3), middle))
        shape = best_of("gate_up")
        for warps, stages in GEMV_PIPELINES:
            measure("gate_up", (shape._replace(warps=warps, stages=stages), middle))
        gate_up = best_of("gate_up")
    for n, k in GEMV_SHAPES:
        measure("down", (gate_up, GemvTiles(n, k, 4, 3)))
    shape = best_of("down")
    for warps, stages in GEMV_PIPELINES:
        measure("down", (gate_up, shape._replace(warps=warps, stages=stages)))
    best = (gate_up, best_of("down"))
    entry["best"] = [list(t) for t in best]
    entry["best_ms"] = one_token_ms(workload, best)
    return entry


def sweep_router(target: dict, generator: torch.Generator) -> dict:
    """One token's routing: the float32 matrix product and `sigmoid_top_k` against `route` per experts per
    program, over ROUTER_COPIES router weights per call; each routing checked against the first path's."""
    experts, hidden, top_k = target["n_routed_experts"], target["hidden_size"], target["num_experts_per_tok"]
    routers = [torch.randn(experts, hidden, device="cuda", generator=None) / hidden**0.5
               for _ in range(ROUTER_COPIES)]  # fmt: skip
    bias = torch.rand(experts, generator=generator).mul_(0.1).cuda()
    x = torch.randn(1, hidden, dtype=torch.bfloat16, device="cuda")

    def torch_path() -> list:
        return [sigmoid_top_k(x.float() @ r.t(), bias, top_k, True, 2.5) for r in routers]

    def kernel(block_e: int) -> list:
        return [route(x, r, bias, top_k, True, 2.5, block_e) for r in routers]

    want = [indices.sort(dim=1).values for _, indices in torch_path()]
    entry: dict = {"torch_ms": graph_replay_ms(torch_path) / ROUTER_COPIES, "route": []}
    for block_e in ROUTE_BLOCKS:
        row: dict = {"block_e": block_e}
        try:
            got = [indices.sort(dim=1).values for _, indices in kernel(block_e)]
            row["same_experts"] = all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
            row["ms"] = graph_replay_ms(lambda b=block_e: kernel(b)) / ROUTER_COPIES
            # replayed from the graph: the done-counts went back to zero after every call
            row["counts_reset"] = not triton_moe.done_counts(x.device, 1).any()
        except Exception as error:
            row["error"] = str(error).splitlines()[0][:120]
        entry["route"].append(row)
    return entry


def main_one_token(shapes: list[str], out: Path, result: dict, gate_up: GemvTiles | None) -> None:
    generator = torch.Generator().manual_seed(0)
    for name in shapes:
        target = get_shape(name).target
        layer_bytes = (
            3 * target["n_routed_experts"] * target["hidden_size"] * target["moe_intermediate_size"] * 2
        )
        workload = Workload(target, 1, max(1, min(4, WEIGHT_BYTES_PER_SET // layer_bytes)), generator)
        roofline_ms = workload.bytes / result["copy_tb_per_s"] / 1e9
        entry = {"roofline_ms": roofline_ms, "experts": sweep_one_token(workload, gate_up)}
        del workload
        torch.cuda.empty_cache()
        entry["router"] = sweep_router(target, generator)
        result["shapes"][name] = entry
        out.write_text(json.dumps(result, indent=1))
        moe, router = entry["experts"], entry["router"]
        fastest = min(
            (r for r in router["route"] if r.get("same_experts")), key=lambda r: r["ms"], default=None
        )
        gate_up, down = ("x".join(str(v) for v in t) for t in moe["best"])
        print(
            f"{name} one token: roofline {roofline_ms:.4f} ms, grouped kernels {moe['grouped_ms']:.4f} ms "
            f"({roofline_ms / moe['grouped_ms']:.0%}), matrix-vector at the default tiles "
            + (f"{moe['default_ms']:.4f} ms, " if moe["default_ms"] else "none, ")
            + f"fastest {moe['best_ms']:.4f} ms "
            f"({roofline_ms / moe['best_ms']:.0%}) at {gate_up}/{down}; router: matrix product + top-k "
            f"{router['torch_ms'] * 1e3:.1f} us, one kernel "
            + (
                f"{fastest['ms'] * 1e3:.1f} us at {fastest['block_e']} experts a program"
                if fastest
                else "none"
            )
            + f"; settings {gate_up}/{down}"
            + (f",route{fastest['block_e']}" if fastest else ""),
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="mla-moe-16b,kimi-like")
    parser.add_argument("--tokens", default="1,17,65,257")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--one-token", action="store_true", help="sweep one token's kernels (see above)")
    parser.add_argument(
        "--block-rows", default="", help="also sweep the tiles at these rows per block (16,32)"
    )
    parser.add_argument(
        "--gate-up", default="", help="with --one-token: gate|up's tiles NxKxWxS, only down's swept"
    )
    args = parser.parse_args()
    bandwidth = copy_bandwidth(torch.device("cuda"))
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "copy_tb_per_s": bandwidth / 1e12,
        "tile_shapes": TILE_SHAPES,
        "pipelines": PIPELINES,
        "shapes": {},
    }
    print(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s", flush=True)
    if args.one_token:
        result.update(gemv_shapes=GEMV_SHAPES, gemv_pipelines=GEMV_PIPELINES, route_blocks=ROUTE_BLOCKS)
        gate_up = GemvTiles(*(int(n) for n in args.gate_up.split("x"))) if args.gate_up else None
        main_one_token(args.shapes.split(","), args.out, result, gate_up)
        return
    triton_moe.ONE_TOKEN = None  # this sweep times the grouped kernels, at one token too
    block_rows = [int(m) for m in args.block_rows.split(",") if m]
    generator = torch.Generator().manual_seed(0)
    for name in args.shapes.split(","):
        target = get_shape(name).target
        experts = target["n_routed_experts"]
        layer_bytes = 3 * experts * target["hidden_size"] * target["moe_intermediate_size"] * 2
        copies = max(1, min(4, WEIGHT_BYTES_PER_SET // layer_bytes))
        result["shapes"][name] = {"layer_copies": copies, "tokens": {}}
        for tokens in (int(t) for t in args.tokens.split(",")):
            started = time.perf_counter()
            workload = Workload(target, tokens, copies, generator)
            pairs = tokens * (workload.top_k + 1)
            default = default_tiling(pairs, experts + 1, target["hidden_size"])
            roofline_ms = workload.bytes / bandwidth * 1e3
            default_ms = graph_ms(workload, default)
            gate_rows = sweep(workload, "gate_up", default)
            gate_best = best(gate_rows)
            down_rows = sweep(workload, "down", default._replace(gate_up=gate_best))
            tuned = default._replace(gate_up=gate_best, down=best(down_rows))
            tuned_ms = graph_ms(workload, tuned)
            # rows per block with the tuned tiles: fewer pad the few tokens of each expert less, more read an
            # expert's weights fewer times when many tokens route to it
            by_block_m = {tuned.block_m: tuned_ms}
            for block_m in BLOCK_ROWS:
                if block_m not in by_block_m:
                    try:
                        by_block_m[block_m] = graph_ms(workload, tuned._replace(block_m=block_m))
                    except Exception as error:  # too large for shared memory: not a choice
                        by_block_m[block_m] = str(error).splitlines()[0][:120]
            # the tiles swept again at other rows per block (--block-rows), each tuned tiling's output against
            # the default's (the reduction order differs, so within bf16 rounding, not equal)
            want = workload.layer(0, default).float() if block_rows else None
            by_rows = {}
            for block_m in (m for m in block_rows if m != default.block_m):
                start = MoeTiling(block_m, default.gate_up, default.down)
                rows_gate = sweep(workload, "gate_up", start)
                rows_down = sweep(workload, "down", start._replace(gate_up=best(rows_gate)))
                at_rows = start._replace(gate_up=best(rows_gate), down=best(rows_down))
                by_rows[block_m] = {
                    "tuned": [list(at_rows.gate_up), list(at_rows.down)],
                    "tuned_ms": graph_ms(workload, at_rows),
                    "max_abs_diff_vs_default": (workload.layer(0, at_rows).float() - want).abs().max().item(),
                    "gate_up": rows_gate,
                    "down": rows_down,
                }
            entry = {
                "block_m": default.block_m,
                "expert_union": workload.union,
                "bytes": workload.bytes,
                "roofline_ms": roofline_ms,
                "default_ms": default_ms,
                "default_fraction": roofline_ms / default_ms,
                "tuned": [list(tuned.gate_up), list(tuned.down)],
                "tuned_ms": tuned_ms,
                "tuned_fraction": roofline_ms / tuned_ms,
                "tuned_ms_by_block_m": by_block_m,
                "default_max_abs": want.abs().max().item() if want is not None else None,
                "swept_at_block_m": by_rows,
                "gate_up": gate_rows,
                "down": down_rows,
                "seconds": time.perf_counter() - started,
            }
            result["shapes"][name]["tokens"][str(tokens)] = entry
            args.out.write_text(json.dumps(result, indent=1))
            print(
                f"{name} tokens={tokens}: union {workload.union:.1%}, roofline {roofline_ms:.3f} ms, "
                f"default {default_ms:.3f} ms ({roofline_ms / default_ms:.0%}), tuned {tuned_ms:.3f} ms "
                f"({roofline_ms / tuned_ms:.0%}) with gate_up {tuple(tuned.gate_up)} down {tuple(tuned.down)}; "
                "by rows per block "
                + ", ".join(
                    f"{m}: {v:.3f}" if isinstance(v, float) else f"{m}: {v}" for m, v in by_block_m.items()
                ),
                flush=True,
            )
            for block_m, swept in by_rows.items():
                gate_up, down = ("x".join(str(v) for v in t) for t in swept["tuned"])
                print(
                    f"  tiles swept at {block_m} rows per block: {swept['tuned_ms']:.3f} ms "
                    f"({roofline_ms / swept['tuned_ms']:.0%}), max |diff| against the default "
                    f"{swept['max_abs_diff_vs_default']:.2e}; settings mid:{block_m}x{gate_up}/{down}",
                    flush=True,
                )
            del workload
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
