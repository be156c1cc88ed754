"""Runs a script with the MLA combine's settings before a5fb9ab: tiles (32, 8, False), one query row of 16 heads.

python old_combine.py benchmarks/ddtree_side_by_side.py --engine-only --shape mla-moe-16b --modes ar,dflash ...
"""

import runpy
import sys

from specdeploy.engine import triton_mla

triton_mla.COMBINE_UP, triton_mla.COMBINE_UP_HEAD_ROWS = triton_mla.CombineUpTiles(32, 8, False), 16
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
