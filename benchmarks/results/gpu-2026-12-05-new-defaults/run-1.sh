#!/usr/bin/env bash
# Device call (about 8 minutes): the new defaults measured in the engine. The Gated DeltaNet walk at one warp
# (issue 19's Qwen3.6-27B shape: AR, DDTree-16 and DDTree-64 steps), one token's MoE as matrix-vector kernels
# and routing in one kernel (issue 20: mla-moe-16b's AR, DFlash, DDTree-16 and DDTree-64 steps; kimi-like's AR
# and DFlash where it fits), then the fp32 greedy-equality tests of the families they change. Run from the
# repository root with OUT and COMMIT set; $OUT/results.tgz is packed after each step.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
side() {  # $1 shape, $2 modes, $3 time limit
  timeout "$3" python3 benchmarks/ddtree_side_by_side.py --engine-only --shape "$1" --modes "$2" --commit "$COMMIT" \
    --out "$R/engine_$1_$COMMIT.json" > "$R/engine_$1_$COMMIT.log" 2>&1
  grep -E "^(mode|ar|dflash|ddtree)" "$R/engine_$1_$COMMIT.log"; pack
}
side qwen3.6-27b ar,ddtree-16,ddtree-64 120
side mla-moe-16b ar,dflash,ddtree-16,ddtree-64 90
timeout 60 python3 -m pytest -q -m gpu tests/test_decode_gpu.py -k "fp32 and (kimi or deepseek or qwen3_next)" \
  > "$R/gpu_tests.log" 2>&1; tail -2 "$R/gpu_tests.log"; pack
side kimi-like ar,dflash 70
timeout 150 python3 benchmarks/mla_combine_sweep.py --out "$R/mla_combine_sweep.json" > "$R/mla_combine_sweep.log" 2>&1
tail -16 "$R/mla_combine_sweep.log"; pack
timeout 60 python3 benchmarks/dead_step_moe.py --device cuda --out "$R/dead_step_moe.json" > "$R/dead_step_moe.log" 2>&1
tail -9 "$R/dead_step_moe.log"; pack
sed -i 's#/root/out/r/##g' "$R"/*.json "$R"/*.log; pack
