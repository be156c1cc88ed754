#!/usr/bin/env bash
# One device call after each budget's own calibration (`tree.realised_accept_lengths`, the largest budget explored
# for acceptance): the engines alone (AR, DDTree 16 and 64, auto) at 1, 16 and 64 requests, two rounds, as
# run-engine.sh did before the change. Run from the repository root with specdeploy importable and OUT set.
set -u
: "${OUT:?set OUT}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt"
timeout 140 python3 benchmarks/auto_step_trace.py --device cuda --concurrency 1,16,64 --budgets 16,64 \
    --requests 128 --rounds 2 --out "$OUT/auto_step_trace.json" > "$OUT/auto_step_trace.log" 2>&1
echo "auto_step_trace rc $?" >> "$OUT/auto_step_trace.log"
