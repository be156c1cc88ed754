#!/usr/bin/env bash
# Device call 1 (under 10 minutes): issue 20 at the head. The policy's host cost on this machine's CPU
# (`policy_host_cost.py`, for issue 21); the GPU tests of the one-token MoE, the routing and the norm made in the
# router's kernel; mla-moe-16b's AR and DFlash steps in the tree before this work (ab_before/: $BEFORE's src);
# `gpu_kimi_roofline.py --skip-tests --shapes mla-moe-16b,kimi` at the head; then where the head's AR step spends
# device time. Run from the repository root with the wheels of `.whl/` installed, specdeploy importable, and
# OUT, COMMIT and BEFORE set; $OUT/results.tgz is packed after each step.
set -u
: "${OUT:?set OUT}" "${COMMIT:?set COMMIT}" "${BEFORE:?set BEFORE}"
R="$OUT/r"; mkdir -p "$R"
pack() { tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/machine.txt"
python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])" >> "$OUT/machine.txt"
cat "$OUT/machine.txt"
for rows in 1 16; do
  timeout 40 python3 benchmarks/policy_host_cost.py --rows "$rows" --calls 5000 > "$R/policy_host_cost_rows$rows.log" 2>&1
  tail -8 "$R/policy_host_cost_rows$rows.log"
done
timeout 110 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_fastpath.py \
  -k "norm_made or one_token or routing" > "$R/gpu_tests_$COMMIT.log" 2>&1; tail -3 "$R/gpu_tests_$COMMIT.log"; pack
(cd ab_before && PYTHONPATH="/tmp/site:$PWD/src" timeout 70 python3 ../benchmarks/ddtree_side_by_side.py --engine-only \
  --shape mla-moe-16b --modes ar,dflash --commit "$BEFORE" --out "$R/engine_mla-moe-16b_$BEFORE.json" \
  > "$R/engine_mla-moe-16b_$BEFORE.log" 2>&1)
grep -E "^(mode|ar|dflash)" "$R/engine_mla-moe-16b_$BEFORE.log"; pack
OUT="$R/kimi" timeout 275 python3 benchmarks/gpu_kimi_roofline.py --commit "$COMMIT" --skip-tests \
  --shapes mla-moe-16b,kimi > "$R/kimi_roofline.log" 2>&1
tail -30 "$R/kimi_roofline.log"; pack
timeout 60 python3 benchmarks/kernel_profile.py --shape mla-moe-16b --modes ar --steps 16 \
  --out "$R/profile_mla-moe-16b_$COMMIT.json" > "$R/profile_mla-moe-16b_$COMMIT.txt" 2>&1
grep -A14 -E "ms of kernels" "$R/profile_mla-moe-16b_$COMMIT.txt"
sed -i "s#$PWD/##g" "$R"/*.log "$R"/*.txt "$R"/*.json "$R"/kimi/* 2>/dev/null; pack
