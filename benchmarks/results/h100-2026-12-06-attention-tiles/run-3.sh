#!/usr/bin/env bash
# Device call (about 7 minutes): the masked-attention default tiles that call 1's sweep found against the tiles
# before (this tree with ab_before/ laid over it: the files of src that differ at $BEFORE, as
# `git diff --name-only $BEFORE $COMMIT -- src` lists them, in their $BEFORE version). The GPU attention tests, then
# engine steps of each tree in turn: mla-moe-16b AR and DDTree-64 (16 and 1040 query rows: tiles unchanged, controls) and
# DDTree-256 (4112 rows: 64-row tiles), the dense Qwen3-8B shape's AR and DFlash, Qwen3.6-27B's AR and DDTree-64 before (call 2 measured them at the head). Run from the
# repository root with OUT, COMMIT and BEFORE set; $OUT/results.tgz is packed after each step.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
cat "$R/machine.txt"
mkdir -p /tmp/before && cp -r src benchmarks /tmp/before/ && cp -r ab_before/. /tmp/before/
timeout 90 python3 -m pytest -q -m gpu tests/test_gpu_fastpath.py -k "attention" > "$R/gpu_tests_$COMMIT.log" 2>&1
tail -2 "$R/gpu_tests_$COMMIT.log"; pack
side() {  # $1 tree, $2 label, $3 shape, $4 modes, $5 time limit
  (cd "$1" && PYTHONPATH="/tmp/site:$PWD/src" timeout "$5" python3 benchmarks/ddtree_side_by_side.py --engine-only \
    --shape "$3" --modes "$4" --commit "$2" --out "$R/engine_$3_$2.json" > "$R/engine_$3_$2.log" 2>&1)
  echo "$3 $2"; grep -E "^(ar|dflash|ddtree)" "$R/engine_$3_$2.log" || tail -2 "$R/engine_$3_$2.log"; pack
}
side /tmp/before "$BEFORE" mla-moe-16b ar,ddtree-64,ddtree-256 100
side . "$COMMIT" mla-moe-16b ar,ddtree-64,ddtree-256 100
side /tmp/before "$BEFORE" qwen3-8b ar,dflash 60
side . "$COMMIT" qwen3-8b ar,dflash 60
side /tmp/before "$BEFORE" qwen3.6-27b ar,ddtree-64 90
sed -i 's#/root/out/r/##g' "$R"/*.json "$R"/*.log; pack
