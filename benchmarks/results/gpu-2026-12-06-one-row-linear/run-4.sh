#!/usr/bin/env bash
# Device call (about 9 minutes): every target family's one-row projections through the matrix-vector kernel
# (`ops.linear`) against cuBLAS, in one tree (`benchmarks/with_moe_one_token.py cublas` switches the kernel off):
# the fp32 and bf16 decoding tests of every family on CUDA; the dense Qwen3-8B shape's AR step each way, twice,
# alternating; Qwen3.6-27B's AR and DDTree-64 each way; the zoo pairs (tiny-code, tiny-hybrid: AR, DFlash,
# DDTree-64) each way. Each run a process of its own. Run from the repository root with OUT and COMMIT set;
# $OUT/results.tgz is packed after each step.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
cat "$R/machine.txt"
timeout 100 python3 -m pytest -q -m gpu tests/test_decode_gpu.py > "$R/gpu_tests.log" 2>&1
tail -3 "$R/gpu_tests.log"; pack
with() {  # $1 setting (cublas, or - for the defaults), then the script and its arguments
  local setting=$1; shift
  if [ "$setting" = - ]; then python3 "$@"; else python3 benchmarks/with_moe_one_token.py "$setting" "$@"; fi
}
side() {  # $1 label, $2 setting, $3 shape, $4 modes, $5 time limit
  timeout "$5" bash -c "$(declare -f with); with $2 benchmarks/ddtree_side_by_side.py --engine-only --shape $3 \
    --modes $4 --commit $COMMIT --out $R/engine_$3_$1.json" > "$R/engine_$3_$1.log" 2>&1
  echo "$3 $1:"; grep -E "^engine " "$R/engine_$3_$1.log" || tail -1 "$R/engine_$3_$1.log"; pack
}
side cublas-1 cublas qwen3-8b ar 60
side gemv-1 - qwen3-8b ar 60
side cublas-2 cublas qwen3-8b ar 40
side gemv-2 - qwen3-8b ar 40
side cublas-1 cublas qwen3.6-27b ar,ddtree-64 70
side gemv-1 - qwen3.6-27b ar,ddtree-64 70
zoo() {  # $1 label, $2 setting
  timeout 50 bash -c "$(declare -f with); with $2 benchmarks/zoo_pair_speed.py --pair tiny-code,tiny-hybrid \
    --budgets 64 --out $R/zoo_$1.json" > "$R/zoo_$1.log" 2>&1
  echo "zoo $1:"; tail -8 "$R/zoo_$1.log"; pack
}
zoo cublas cublas
zoo gemv -
sed -i "s#/root/out/r/##g; s#$PWD/##g" "$R"/*.json "$R"/*.log; pack
