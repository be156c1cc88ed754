#!/usr/bin/env bash
# Device call: tau of tiny-hybrid and tiny-code on each code path against CPU float32, then the Qwen3.6-27B shape.
set -u
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/machine.txt" 2>&1
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> "$OUT/machine.txt"
git rev-parse --short HEAD >> "$OUT/machine.txt" 2>/dev/null
timeout 170 python3 benchmarks/tau_parity.py --pair tiny-hybrid --budgets 16 \
  --variants cpu-fp32,cuda-bf16,cuda-bf16-eager,cuda-fp32,cuda-bf16-eager-no-gdn-kernels,cuda-bf16-eager-torch \
  --timeout 60 --out "$OUT/tau_parity_tiny-hybrid.json" 2>&1 | tee "$OUT/tau_parity_tiny-hybrid.log"
for p in tiny-code tiny-mla; do timeout 60 python3 benchmarks/tau_parity.py --pair $p --budgets 16 --variants cpu-fp32,cuda-bf16 \
  --timeout 50 --out "$OUT/tau_parity_$p.json" 2>&1 | tee "$OUT/tau_parity_$p.log"; done
timeout 150 python3 benchmarks/gpu_hybrid.py --stages qwen3.6-27b --commit "${COMMIT:-head}" 2>&1 | tail -40 | tee "$OUT/qwen3.6-27b.log"
cd "$OUT" && tar czf results.tgz --exclude results.tgz . && ls -la
