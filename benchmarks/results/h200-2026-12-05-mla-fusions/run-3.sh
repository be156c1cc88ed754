#!/usr/bin/env bash
# Device call (about 9 minutes): the MLA GPU tests; one token's MoE tiles swept on mla-moe-16b with reduction
# tiles up to 2048; mla-moe-16b's engine steps at the head, with the sweep's fastest tiles, and in the tree
# before the MLA fusions (ab_before/, `git archive $BEFORE`); where the head's AR step spends device time. Run
# from the repository root with OUT, COMMIT and BEFORE set; $OUT/results.tgz is packed after each step.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
cat "$R/machine.txt"
side() {  # $1 tree, $2 label, $3 shape, $4 modes, $5 time limit, then a wrapper's arguments if any
  local tree=$1 label=$2 shape=$3 modes=$4 limit=$5; shift 5
  (cd "$tree" && PYTHONPATH="/tmp/site:$PWD/src" timeout "$limit" python3 "$@" benchmarks/ddtree_side_by_side.py \
    --engine-only --shape "$shape" --modes "$modes" --commit "$label" --out "$R/engine_${shape}_$label.json" \
    > "$R/engine_${shape}_$label.log" 2>&1)
  echo "$label"; grep -E "^(mode|ar|dflash|ddtree)" "$R/engine_${shape}_$label.log"; pack
}
timeout 100 python3 -m pytest -q -m gpu tests/test_gpu_fastpath.py tests/test_decode_gpu.py \
  -k "mla or value_up or deepseek or kimi" > "$R/gpu_tests_$COMMIT.log" 2>&1; tail -3 "$R/gpu_tests_$COMMIT.log"; pack
timeout 150 python3 benchmarks/moe_tile_sweep.py --one-token --shapes mla-moe-16b --out "$R/moe_one_token_sweep.json" \
  > "$R/moe_one_token_sweep.log" 2>&1; tail -1 "$R/moe_one_token_sweep.log"; pack
settings=$(grep -o "; settings [^ ]*" "$R/moe_one_token_sweep.log" | head -1 | cut -d' ' -f3)
side . "$COMMIT" mla-moe-16b ar,dflash,ddtree-64,ddtree-256 130
if [ -n "$settings" ]; then side . "$COMMIT-tiles" mla-moe-16b ar,dflash 60 benchmarks/with_moe_one_token.py "$settings"; fi
side ab_before "$BEFORE" mla-moe-16b ar,dflash 60
timeout 60 python3 benchmarks/kernel_profile.py --shape mla-moe-16b --modes ar --steps 16 \
  --out "$R/profile_mla-moe-16b_$COMMIT.json" > "$R/profile_mla-moe-16b_$COMMIT.txt" 2>&1
grep -A14 -E "ms of kernels" "$R/profile_mla-moe-16b_$COMMIT.txt"; pack
sed -i 's#/root/out/r/##g' "$R"/*.json "$R"/*.txt "$R"/*.log; pack
