#!/usr/bin/env bash
# Device call (about 8.5 minutes): the pipelined Gated DeltaNet walk (de5b4fd) and the one-row fusions (910ac42)
# against $BEFORE (this tree with ab_before/, $BEFORE's src, laid over it). GPU tests of the changed kernels and of
# greedy decoding in every family; Qwen3.6-27B's AR and DDTree-64 steps (issue 19) and mla-moe-16b's AR step
# (issue 20), each tree in a process of its own; the tree rule alone by launch shape (`gdn_tree_rule_tiles.py`).
# Run from the repository root with OUT, COMMIT and BEFORE set; $OUT/results.tgz is packed after each step.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
cat "$R/machine.txt"
mkdir -p /tmp/before && cp -r src benchmarks /tmp/before/ && cp -r ab_before/. /tmp/before/
timeout 130 python3 -m pytest -q -m gpu tests/test_decode_gpu.py tests/test_batch_gpu.py tests/test_gpu_fastpath.py \
  -k "fp32 or bf16 or hybrid_rows or norm_linear_row or swiglu_down_row or moe" > "$R/gpu_tests.log" 2>&1
tail -3 "$R/gpu_tests.log"; pack
side() {  # $1 tree, $2 label, $3 shape, $4 modes, $5 time limit
  (cd "$1" && PYTHONPATH="/tmp/site:$PWD/src" timeout "$5" python3 benchmarks/ddtree_side_by_side.py --engine-only \
    --shape "$3" --modes "$4" --commit "$2" --out "$R/engine_$3_$2.json" > "$R/engine_$3_$2.log" 2>&1)
  echo "$3 $2:"; grep -E "^engine |^(ar|dflash|ddtree)" "$R/engine_$3_$2.log" || tail -2 "$R/engine_$3_$2.log"; pack
}
side . "$COMMIT" qwen3.6-27b ar,ddtree-64 80
side /tmp/before "$BEFORE" qwen3.6-27b ar,ddtree-64 80
side . "$COMMIT" mla-moe-16b ar 75
side /tmp/before "$BEFORE" mla-moe-16b ar 75
tiles() {  # $1 tree, $2 label, $3 launch shapes
  (cd "$1" && PYTHONPATH="/tmp/site:$PWD/src" timeout 40 python3 benchmarks/gdn_tree_rule_tiles.py --budgets 16,64 \
    --tiles "$3" --no-torch-ut --out "$R/tiles_$2.json" > "$R/tiles_$2.log" 2>&1)
  echo "tiles $2:"; cat "$R/tiles_$2.log"; pack
}
tiles . "$COMMIT" 16x1,32x1,32x2,64x2
tiles /tmp/before "$BEFORE" 16x1,32x1
sed -i "s#/root/out/r/##g; s#$PWD/##g" "$R"/*.json "$R"/*.log; pack
