"""Run a benchmark script with the Gated DeltaNet tree rule launched at other tiles (an A/B of a launch shape).

python benchmarks/with_gdn_tree_tiles.py 16x1 benchmarks/ddtree_side_by_side.py --engine-only --shape ...
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from specdeploy.engine import triton_gdn  # noqa: E402

if __name__ == "__main__":
    columns, warps = (int(n) for n in sys.argv[1].split("x"))
    triton_gdn.TREE_TILES = (columns, warps)
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
