#!/usr/bin/env bash
# Device call (about 8 minutes): one token's MoE step as matrix-vector kernels and its routing in one kernel
# (issue 20's mla-moe-16b AR bar). The GPU tests of both (against the torch paths; routing replayed from a CUDA
# graph; fp32 greedy equality of every mode with them on), the one-token sweep on mla-moe-16b, then
# mla-moe-16b's and kimi-like's AR, DFlash and DDTree-16 steps with the default kernels and with the sweep's
# fastest settings. Run from the repository root with OUT and COMMIT set; $OUT/results.tgz is packed after
# each step, so a call cut short returns what it measured.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
timeout 120 python3 -m pytest -q -m gpu tests/test_gpu_fastpath.py tests/test_decode_gpu.py \
  -k "one_token or routing_in_one_kernel or one_kernel_routing or fused_moe or mla_moe or (fp32 and (deepseek or moe))" \
  > "$R/gpu_tests.log" 2>&1; tail -3 "$R/gpu_tests.log"; pack
timeout 100 python3 benchmarks/moe_tile_sweep.py --one-token --shapes mla-moe-16b --out "$R/moe_one_token_sweep.json" \
  > "$R/moe_one_token_sweep.log" 2>&1; tail -2 "$R/moe_one_token_sweep.log"; pack
settings=$(grep -o "; settings [^ ]*" "$R/moe_one_token_sweep.log" | head -1 | cut -d' ' -f3)
echo "settings: ${settings:-none}"
side() {  # $1 shape, $2 modes, $3 settings (empty: the default kernels)
  local name="engine_$1_${3:-default}"
  name=${name//\//-}
  local run=(python3 benchmarks/ddtree_side_by_side.py)
  [ -n "$3" ] && run=(python3 benchmarks/with_moe_one_token.py "$3" benchmarks/ddtree_side_by_side.py)
  timeout 110 "${run[@]}" --engine-only --shape "$1" --modes "$2" --commit "$COMMIT" --out "$R/$name.json" \
    > "$R/$name.log" 2>&1; grep -E "^(ar|dflash|ddtree)" "$R/$name.log"; pack
}
side mla-moe-16b ar,dflash,ddtree-16 ""
[ -n "$settings" ] && side mla-moe-16b ar,dflash,ddtree-16 "$settings"
side kimi-like ar,dflash ""
[ -n "$settings" ] && side kimi-like ar,dflash "$settings"
ls -la "$R"
