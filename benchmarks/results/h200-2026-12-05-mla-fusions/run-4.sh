#!/usr/bin/env bash
# Device call (about 8 minutes): the head's MLA and one-token kernels (projections as matrix-vector kernels, the
# combine with the value up-projection merging its splits in one pass, the swept one-token MoE tiles as the
# default): the GPU tests of the families they change, mla-moe-16b's engine steps at the head and in the tree
# before this session's MLA work (ab_before/, `git archive $BEFORE`), where the head's AR step spends device time,
# and on an H200 the kimi-like shape. Run from the repository root with OUT, COMMIT and BEFORE set;
# $OUT/results.tgz is packed after each step.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
cat "$R/machine.txt"
side() {  # $1 tree, $2 label, $3 shape, $4 modes, $5 time limit
  (cd "$1" && PYTHONPATH="/tmp/site:$PWD/src" timeout "$5" python3 benchmarks/ddtree_side_by_side.py --engine-only \
    --shape "$3" --modes "$4" --commit "$2" --out "$R/engine_$3_$2.json" > "$R/engine_$3_$2.log" 2>&1)
  echo "$2"; grep -E "^(mode|ar|dflash|ddtree)" "$R/engine_$3_$2.log" || grep "^engine" "$R/engine_$3_$2.log"; pack
}
timeout 140 python3 -m pytest -q -m gpu tests/test_decode_gpu.py tests/test_gpu_fastpath.py \
  -k "(fp32 and (kimi or deepseek)) or value_up or query_entry or mla_moe or one_token" \
  > "$R/gpu_tests_$COMMIT.log" 2>&1; tail -3 "$R/gpu_tests_$COMMIT.log"; pack
side . "$COMMIT" mla-moe-16b ar,dflash,ddtree-64 110
side ab_before "$BEFORE" mla-moe-16b ar,dflash,ddtree-64 110
timeout 60 python3 benchmarks/kernel_profile.py --shape mla-moe-16b --modes ar --steps 16 \
  --out "$R/profile_mla-moe-16b_$COMMIT.json" > "$R/profile_mla-moe-16b_$COMMIT.txt" 2>&1
grep -A12 -E "ms of kernels" "$R/profile_mla-moe-16b_$COMMIT.txt"; pack
if grep -q H200 "$R/machine.txt"; then side . "$COMMIT" kimi-like ar,dflash 70; fi
sed -i 's#/root/out/r/##g' "$R"/*.json "$R"/*.txt "$R"/*.log; pack
