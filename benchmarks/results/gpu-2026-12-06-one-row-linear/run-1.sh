#!/usr/bin/env bash
# Device call (about 8 minutes): one row's dense projections as the Triton matrix-vector kernel (`ops.linear`,
# `triton_gemv.linear_one_row`, in the chain of programmatic dependent launches) against cuBLAS (F.linear), in
# one tree: `benchmarks/with_moe_one_token.py cublas` switches the kernel off. The GPU tests of the kernel and of
# the MLA + MoE family; mla-moe-16b's AR step (the projections' one-row case) three times each way, alternating,
# each in a process of its own, with DFlash and DDTree-64 (many rows: unchanged) once each way; kimi-like's AR
# each way; the kernel profile of mla-moe-16b's AR step with the kernel. Run from the repository root with OUT and
# COMMIT set; $OUT/results.tgz is packed after each step.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
cat "$R/machine.txt"
timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_fastpath.py tests/test_decode_gpu.py \
  -k "one_row_linear or mla_moe or query_entry or (fp32 and (kimi or deepseek))" > "$R/gpu_tests.log" 2>&1
tail -3 "$R/gpu_tests.log"; pack
side() {  # $1 label, $2 setting (cublas, or - for the defaults), $3 shape, $4 modes, $5 time limit
  local run=(python3 benchmarks/ddtree_side_by_side.py)
  [ "$2" != - ] && run=(python3 benchmarks/with_moe_one_token.py "$2" benchmarks/ddtree_side_by_side.py)
  timeout "$5" "${run[@]}" --engine-only --shape "$3" --modes "$4" --commit "$COMMIT" \
    --out "$R/engine_$3_$1.json" > "$R/engine_$3_$1.log" 2>&1
  echo "$3 $1"; grep -E "^(ar|dflash|ddtree)" "$R/engine_$3_$1.log" || tail -2 "$R/engine_$3_$1.log"; pack
}
side cublas-1 cublas mla-moe-16b ar,dflash,ddtree-64 100
side gemv-1 - mla-moe-16b ar,dflash,ddtree-64 100
side cublas-2 cublas mla-moe-16b ar 45
side gemv-2 - mla-moe-16b ar 45
side cublas-3 cublas mla-moe-16b ar 45
side gemv-3 - mla-moe-16b ar 45
side cublas-1 cublas kimi-like ar 70
side gemv-1 - kimi-like ar 70
timeout 60 python3 benchmarks/kernel_profile.py --shape mla-moe-16b --modes ar --steps 16 \
  --out "$R/profile_mla-moe-16b_ar.json" > "$R/profile_mla-moe-16b_ar.txt" 2>&1
head -30 "$R/profile_mla-moe-16b_ar.txt"
sed -i 's#/root/out/r/##g' "$R"/*.json "$R"/*.log "$R"/*.txt; pack
