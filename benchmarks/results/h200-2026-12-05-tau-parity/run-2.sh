#!/usr/bin/env bash
# Device call: the Gated DeltaNet tree rule's launch shapes; where the Qwen3.6-27B shape's DDTree-64 step goes (kernels, eager; its dense projections by rows),
# tiny-mla's tau on CUDA bf16
# against CPU float32, and the shape's step ratio measured once more. Run from the repository root with OUT set.
set -u
mkdir -p "$OUT"
timeout 120 python3 benchmarks/gdn_tree_rule_tiles.py --out "$OUT/gdn_tree_rule_tiles.json" 2>&1 | tee "$OUT/gdn_tree_rule_tiles.log"
timeout 200 python3 benchmarks/kernel_profile.py --shape qwen3.6-27b --modes ar,ddtree-64 --steps 6 \
  --out "$OUT/profile_qwen3.6-27b.json" > "$OUT/profile_qwen3.6-27b.txt" 2>&1
grep -A16 "launches per step" "$OUT/profile_qwen3.6-27b.txt"
timeout 60 python3 benchmarks/gemm_rows_sweep.py --shape qwen3.6-27b --out "$OUT/gemm_rows_qwen3.6-27b.json" 2>&1 | tee "$OUT/gemm_rows_qwen3.6-27b.log"
timeout 80 python3 benchmarks/tau_parity.py --pair tiny-mla --budgets 16 --variants cpu-fp32,cuda-bf16 \
  --timeout 70 --out "$OUT/tau_parity_tiny-mla.json" 2>&1 | tee "$OUT/tau_parity_tiny-mla.log"
OUT=$OUT/again timeout 140 python3 benchmarks/gpu_hybrid.py --stages qwen3.6-27b --commit "${COMMIT:-head}" > "$OUT/again.log" 2>&1
grep -A3 '"shape_ddtree64_step_vs_ar_step"\|"shape_ar_fraction_of_roofline"' "$OUT/again/hybrid_summary_${COMMIT:-head}.json" | head -12
cd "$OUT" && tar czf /tmp/results.tgz . && mv /tmp/results.tgz . && ls
