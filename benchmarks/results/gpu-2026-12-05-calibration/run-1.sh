#!/usr/bin/env bash
# One device call after each budget's own calibration (e9f4875, 8110e81): the GPU test of predicting steps, the
# engines alone (AR, DDTree 16 and 64, auto) at 1, 16 and 64 requests, two rounds, as the H100's call 3 of
# ../gpu-2026-12-05-auto-head ran them before the change; then this host's HTTP server over an engine that computes
# nothing (`server_capacity.py`: 0.65 ms steps of 5 tokens, tiny-code's step and tokens at 16 and 64 requests), its
# engine in a thread and in a process of its own. Run from the repository root with specdeploy importable, OUT set.
set -u
: "${OUT:?set OUT}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt"
python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])" >> "$OUT/machine.txt"
nproc >> "$OUT/machine.txt"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_batch_gpu.py -k predicting > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc $?" >> "$OUT/gpu_tests.log"
timeout 170 python3 benchmarks/auto_step_trace.py --device cuda --concurrency 1,16,64 --budgets 16,64 \
    --requests 128 --rounds 2 --out "$OUT/auto_step_trace.json" > "$OUT/auto_step_trace.log" 2>&1
echo "auto_step_trace rc $?" >> "$OUT/auto_step_trace.log"
for where in thread process; do
    flag=; [ "$where" = process ] && flag=--engine-process
    timeout 90 python3 benchmarks/server_capacity.py --concurrency 16,64 --step-ms 0.65 --tokens-per-step 5 \
        --duration 6 $flag --out "$OUT/server_capacity_$where.json" >> "$OUT/server_capacity.log" 2>&1
    echo "server_capacity $where rc $?" >> "$OUT/server_capacity.log"
done
