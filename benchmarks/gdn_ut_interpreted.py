"""The Gated DeltaNet tree rule's UT form (`triton_gdn.TREE_UT`) against the walk and the CPU UT form, on a CPU.

    TRITON_INTERPRET=1 python benchmarks/gdn_ut_interpreted.py

Triton's interpreter runs both CUDA kernels on CPU tensors (float32): the walk, which runs the recurrence along each
token's path, and the UT form, over wide, chain and deep trees with correlated keys and decays near 1 (so that every
step of a long path weighs on its last token), key dims over two 32-column chunks and value columns over two blocks.
Prints each tree's deepest path and the largest absolute differences between the three. Speed needs a GPU
(`benchmarks/gdn_tree_rule_tiles.py`); tests/test_triton_interpreted.py asserts the same agreement.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("set TRITON_INTERPRET=1: the kernels run on the CPU through Triton's interpreter")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from specdeploy.engine import triton_gdn  # noqa: E402
from specdeploy.engine.models.gated_delta_rule import rule_inputs, tree_rule  # noqa: E402
from specdeploy.engine.tree import ancestor_matrix, root_paths  # noqa: E402

KEY_HEADS, HEADS, KEY_DIM, VALUE_DIM = 2, 4, 40, 40
TREES = [(6, 0.0), (17, 1.0), (65, 0.0), (65, 0.85)]  # tokens, chance a node extends the one before it


def main() -> None:
    torch.manual_seed(0)
    print("tokens  chain  deepest  UT-walk   walk-CPU UT  UT-CPU UT")
    for size, chain in TREES:
        rng = random.Random(size)
        parents = [
            [0] + [i - 1 if rng.random() < chain else rng.randrange(0, i) for i in range(1, size)]
            for _ in "ab"
        ]
        paths = root_paths(ancestor_matrix(torch.tensor(parents), size), size)  # two rows, two trees
        shape = (2, size, KEY_HEADS, KEY_DIM)
        q, k = torch.randn(shape), torch.randn(2, 1, KEY_HEADS, KEY_DIM) + 0.2 * torch.randn(shape)
        v = torch.randn(2, size, HEADS, VALUE_DIM)
        g, beta = -0.1 * torch.rand(2, size, HEADS), 1 - 0.2 * torch.rand(2, size, HEADS)
        initial = torch.randn(2, HEADS, KEY_DIM, VALUE_DIM)
        walked = triton_gdn.tree_rule(q, k, v, g, beta, paths, initial)
        oracle = tree_rule(rule_inputs(q, k, v, g, beta), paths, initial)
        triton_gdn.TREE_UT = (32, 4)
        ut = triton_gdn.tree_rule(q, k, v, g, beta, paths, initial)
        triton_gdn.TREE_UT = None
        deepest = int((paths >= 0).sum(-1).max())
        diffs = [(a - b).abs().max().item() for a, b in ((ut, walked), (walked, oracle), (ut, oracle))]
        print(f"{size:6d}  {chain:5.2f}  {deepest:7d}  " + "  ".join(f"{d:9.1e}" for d in diffs), flush=True)


if __name__ == "__main__":
    main()
