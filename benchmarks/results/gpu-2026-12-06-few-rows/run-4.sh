#!/usr/bin/env bash
# Device call (about 2 minutes, on the machine warm from call 3): greedy decoding of every family on CUDA in fp32 and
# bf16 (the few-row kernel in drafters and verifies), the zoo pairs at the head, and Qwen3.6-27B's AR and DDTree-64
# again. Run from the repository root with OUT set.
set -u
R=$OUT/r; mkdir -p "$R"
timeout 125 python3 -m pytest -q -m gpu tests/test_decode_gpu.py -k "fp32 or bf16" > "$R/gpu_tests_decode.log" 2>&1
tail -3 "$R/gpu_tests_decode.log"
timeout 55 python3 benchmarks/zoo_pair_speed.py --pair tiny-code,tiny-hybrid --budgets 16,64 \
  --out "$R/zoo_b5506dd.json" > "$R/zoo_b5506dd.log" 2>&1
tail -9 "$R/zoo_b5506dd.log"
timeout 85 python3 benchmarks/ddtree_side_by_side.py --engine-only --shape qwen3.6-27b --modes ar,ddtree-64 \
  --commit b5506dd --out "$R/engine_qwen3.6-27b_b5506dd-2.json" > "$R/engine_qwen3.6-27b_b5506dd-2.log" 2>&1
grep -E "^(ar|ddtree)" "$R/engine_qwen3.6-27b_b5506dd-2.log"
sed -i "s#/root/out/r/##g; s#$PWD/##g" "$R"/*
