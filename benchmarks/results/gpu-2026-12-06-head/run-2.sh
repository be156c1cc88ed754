#!/usr/bin/env bash
# Device call 2 (under 10 minutes, on the machine of call 1): issue 19's figures (`gpu_hybrid.py --stages
# zoo,qwen3.6-27b`: the zoo pairs and the Qwen3.6-27B shape), then issue 20's (`gpu_kimi_roofline.py --shapes
# mla-moe-16b,kimi`: the MoE, MLA and one-row kernels' GPU tests, then mla-moe-16b and the Kimi shape the card
# holds). Run from the repository root with the wheels of `.whl/` installed, specdeploy importable and OUT set;
# COMMIT names the commit measured.
set -u
: "${OUT:?set OUT}" "${COMMIT:?set COMMIT}"
R="$OUT/r"; mkdir -p "$R/hybrid" "$R/kimi"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/machine.txt"
python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])" >> "$OUT/machine.txt"
cat "$OUT/machine.txt"
OUT="$R/hybrid" timeout 130 python3 benchmarks/gpu_hybrid.py --commit "$COMMIT" --stages zoo,qwen3.6-27b > "$OUT/hybrid.log" 2>&1
tail -25 "$OUT/hybrid.log"
OUT="$R/kimi" timeout 430 python3 benchmarks/gpu_kimi_roofline.py --commit "$COMMIT" --shapes mla-moe-16b,kimi > "$OUT/kimi_roofline.log" 2>&1
tail -40 "$OUT/kimi_roofline.log"
sed -i "s#$PWD/##g" "$OUT"/*.log "$R"/*/*.log "$R"/*/*.json 2>/dev/null
cp "$R"/hybrid/hybrid_summary_*.json "$R"/kimi/kimi_roofline_summary_*.json "$OUT/" 2>/dev/null
tar czf "$OUT/results.tgz" -C "$R" . && rm -rf "$R"
