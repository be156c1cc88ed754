#!/usr/bin/env bash
# Device call (about 7.5 minutes): the Kimi shape the card holds in every mode (the stage of gpu_kimi_roofline.py
# that failed in call 2 on negative drafter context layers), then the GPU tests of the changed kernels and of greedy
# decoding in every family, with a longer limit than calls 1 and 2 gave them. Run from the repository root with OUT
# and COMMIT set; $OUT/results.tgz is packed after each step.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
cat "$R/machine.txt"
shape=$(python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from gpu_kimi_roofline import kimi_shape; print(kimi_shape())")
timeout 160 python3 benchmarks/ddtree_side_by_side.py --engine-only --shape "$shape" \
  --modes ar,dflash,ddtree-16,ddtree-64,ddtree-256 --commit "$COMMIT" --out "$R/engine_${shape}_$COMMIT.json" \
  > "$R/engine_${shape}_$COMMIT.log" 2>&1
grep -E "^engine |^(ar|dflash|ddtree)|^mode" "$R/engine_${shape}_$COMMIT.log" || tail -3 "$R/engine_${shape}_$COMMIT.log"; pack
timeout 270 python3 -m pytest -q -m gpu --durations=15 tests/test_decode_gpu.py tests/test_batch_gpu.py \
  tests/test_gpu_fastpath.py -k "fp32 or hybrid_rows or norm_linear_row or swiglu_down_row or moe" \
  > "$R/gpu_tests.log" 2>&1
tail -22 "$R/gpu_tests.log"; pack
sed -i "s#/root/out/r/##g; s#$PWD/##g" "$R"/*.json "$R"/*.log; pack
