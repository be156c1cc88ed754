#!/usr/bin/env bash
# One CUDA GPU, a few minutes: where `--budget auto` loses against fixed budgets on tiny-code, without a server.
# 1. real steps against dead steps of their own shape, stage by stage, at 13 rows and at one (budgets 16, 32, 64);
# 2. the engines alone (AR, DDTree 16 and 64, auto) at 1 and 16 requests, two rounds, with the policy's own
#    host time per step (choose, observe).
# Run from the repository root with specdeploy importable (installed, or PYTHONPATH=src) and OUT set:
#   OUT=out bash benchmarks/gpu_auto_diagnosis.sh
set -u
: "${OUT:?set OUT to a folder for the results}"
mkdir -p "$OUT"
for rows in 13 1; do
    timeout 150 python3 benchmarks/dead_vs_real_step.py --device cuda --rows "$rows" --budgets 16,32,64 --steps 12 \
        --out "$OUT/dead_vs_real_rows$rows.json" > "$OUT/dead_vs_real_rows$rows.log" 2>&1
    cat "$OUT/dead_vs_real_rows$rows.log"
done
timeout 280 python3 benchmarks/auto_step_trace.py --device cuda --concurrency 1,16 --budgets 16,64 --requests 32 \
    --rounds 2 --out "$OUT/auto_step_trace.json" > "$OUT/auto_step_trace.log" 2>&1
grep -v "^    budget" "$OUT/auto_step_trace.log"
