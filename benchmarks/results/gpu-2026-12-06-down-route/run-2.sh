#!/usr/bin/env bash
# Device call 2 (under 10 minutes, on the machine of call 1): issue 19's Qwen3.6-27B shape (`gpu_hybrid.py
# --stages qwen3.6-27b`: AR, DDTree-64, -16, -256), then issue 21's tiny-code campaign
# (`../gpu-2026-12-05-auto-head/run.sh`, PART=tiny-code: HumanEval, AR and DDTree 16 / 64 / auto at c = 1, 16,
# 64, 5 s cells, two rounds; resumable: `SKIP_HYBRID=1 LIMIT=... bash run-2.sh` finishes it). Run from the repository
# root with the wheels of `.whl/` installed, specdeploy importable, and OUT and COMMIT set.
set -u
: "${OUT:?set OUT}" "${COMMIT:?set COMMIT}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/machine.txt"
if [ -z "${SKIP_HYBRID:-}" ]; then
  mkdir -p "$OUT/hybrid"
  OUT="$OUT/hybrid" timeout 160 python3 benchmarks/gpu_hybrid.py --commit "$COMMIT" --stages qwen3.6-27b \
    > "$OUT/hybrid.log" 2>&1
  tail -12 "$OUT/hybrid.log"
  sed -i "s#$PWD/##g" "$OUT"/hybrid/* "$OUT/hybrid.log" 2>/dev/null
fi
OUT="$OUT" PART=tiny-code LIMIT="${LIMIT:-400}" bash benchmarks/results/gpu-2026-12-05-auto-head/run.sh
cat "$OUT/log-tiny-code.txt"; tail -5 "$OUT/campaign-tiny-code.log"
sed -i "s#$PWD/##g" "$OUT"/*.log 2>/dev/null
