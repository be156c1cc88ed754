#!/usr/bin/env bash
# Device call 1 (under 10 minutes, one H200): issue 20 at the head. The GPU tests of the norm made in the router's
# kernel and of the one-row norm and projection (one helper since 2284ef7); `gpu_kimi_roofline.py --skip-tests
# --shapes mla-moe-16b,kimi` (every mode of mla-moe-16b and of the Kimi shape the card holds); the one-token MoE
# tile sweep on mla-moe-16b, then its AR step with the sweep's fastest settings (`with_moe_one_token.py`) against
# the defaults, one process each; then where the AR step spends device time. Run from the repository root with
# specdeploy importable and OUT and COMMIT set; $OUT/results.tgz is packed after each step.
set -u
: "${OUT:?set OUT}" "${COMMIT:?set COMMIT}"
R="$OUT/r"; mkdir -p "$R"
pack() { sed -i "s#$PWD/##g" "$R"/*.log "$R"/*.txt "$R"/*.json "$R"/kimi/* 2>/dev/null; tar czf "$OUT/results.tgz" -C "$R" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$R/machine.txt"
python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])" >> "$R/machine.txt"
cat "$R/machine.txt"
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_fastpath.py \
  -k "norm_made or norm_linear or routing" > "$R/gpu_tests_$COMMIT.log" 2>&1; tail -2 "$R/gpu_tests_$COMMIT.log"; pack
OUT="$R/kimi" timeout 270 python3 benchmarks/gpu_kimi_roofline.py --commit "$COMMIT" --skip-tests \
  --shapes mla-moe-16b,kimi > "$R/kimi_roofline.log" 2>&1
tail -24 "$R/kimi_roofline.log"; pack
timeout 100 python3 benchmarks/moe_tile_sweep.py --one-token --shapes mla-moe-16b --out "$R/moe_one_token_sweep.json" \
  > "$R/moe_one_token_sweep.log" 2>&1
grep "one token:" "$R/moe_one_token_sweep.log"; pack
best=$(grep -o "settings [^ ]*" "$R/moe_one_token_sweep.log" | tail -1 | cut -d' ' -f2)
if [ -n "$best" ]; then
  for i in 1 2; do
    timeout 45 python3 benchmarks/ddtree_side_by_side.py --engine-only --shape mla-moe-16b --modes ar \
      --commit "default-$i" --out "$R/engine_ar_default_$i.json" > "$R/engine_ar_default_$i.log" 2>&1
    grep -E "^ar" "$R/engine_ar_default_$i.log"
    timeout 45 python3 benchmarks/with_moe_one_token.py "$best" benchmarks/ddtree_side_by_side.py --engine-only \
      --shape mla-moe-16b --modes ar --commit "swept-$i" --out "$R/engine_ar_swept_$i.json" \
      > "$R/engine_ar_swept_$i.log" 2>&1
    echo "$best"; grep -E "^ar" "$R/engine_ar_swept_$i.log"; pack
  done
fi
timeout 50 python3 benchmarks/kernel_profile.py --shape mla-moe-16b --modes ar --steps 16 \
  --out "$R/profile_mla-moe-16b_$COMMIT.json" > "$R/profile_mla-moe-16b_$COMMIT.txt" 2>&1
grep -A14 -E "ms of kernels" "$R/profile_mla-moe-16b_$COMMIT.txt"; pack
