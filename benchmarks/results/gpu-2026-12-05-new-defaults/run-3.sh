#!/usr/bin/env bash
# Device call (about 80 seconds; the last of the session's device time): the Qwen3.6-27B shape's AR and DDTree-64
# steps with the one-warp walk (issue 19's step-ratio bar). Run from the repository root with OUT and COMMIT set.
set -u
R="$OUT/r"
mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
timeout 85 python3 benchmarks/ddtree_side_by_side.py --engine-only --shape qwen3.6-27b --modes ar,ddtree-64 \
  --commit "$COMMIT" --out "$R/engine_qwen3.6-27b_$COMMIT.json" > "$R/engine_qwen3.6-27b_$COMMIT.log" 2>&1
grep -E "^(engine|mode|ar|ddtree)" "$R/engine_qwen3.6-27b_$COMMIT.log"
sed -i 's#/root/out/r/##g' "$R"/*.json "$R"/*.log 2>/dev/null
