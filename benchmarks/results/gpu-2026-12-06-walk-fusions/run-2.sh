#!/usr/bin/env bash
# Device call (about 9.5 minutes): Qwen3.6-27B's AR and DDTree-64 steps with the one-row fusions limited to small
# weights (issue 19); issue 20's one-call script measuring only (`gpu_kimi_roofline.py --skip-tests`: mla-moe-16b's
# every mode, the Kimi shape the card holds, Qwen3-8B's modes against the committed H200 results); then the GPU tests
# of the changed kernels and of greedy decoding in every family, with what time is left. Run from the repository
# root with OUT and COMMIT set; $OUT/results.tgz is packed after each step.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
cat "$R/machine.txt"
timeout 80 python3 benchmarks/ddtree_side_by_side.py --engine-only --shape qwen3.6-27b --modes ar,ddtree-64 \
  --commit "$COMMIT" --out "$R/engine_qwen3.6-27b_$COMMIT.json" > "$R/engine_qwen3.6-27b_$COMMIT.log" 2>&1
grep -E "^engine |^(ar|ddtree)" "$R/engine_qwen3.6-27b_$COMMIT.log" || tail -2 "$R/engine_qwen3.6-27b_$COMMIT.log"; pack
OUT=$R python3 benchmarks/gpu_kimi_roofline.py --skip-tests --commit "$COMMIT" > "$R/kimi_roofline.log" 2>&1
grep -E "^[a-z0-9.-]+: rc|^engine |^(ar|dflash|ddtree)" "$R/kimi_roofline.log"; pack
timeout 130 python3 -m pytest -q -m gpu tests/test_decode_gpu.py tests/test_batch_gpu.py tests/test_gpu_fastpath.py \
  -k "fp32 or hybrid_rows or norm_linear_row or swiglu_down_row or moe" > "$R/gpu_tests.log" 2>&1
tail -3 "$R/gpu_tests.log"; pack
sed -i "s#/root/out/r/##g; s#$PWD/##g" "$R"/*.json "$R"/*.log; pack
