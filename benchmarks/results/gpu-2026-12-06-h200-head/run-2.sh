#!/usr/bin/env bash
# Device call 2 (under 10 minutes, one H200): issue 19's stages (`gpu_hybrid.py --stages
# qwen3.6-27b,zoo,qwen3-8b`: the Qwen3.6-27B shape's AR, DDTree-64, -16, -256; tiny-hybrid against tiny-code; the
# dense Qwen3-8B shape against the committed H200 results), then issue 21's tiny-code campaign
# (`../gpu-2026-12-05-auto-head/run.sh`, PART=tiny-code; resumable: `SKIP_HYBRID=1 LIMIT=... bash run-2.sh` on the
# same machine finishes it). Run from the repository root with the wheels of `.whl/` installed, specdeploy
# importable, and OUT and COMMIT set.
set -u
: "${OUT:?set OUT}" "${COMMIT:?set COMMIT}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/machine.txt"
if [ -z "${SKIP_HYBRID:-}" ]; then
  mkdir -p "$OUT/hybrid"
  OUT="$OUT/hybrid" timeout 290 python3 benchmarks/gpu_hybrid.py --commit "$COMMIT" --stages qwen3.6-27b,zoo,qwen3-8b \
    > "$OUT/hybrid.log" 2>&1
  tail -30 "$OUT/hybrid.log"
  sed -i "s#$PWD/##g" "$OUT"/hybrid/* "$OUT/hybrid.log" 2>/dev/null
fi
OUT="$OUT" PART=tiny-code LIMIT="${LIMIT:-280}" bash benchmarks/results/gpu-2026-12-05-auto-head/run.sh
cat "$OUT/log-tiny-code.txt"; tail -5 "$OUT/campaign-tiny-code.log"
sed -i "s#$PWD/##g" "$OUT"/*.log 2>/dev/null
