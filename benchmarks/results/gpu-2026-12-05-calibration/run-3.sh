#!/usr/bin/env bash
# One device call: the dense Qwen3-8B shape's steps at c02f860 (the committed figures issue 19's no-regression check
# compares with, an H200's) and at the working tree, in turn on this machine (`ddtree_side_by_side.py --engine-only`);
# then issue 21's Qwen3-8B campaign (random weights, AR against auto) through ../gpu-2026-12-05-auto-head/run.sh.
# c02f860's tree is exported beforehand: `git archive c02f860 src benchmarks/ddtree_side_by_side.py | tar -x -C
# runs/base-c02f860` (its zoo weights removed: the random shape needs none). Run from the repository root, OUT set.
set -u
: "${OUT:?set OUT}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt"
python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])" >> "$OUT/machine.txt"
modes=ar,dflash,ddtree-16,ddtree-64
timeout 120 python3 runs/base-c02f860/benchmarks/ddtree_side_by_side.py --engine-only --shape qwen3-8b --modes $modes \
    --commit c02f860 --out "$OUT/engine_qwen3-8b_c02f860.json" > "$OUT/engine_qwen3-8b_c02f860.log" 2>&1
echo "rc $?" >> "$OUT/engine_qwen3-8b_c02f860.log"
timeout 120 python3 benchmarks/ddtree_side_by_side.py --engine-only --shape qwen3-8b --modes $modes \
    --commit "${COMMIT:-unknown}" --out "$OUT/engine_qwen3-8b_head.json" > "$OUT/engine_qwen3-8b_head.log" 2>&1
echo "rc $?" >> "$OUT/engine_qwen3-8b_head.log"
# QWEN=0 leaves the campaign out (a call with little device time left)
[ "${QWEN:-1}" = 1 ] && OUT=$OUT PART=qwen3-8b LIMIT=${LIMIT:-250} bash benchmarks/results/gpu-2026-12-05-auto-head/run.sh
