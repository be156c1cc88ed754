#!/usr/bin/env bash
# Device call (about 9 minutes): MLA with the absorbed query's matmul in the query/entry kernel and the value
# up-projection in the splits' combine, against the tree before them (ab_before/, `git archive $BEFORE`):
# the MLA GPU tests, mla-moe-16b's engine steps after and before, where its steps spend device time, and on an
# H200 the kimi-like shape. Run from the repository root with OUT, COMMIT and BEFORE set; $OUT/results.tgz is
# packed after each step.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
cat "$R/machine.txt"
side() {  # $1 tree, $2 commit, $3 shape, $4 modes, $5 time limit
  (cd "$1" && PYTHONPATH="/tmp/site:$PWD/src" timeout "$5" python3 benchmarks/ddtree_side_by_side.py --engine-only \
    --shape "$3" --modes "$4" --commit "$2" --out "$R/engine_$3_$2.json" > "$R/engine_$3_$2.log" 2>&1)
  grep -E "^(mode|ar|dflash|ddtree)" "$R/engine_$3_$2.log"; pack
}
timeout 110 python3 -m pytest -q -m gpu tests/test_gpu_fastpath.py tests/test_decode_gpu.py \
  -k "mla or value_up or deepseek or kimi" > "$R/gpu_tests_$COMMIT.log" 2>&1; tail -3 "$R/gpu_tests_$COMMIT.log"; pack
side . "$COMMIT" mla-moe-16b ar,dflash,ddtree-64,ddtree-256 130
side ab_before "$BEFORE" mla-moe-16b ar,dflash,ddtree-64,ddtree-256 130
timeout 100 python3 benchmarks/kernel_profile.py --shape mla-moe-16b --modes ar,ddtree-64 --steps 16 \
  --out "$R/profile_mla-moe-16b_$COMMIT.json" > "$R/profile_mla-moe-16b_$COMMIT.txt" 2>&1
grep -E "ms of kernels" "$R/profile_mla-moe-16b_$COMMIT.txt"; pack
if grep -q H200 "$R/machine.txt"; then side . "$COMMIT" kimi-like ar,dflash,ddtree-64 90; fi
sed -i 's#/root/out/r/##g' "$R"/*.json "$R"/*.txt "$R"/*.log; pack
