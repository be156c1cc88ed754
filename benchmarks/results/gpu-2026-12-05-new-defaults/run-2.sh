#!/usr/bin/env bash
# Device call (about 3 minutes; what little device time was left): run-1.sh's first two steps only, the
# Qwen3.6-27B shape's AR, DDTree-16 and DDTree-64 steps with the one-warp walk, then mla-moe-16b's AR and DFlash
# steps. Run from the repository root with OUT and COMMIT set; $OUT/results.tgz is packed after each step.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { sed -i 's#/root/out/r/##g' "$R"/*.json "$R"/*.log 2>/dev/null; tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
side() {  # $1 shape, $2 modes, $3 time limit
  timeout "$3" python3 benchmarks/ddtree_side_by_side.py --engine-only --shape "$1" --modes "$2" --commit "$COMMIT" \
    --out "$R/engine_$1_$COMMIT.json" > "$R/engine_$1_$COMMIT.log" 2>&1
  grep -E "^(mode|ar|dflash|ddtree)" "$R/engine_$1_$COMMIT.log"; pack
}
side qwen3.6-27b ar,ddtree-16,ddtree-64 120
side mla-moe-16b ar,dflash 55
