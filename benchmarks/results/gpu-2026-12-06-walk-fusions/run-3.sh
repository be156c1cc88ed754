#!/usr/bin/env bash
# Device call (about 8 minutes): the Kimi shape the card holds in every mode (the stage of gpu_kimi_roofline.py
# that failed in call 2 on negative drafter context layers); the leaves-only Gated DeltaNet tree walk against
# $BEFORE (this tree with ab_before/, $BEFORE's src, laid over it): Qwen3.6-27B's AR and DDTree-64 steps (issue 19)
# and the tree rule alone (`gdn_tree_rule_tiles.py`, against the torch UT form too); then the GPU tests of the changed
# kernels and of greedy decoding in every family. Run from the repository root with OUT, COMMIT and BEFORE set;
# $OUT/results.tgz is packed after each step.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
cat "$R/machine.txt"
mkdir -p /tmp/before && cp -r src benchmarks /tmp/before/ && cp -r ab_before/. /tmp/before/
side() {  # $1 tree, $2 label, $3 shape, $4 modes, $5 time limit
  (cd "$1" && PYTHONPATH="/tmp/site:$PWD/src" timeout "$5" python3 benchmarks/ddtree_side_by_side.py --engine-only \
    --shape "$3" --modes "$4" --commit "$2" --out "$R/engine_$3_$2.json" > "$R/engine_$3_$2.log" 2>&1)
  echo "$3 $2:"; grep -E "^engine |^(ar|dflash|ddtree)" "$R/engine_$3_$2.log" || tail -3 "$R/engine_$3_$2.log"; pack
}
shape=$(python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from gpu_kimi_roofline import kimi_shape; print(kimi_shape())")
side . "$COMMIT" "$shape" ar,dflash,ddtree-16,ddtree-64,ddtree-256 150
tiles() {  # $1 tree, $2 label, $3 launch shapes, $4 more options
  (cd "$1" && PYTHONPATH="/tmp/site:$PWD/src" timeout 35 python3 benchmarks/gdn_tree_rule_tiles.py --budgets 16,64,128 \
    --tiles "$3" $4 --out "$R/tiles_$2.json" > "$R/tiles_$2.log" 2>&1)
  echo "tiles $2:"; cat "$R/tiles_$2.log"; pack
}
tiles . "$COMMIT" 16x1,32x1,32x2 ""
tiles /tmp/before "$BEFORE" 32x1 --no-torch-ut
side . "$COMMIT" qwen3.6-27b ar,ddtree-64 70
side /tmp/before "$BEFORE" qwen3.6-27b ar,ddtree-64 70
timeout 110 python3 -m pytest -q -m gpu --durations=12 tests/test_decode_gpu.py tests/test_batch_gpu.py \
  tests/test_gpu_fastpath.py -k "(fp32 and (qwen3_next or kimi)) or hybrid_rows or norm_linear_row or swiglu_down_row" \
  > "$R/gpu_tests.log" 2>&1
tail -18 "$R/gpu_tests.log"; pack
sed -i "s#/root/out/r/##g; s#$PWD/##g" "$R"/*.json "$R"/*.log; pack
