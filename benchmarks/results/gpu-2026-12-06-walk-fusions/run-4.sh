#!/usr/bin/env bash
# Device call (about 1.5 minutes): the one-row fusions' GPU tests at the assertions call 3 led to (SwiGLU's fusion
# bitwise in bf16, to the last bits in float32) and greedy decoding of the dense and hybrid zoo families in float32.
# Run from the repository root with OUT set.
set -u
R="$OUT/r"
mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
cat "$R/machine.txt"
timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_fastpath.py tests/test_decode_gpu.py \
  -k "swiglu_down_row or norm_linear_row or (fp32 and qwen3 and not moe)" > "$R/gpu_tests.log" 2>&1
tail -4 "$R/gpu_tests.log"
sed -i "s#$PWD/##g" "$R"/*.log
