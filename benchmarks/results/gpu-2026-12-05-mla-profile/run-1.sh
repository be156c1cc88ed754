#!/usr/bin/env bash
# Device call (about 5 minutes): where mla-moe-16b's decoding steps spend device time, kernel by kernel
# (prefill subtracted), the fp32 greedy-equality tests of the families the one-token MoE and the one-warp
# walk change, and the engine's steps with the defaults (on an H200 also the 27B and kimi-like shapes).
# Run from the repository root with OUT and COMMIT set; $OUT/results.tgz is packed after each step.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
cat "$R/machine.txt"
side() {  # $1 shape, $2 modes, $3 time limit
  timeout "$3" python3 benchmarks/ddtree_side_by_side.py --engine-only --shape "$1" --modes "$2" --commit "$COMMIT" \
    --out "$R/engine_$1_$COMMIT.json" > "$R/engine_$1_$COMMIT.log" 2>&1
  grep -E "^(mode|ar|dflash|ddtree)" "$R/engine_$1_$COMMIT.log"; pack
}
timeout 150 python3 benchmarks/kernel_profile.py --shape mla-moe-16b --modes ar,dflash,ddtree-256 --steps 16 \
  --out "$R/profile_mla-moe-16b_$COMMIT.json" > "$R/profile_mla-moe-16b_$COMMIT.txt" 2>&1
grep -E "ms of kernels" "$R/profile_mla-moe-16b_$COMMIT.txt"; pack
timeout 80 python3 -m pytest -q -m gpu tests/test_decode_gpu.py -k "fp32 and (kimi or deepseek or qwen3_next)" \
  > "$R/gpu_tests.log" 2>&1; tail -2 "$R/gpu_tests.log"; pack
side mla-moe-16b ar,dflash,ddtree-16,ddtree-64,ddtree-256 120
if grep -q H200 "$R/machine.txt"; then
  side qwen3.6-27b ar,ddtree-16,ddtree-64 120
  side kimi-like ar,dflash 70
fi
sed -i 's#/root/out/r/##g' "$R"/*.json "$R"/*.txt "$R"/*.log; pack
