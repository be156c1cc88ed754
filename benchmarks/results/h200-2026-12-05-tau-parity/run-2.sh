#!/usr/bin/env bash
# Device call (about 9 minutes): the Gated DeltaNet tree rule in the UT form on CUDA. Its GPU tests (kernel against
# the walk at Qwen3.6-27B's heads; fp32 greedy equality and batched rows with it on), the launch shapes of the walk
# and of the UT form (with the torch UT form beside them), the Qwen3.6-27B shape's step ratio walked and in the UT
# form at its fastest tiles, the shape's dense projections by token rows, and the walk at its fastest tiles if they
# beat the default by 5%. Run from the repository root with OUT and COMMIT set. Everything is packed into
# $OUT/results.tgz after each step, so a call cut short returns what it measured.
set -u
R="$OUT/r"
mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$R/machine.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> "$R/machine.txt"
timeout 100 python3 -m pytest -q -m gpu tests/test_gpu_fastpath.py tests/test_batch_gpu.py tests/test_decode_gpu.py \
  -k "ut_form or hybrid_rows_with_64 or (fp32 and qwen3_next)" > "$R/gpu_tests_ut.log" 2>&1; tail -3 "$R/gpu_tests_ut.log"; pack
timeout 120 python3 benchmarks/gdn_tree_rule_tiles.py --out "$R/gdn_tree_rule_tiles.json" > "$R/gdn_tree_rule_tiles.log" 2>&1
grep "qwen3.6-27b budget 64" "$R/gdn_tree_rule_tiles.log"; pack
fastest() {  # the fastest exact-enough row of budget 64 at Qwen3.6-27B's dims among names starting with $1
  python3 - "$R/gdn_tree_rule_tiles.json" "$1" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["shapes"]["qwen3.6-27b"]["64"]["tiles"]
ok = {k: r["us"] for k, r in rows.items() if k.startswith(sys.argv[2]) and r.get("max_abs_diff", 1) < 1e-3}
print(min(ok, key=ok.get) if ok else "")
PY
}
ut=$(fastest ut-); echo "UT tiles: ${ut:-none}"
OUT=$R/walk timeout 130 python3 benchmarks/gpu_hybrid.py --stages qwen3.6-27b --commit "$COMMIT" > "$R/walk.log" 2>&1
grep -A3 '"shape_ddtree64_step_vs_ar_step"' "$R/walk/hybrid_summary_$COMMIT.json" | head -4; pack
side() {  # $1: with_gdn_tree_rule's choice; the shape's AR and DDTree-16/64 steps with it
  timeout 110 python3 benchmarks/with_gdn_tree_rule.py "$1" benchmarks/ddtree_side_by_side.py --engine-only \
    --shape qwen3.6-27b --modes ar,ddtree-16,ddtree-64 --commit "$COMMIT" --out "$R/engine_qwen3.6-27b_$1.json" \
    > "$R/engine_qwen3.6-27b_$1.log" 2>&1; tail -8 "$R/engine_qwen3.6-27b_$1.log"; pack
}
[ -n "$ut" ] && side "$ut"
timeout 50 python3 benchmarks/gemm_rows_sweep.py --shape qwen3.6-27b --out "$R/gemm_rows_qwen3.6-27b.json" \
  > "$R/gemm_rows_qwen3.6-27b.log" 2>&1; pack
walk=$(python3 - "$R/gdn_tree_rule_tiles.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["shapes"]["qwen3.6-27b"]["64"]["tiles"]
ok = {k: r["us"] for k, r in rows.items() if k[0].isdigit() and r.get("max_abs_diff", 1) < 1e-3}
best = min(ok, key=ok.get)
print(best if ok[best] < 0.95 * rows["32x4"]["us"] else "")
PY
)
echo "walk tiles: ${walk:-default}"
[ -n "$walk" ] && side "$walk"
ls -la "$R"
