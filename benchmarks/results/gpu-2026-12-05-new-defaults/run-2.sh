#!/usr/bin/env bash
# Device call (about 8 minutes, its time limits adding up to 470 s): the MLA combine's new settings (COMMIT:
# COMBINE_UP (8, 4, False) and COMBINE_UP_HEAD_ROWS 128, from call-1-h100's sweep) against the old ones
# ((32, 8, False), one row: 16 (head, row) pairs at mla-moe-16b's 16 heads) in the same tree, mla-moe-16b's AR and
# DFlash steps (its DFlash verifies 8 rows, which now take the combine); the new settings' DDTree-16 and -64 steps
# too; then what run-1.sh's limits cut short: the fp32 greedy-equality tests of the kimi, deepseek_v3 and qwen3_next
# families, and the batched GPU tests of hybrid rows. Run from the repository root with OUT and COMMIT set;
# $OUT/results.tgz is packed after each step.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
side() {  # $1 tag, $2 modes, $3 time limit, $4 python statements run first (the settings)
  timeout "$3" python3 -c "import runpy, sys
from specdeploy.engine import triton_mla
$4
sys.argv = ['benchmarks/ddtree_side_by_side.py', '--engine-only', '--shape', 'mla-moe-16b', '--modes', '$2',
            '--commit', '$COMMIT-$1', '--out', '$R/engine_mla-moe-16b_$1.json']
runpy.run_path(sys.argv[0], run_name='__main__')" > "$R/engine_mla-moe-16b_$1.log" 2>&1
  echo "$1"; grep -E "^(mode|ar|dflash|ddtree)" "$R/engine_mla-moe-16b_$1.log"; pack
}
side old-combine ar,dflash 80 "triton_mla.COMBINE_UP, triton_mla.COMBINE_UP_HEAD_ROWS = triton_mla.CombineUpTiles(32, 8, False), 16"
side new-combine ar,dflash,ddtree-16,ddtree-64 140 "pass"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_decode_gpu.py -k "fp32 and (kimi or deepseek or qwen3_next)" \
  > "$R/gpu_decode_tests.log" 2>&1; tail -2 "$R/gpu_decode_tests.log"; pack
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_batch_gpu.py -k "hybrid or qwen3_next" \
  > "$R/gpu_batch_tests.log" 2>&1; tail -2 "$R/gpu_batch_tests.log"; pack
sed -i 's#/root/out/r/##g' "$R"/*.json "$R"/*.log; pack
