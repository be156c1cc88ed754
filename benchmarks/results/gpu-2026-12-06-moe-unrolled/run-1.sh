#!/usr/bin/env bash
# Device call (about 9 minutes): one token's MoE matrix-vector kernels and the one-kernel router with their
# reduction tiles and expert pairs unrolled, so that a program has all its loads in flight at once, against the
# tree before (this tree with ab_before/ laid over it: the files of src that differ at $BEFORE, as
# `git diff --name-only $BEFORE $COMMIT -- src` lists them, in their $BEFORE version): the one-token sweep at the head on mla-moe-16b, the GPU tests
# of the MoE kernels and of the deepseek family, then mla-moe-16b's AR, DFlash and DDTree-64 steps of both trees
# in turn. Run from the repository root with OUT, COMMIT and BEFORE set; $OUT/results.tgz is packed after each step,
# so a call cut short returns what it measured.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
cat "$R/machine.txt"
timeout 110 python3 benchmarks/moe_tile_sweep.py --one-token --shapes mla-moe-16b --out "$R/moe_one_token_sweep_$COMMIT.json" \
  > "$R/moe_one_token_sweep_$COMMIT.log" 2>&1; tail -2 "$R/moe_one_token_sweep_$COMMIT.log"; pack
timeout 120 python3 -m pytest -q -m gpu tests/test_gpu_fastpath.py tests/test_decode_gpu.py \
  -k "one_token or routing_in_one_kernel or one_kernel_routing or fused_moe or mla_moe or (fp32 and (deepseek or kimi or moe))" \
  > "$R/gpu_tests_$COMMIT.log" 2>&1; tail -3 "$R/gpu_tests_$COMMIT.log"; pack
side() {  # $1 tree, $2 label, $3 time limit
  (cd "$1" && PYTHONPATH="/tmp/site:$PWD/src" timeout "$3" python3 benchmarks/ddtree_side_by_side.py --engine-only \
    --shape mla-moe-16b --modes ar,dflash,ddtree-64 --commit "$2" --out "$R/engine_mla-moe-16b_$2.json" \
    > "$R/engine_mla-moe-16b_$2.log" 2>&1)
  echo "$2"; grep -E "^(mode|ar|dflash|ddtree)" "$R/engine_mla-moe-16b_$2.log" || tail -3 "$R/engine_mla-moe-16b_$2.log"; pack
}
mkdir -p /tmp/before && cp -r src benchmarks /tmp/before/ && cp -r ab_before/. /tmp/before/
side /tmp/before "$BEFORE" 110
side . "$COMMIT" 110
sed -i 's#/root/out/r/##g' "$R"/*.json "$R"/*.log; pack
