"""Run a benchmark script with the Gated DeltaNet tree rule changed on CUDA (an A/B of the whole model).

    python benchmarks/with_gdn_tree_rule.py 16x1 benchmarks/ddtree_side_by_side.py --engine-only --shape ...
    python benchmarks/with_gdn_tree_rule.py torch-ut benchmarks/ddtree_side_by_side.py --engine-only --shape ...

`CxW`: the Triton walk launched with C value columns per program and W warps (`triton_gdn.TREE_TILES`).
`torch-ut`: the torch UT form over the tree (`gated_delta_rule.tree_rule`, the CPU path: matrix products and a triangular solve) in
place of the walk.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gdn_tree_rule_tiles import ut_tree_rule  # noqa: E402

from specdeploy.engine import triton_gdn  # noqa: E402

if __name__ == "__main__":
    choice = sys.argv[1]
    if choice == "torch-ut":
        triton_gdn.tree_rule = ut_tree_rule
    else:
        triton_gdn.TREE_TILES = tuple(int(n) for n in choice.split("x"))
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
