#!/usr/bin/env bash
# Device call: the Gated DeltaNet tree rule's launch shapes, the Qwen3.6-27B shape's step ratio once more, and with
# the fastest tiles if they beat the default by 5%, its dense projections by token rows, and the
# shape with the torch UT form of the tree rule. Run from the repository root with OUT and COMMIT set.
set -u
mkdir -p "$OUT"
timeout 100 python3 benchmarks/gdn_tree_rule_tiles.py --out "$OUT/gdn_tree_rule_tiles.json" 2>&1 | tee "$OUT/gdn_tree_rule_tiles.log"
OUT=$OUT/again timeout 130 python3 benchmarks/gpu_hybrid.py --stages qwen3.6-27b --commit "$COMMIT" > "$OUT/again.log" 2>&1
grep -A3 '"shape_ddtree64_step_vs_ar_step"\|"shape_ar_fraction_of_roofline"' "$OUT/again/hybrid_summary_$COMMIT.json" | head -10
best=$(python3 - "$OUT/gdn_tree_rule_tiles.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["shapes"]["qwen3.6-27b"]["64"]["tiles"]
ok = {k: r["us"] for k, r in rows.items() if k != "ut" and r["max_abs_diff"] < 1e-3}
best = min(ok, key=ok.get)
print(best if ok[best] < 0.95 * rows["32x4"]["us"] else "")
PY
)
echo "tiles chosen: ${best:-none}"
if [ -n "$best" ]; then
  timeout 110 python3 benchmarks/with_gdn_tree_rule.py "$best" benchmarks/ddtree_side_by_side.py --engine-only \
    --shape qwen3.6-27b --modes ar,ddtree-64,ddtree-16 --commit "$COMMIT" --out "$OUT/engine_qwen3.6-27b_tiles_$best.json" \
    > "$OUT/engine_qwen3.6-27b_tiles_$best.log" 2>&1; tail -12 "$OUT/engine_qwen3.6-27b_tiles_$best.log"
fi
timeout 50 python3 benchmarks/gemm_rows_sweep.py --shape qwen3.6-27b --out "$OUT/gemm_rows_qwen3.6-27b.json" 2>&1 | tee "$OUT/gemm_rows_qwen3.6-27b.log"
timeout 110 python3 benchmarks/with_gdn_tree_rule.py ut benchmarks/ddtree_side_by_side.py --engine-only \
  --shape qwen3.6-27b --modes ar,ddtree-64,ddtree-16 --commit "$COMMIT" --out "$OUT/engine_qwen3.6-27b_ut.json" \
  > "$OUT/engine_qwen3.6-27b_ut.log" 2>&1; tail -12 "$OUT/engine_qwen3.6-27b_ut.log"
cd "$OUT" && tar czf /tmp/results.tgz . && mv /tmp/results.tgz . && ls
