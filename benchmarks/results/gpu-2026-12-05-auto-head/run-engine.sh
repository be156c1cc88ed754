#!/usr/bin/env bash
# One device call after run.sh's campaigns: the same engines without the HTTP server (issue 21: is auto within
# 5% of the best fixed budget where the engine, not the server, sets the pace?), then the dense Qwen3-8B shape's
# steps with programmatic dependent launch on (issues 19 and 20: no regression against the committed results).
# Run from the repository root with specdeploy importable and OUT set.
set -u
: "${OUT:?set OUT}"
timeout 360 python3 benchmarks/auto_step_trace.py --device cuda --concurrency 1,16,64 --budgets 16,64 \
    --requests 128 --rounds 2 --out "$OUT/auto_step_trace.json" > "$OUT/auto_step_trace.log" 2>&1
echo "auto_step_trace rc $?" >> "$OUT/auto_step_trace.log"
timeout 180 python3 benchmarks/ddtree_side_by_side.py --engine-only --shape qwen3-8b --modes ar,dflash,ddtree-16,ddtree-64 \
    --commit "${COMMIT:-unknown}" --out "$OUT/engine_qwen3-8b.json" > "$OUT/engine_qwen3-8b.log" 2>&1
echo "side_by_side rc $?" >> "$OUT/engine_qwen3-8b.log"
