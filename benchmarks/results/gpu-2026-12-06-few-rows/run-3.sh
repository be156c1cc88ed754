#!/usr/bin/env bash
# Device call (about 9.5 minutes, on the machine warm from the campaign): mla-moe-16b's every mode (issue 20), the
# Qwen3-8B-shape campaign of issue 21 (AR against auto, 12 s cells), then Qwen3.6-27B's modes (issue 19). Run from
# the repository root with OUT and COMMIT set; $OUT/results.tgz is packed after each step.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
side() {  # $1 shape, $2 modes, $3 time limit
  timeout "$3" python3 benchmarks/ddtree_side_by_side.py --engine-only --shape "$1" --modes "$2" --commit "$COMMIT" \
    --out "$R/engine_$1_$COMMIT.json" > "$R/engine_$1_$COMMIT.log" 2>&1
  echo "$1:"; grep -E "^engine |^(ar|dflash|ddtree)" "$R/engine_$1_$COMMIT.log" || tail -2 "$R/engine_$1_$COMMIT.log"; pack
}
side mla-moe-16b ar,dflash,ddtree-16,ddtree-64,ddtree-256 190
OUT=$R PART=qwen3-8b LIMIT=290 bash benchmarks/results/gpu-2026-12-05-auto-head/run.sh
tail -12 "$R/campaign-qwen3-8b.log"; pack
side qwen3.6-27b ar,ddtree-16,ddtree-64,ddtree-256 100
sed -i "s#/root/out/r/##g; s#$PWD/##g" "$R"/*.json "$R"/*.log; pack
