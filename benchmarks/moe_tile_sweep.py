"""Which tiles make the fused-MoE kernels fastest, per shape and tokens per step, on one CUDA GPU.

For each shape's expert widths (random bf16 weights, several layers' copies so that no call finds the last
one's experts in L2) and each token count, times `fused_moe` replayed from a CUDA graph with the default
tiling, then sweeps the gate|up kernel's tiles (down at the default), then the down kernel's (gate|up at its
best), then the plan's rows per block with those tiles, and prints each against the bytes the call had to read (the experts its tokens routed to, shared
experts, activations) at the copy bandwidth measured in the same run. Writes JSON as it goes.

    python benchmarks/moe_tile_sweep.py --shapes mla-moe-16b,kimi-like --tokens 1,17,65,257 --out sweep.json
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

from specdeploy.engine.triton_moe import MoeTiling, Tiles, default_tiling, fused_moe  # noqa: E402
from specdeploy.perf.roofline import copy_bandwidth  # noqa: E402
from specdeploy.perf.shapes import get_shape  # noqa: E402

# (block_n, block_k) at 4 warps and 3 stages
TILE_SHAPES = list(itertools.product((16, 32, 64, 128), (64, 128, 256)))
PIPELINES = ((2, 4), (4, 5), (8, 3), (8, 5))  # (warps, stages) then tried on the best tile shape
BLOCK_ROWS = (16, 32, 64)  # rows per block of the plan, tried last with the tuned tiles
WEIGHT_BYTES_PER_SET = 8 << 30  # copies of a layer's experts, up to this many bytes in all


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

    def call(self, tiling: MoeTiling | None) -> None:
        for i, (w13, w2, s13, s2) in enumerate(self.layers):
            fused_moe(self.x, w13, w2, self.weights[i], self.indices[i], s13, s2, tiling)


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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="mla-moe-16b,kimi-like")
    parser.add_argument("--tokens", default="1,17,65,257")
    parser.add_argument("--out", type=Path, required=True)
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
            del workload
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
