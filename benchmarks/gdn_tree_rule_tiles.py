"""The Gated DeltaNet tree rule's launch shape on a GPU, per model shape.

    python benchmarks/gdn_tree_rule_tiles.py --out tiles.json

For a best-first tree of each budget (random peaked draft marginals, as a trained drafter's), times
`triton_gdn.tree_rule` replayed from a CUDA graph: the walk for each (value columns, warps) (`TREE_TILES`) and the
torch UT form over the tree (`torch-ut`, the CPU path), each with its outputs' largest difference from the
default walk's (float32 sums in another order: about 1e-6 for the walk's tiles, more for the UT form's products). Shapes: the Qwen3.6-27B layer (16 key heads, 48 value heads,
dims 128) and tiny-hybrid's (4 and 4 heads, dims 64).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cuda_timing import graph_replay_ms  # noqa: E402

from specdeploy.engine import triton_gdn  # noqa: E402
from specdeploy.engine.models import gated_delta_rule  # noqa: E402
from specdeploy.engine.tree import best_first_tree, root_paths  # noqa: E402

SHAPES = {"qwen3.6-27b": (16, 48, 128, 128), "tiny-hybrid": (4, 4, 64, 64)}  # key heads, value heads, dims
TILES = [(32, 4), (32, 2), (32, 1), (16, 1), (16, 2), (16, 4), (8, 1), (8, 2), (64, 4), (64, 8)]
BLOCK = 16  # the drafter's block: depths 1..15 below the root


def ut_tree_rule(query, key, value, decay, beta, paths, initial) -> torch.Tensor:
    """`triton_gdn.tree_rule`'s signature over the torch UT form (`gated_delta_rule.tree_rule`, the CPU path)."""
    inputs = gated_delta_rule.rule_inputs(query, key, value, decay, beta)
    return gated_delta_rule.tree_rule(inputs, paths, initial)


def tree_paths(budget: int, generator: torch.Generator) -> torch.Tensor:
    """[1, budget + 1, BLOCK] root paths of a best-first tree over peaked random marginals."""
    logprobs = torch.log_softmax(4 * torch.randn(1, BLOCK - 1, 512, generator=generator), dim=-1).cuda()
    tree = best_first_tree(torch.zeros(1, dtype=torch.long, device="cuda"), logprobs, budget)
    return root_paths(tree.ancestors, BLOCK).contiguous()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--budgets", default="16,64,128")
    parser.add_argument("--tiles", help="CxW launch shapes to time, comma-separated (default: all of TILES)")
    parser.add_argument("--no-torch-ut", action="store_true", help="skip the torch UT form")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    tiles_timed = TILES
    if args.tiles:
        tiles_timed = [tuple(int(n) for n in tile.split("x")) for tile in args.tiles.split(",")]
    generator = torch.Generator().manual_seed(0)
    result: dict = {"device": torch.cuda.get_device_name(), "shapes": {}}
    for name, (key_heads, heads, key_dim, value_dim) in SHAPES.items():
        result["shapes"][name] = {}
        for budget in (int(b) for b in args.budgets.split(",")):
            paths = tree_paths(budget, generator)
            tokens = paths.shape[1]
            walked = int((paths >= 0).sum())  # state updates the programs make: the sum of path lengths
            q = torch.randn(1, tokens, key_heads, key_dim, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(1, tokens, key_heads, key_dim, device="cuda", dtype=torch.bfloat16)
            v = torch.randn(1, tokens, heads, value_dim, device="cuda", dtype=torch.bfloat16)
            decay = -torch.rand(1, tokens, heads, device="cuda")
            beta = torch.rand(1, tokens, heads, device="cuda")
            state = 0.1 * torch.randn(1, heads, key_dim, value_dim, device="cuda")
            inputs = (q, k, v, decay, beta, paths, state)
            default = triton_gdn.tree_rule(*inputs)
            rows = {}
            for tiles in tiles_timed:
                row = f"{tiles[0]}x{tiles[1]}"
                if tiles[0] > value_dim:
                    continue
                triton_gdn.TREE_TILES = tiles  # read at launch: the graph captures these tiles
                try:
                    out = triton_gdn.tree_rule(*inputs)
                    ms = graph_replay_ms(lambda a=inputs: triton_gdn.tree_rule(*a))
                except Exception as error:  # e.g. Triton's OutOfResources: the other shapes still run
                    rows[row] = {"error": str(error)[:300]}
                    print(f"{name} budget {budget}: {row} failed: {error}", flush=True)
                    continue
                finally:
                    triton_gdn.TREE_TILES = None
                diff = (out - default).abs().max().item()
                rows[row] = {"us": ms * 1e3, "max_abs_diff": diff}
                print(f"{name} budget {budget} ({tokens} tokens, {walked} updates): {row:>8}: {ms * 1e3:7.1f} us  "
                      f"diff {diff:.1e}", flush=True)  # fmt: skip
            if not args.no_torch_ut:
                try:  # the UT form in torch: tensor-core products and a triangular solve instead of the walk
                    out = ut_tree_rule(*inputs)
                    ms = graph_replay_ms(lambda a=inputs: ut_tree_rule(*a))
                    diff = (out - default).abs().max().item()
                    rows["torch-ut"] = {"us": ms * 1e3, "max_abs_diff": diff}
                    print(
                        f"{name} budget {budget}: torch UT form {ms * 1e3:7.1f} us  diff {diff:.1e}",
                        flush=True,
                    )
                except RuntimeError as error:  # e.g. an op that cannot be captured in a graph
                    rows["torch-ut"] = {"error": str(error)[:300]}
                    print(f"{name} budget {budget}: torch UT form failed: {error}", flush=True)
            result["shapes"][name][budget] = {"tokens": tokens, "state_updates": walked, "tiles": rows}
            args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
